"""Who is at the other end of a TLS connection: the grid's certificate checks, done in Python so
that every refusal is an HTTP answer with a reason (a TLS alert tells a user nothing).

`verify_chain` walks from the client's certificate up to a trusted CA of a grid CA directory
(`<hash>.N` CA files, `<hash>.rN` CRLs):

* proxies first (RFC 3820, with the proxyCertInfo extension, or legacy Globus ones whose last
  CN is `proxy` / `limited proxy`): each must be signed by the certificate it names as issuer,
  which the client sent, its subject must be that issuer's plus one CN, and the issuer must not
  be a CA; proxies of proxies go on up the same way. Each proxy's policy must be one ASO
  accepts (aso.grid.proxycert: inherit-all or limited, never independent or unknown), a proxy of a
  limited proxy must be limited, and no proxy may have more proxies after it than its path
  length allows;
* then the end-entity certificate (the identity: its DN) and any intermediate CAs up to a
  self-signed CA of the directory: signatures, CA flags, and the issuer's CRL (signed by it, not
  out of date; required unless `require_crl` is off): a revoked serial is refused;
* every certificate must be inside its validity period.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPublicKeyTypes
from cryptography.x509.oid import NameOID

from aso.grid import proxycert
from aso.grid.certs import slash_dn
from aso.grid.proxycert import PROXY_CERT_INFO

LEGACY_PROXY_CNS = {"proxy": proxycert.INHERIT_ALL, "limited proxy": proxycert.LIMITED}
MAX_DEPTH = 12
# Certificates a client may send in all: MAX_DEPTH proxies, the end entity and three
# intermediate CAs. Each costs a signature check in the handshake: 100 certificates of P-521
# from a CA of the client's own had cost the front end 107 ms a handshake.
MAX_CHAIN = MAX_DEPTH + 4


class Refused(Exception):
    """A client the front end turns away: HTTP status and reason."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def unauthorized(reason: str) -> Refused:
    return Refused(401, reason)


def is_proxy(cert: x509.Certificate) -> bool:
    try:
        cert.extensions.get_extension_for_oid(PROXY_CERT_INFO)
        return True
    except x509.ExtensionNotFound:
        pass
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    last_rdn = cert.subject.rdns[-1] if cert.subject.rdns else None
    return bool(
        cns
        and last_rdn is not None
        and str(cns[-1].value) in LEGACY_PROXY_CNS
        and cns[-1] in last_rdn
        and x509.Name(cert.subject.rdns[:-1]) == cert.issuer
    )


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


class TrustStore:
    """The CAs and CRLs of a grid CA directory, read again when the directory changes (a
    fetch-crl run), at most every `recheck` seconds."""

    def __init__(self, capath: Path, recheck: float = 30.0):
        self.capath = Path(capath)
        self.recheck = recheck
        self._lock = threading.Lock()
        self._checked = 0.0
        self._stamp: tuple[tuple[str, int], ...] = ()
        self.cas: dict[x509.Name, list[x509.Certificate]] = {}
        self.crls: dict[x509.Name, list[x509.CertificateRevocationList]] = {}

    def _listing(self) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in self.capath.iterdir()))

    def refresh(self) -> None:
        with self._lock:
            if time.monotonic() - self._checked < self.recheck and self._stamp:
                return
            self._checked = time.monotonic()
            stamp = self._listing()
            if stamp == self._stamp:
                return
            cas: dict[x509.Name, list[x509.Certificate]] = {}
            crls: dict[x509.Name, list[x509.CertificateRevocationList]] = {}
            for path in sorted(self.capath.iterdir()):
                stem, _, suffix = path.name.partition(".")
                if len(stem) != 8 or not suffix:
                    continue
                data = path.read_bytes()
                if suffix.isdigit():
                    for cert in x509.load_pem_x509_certificates(data):
                        cas.setdefault(cert.subject, []).append(cert)
                elif suffix[0] == "r" and suffix[1:].isdigit():
                    crl = x509.load_pem_x509_crl(data)
                    crls.setdefault(crl.issuer, []).append(crl)
            self.cas, self.crls, self._stamp = cas, crls, stamp


@dataclass(frozen=True)
class Identity:
    dn: str  # the end-entity certificate's subject, /DC=.../CN=...
    proxies: int  # how many proxy certificates stood in front of it
    limited: bool = False  # the proxy is a limited one (aso.grid.proxycert)


def _proxy_policy(cert: x509.Certificate) -> tuple[str, int | None]:
    """A proxy's policy language and path length (None: no limit), or Refused."""
    try:
        info = proxycert.proxy_info(cert)
    except proxycert.BadProxyCertInfo as error:
        raise unauthorized(f"proxy {slash_dn(cert.subject)}: {error}") from None
    if info is None:  # a legacy Globus proxy: its last CN says which kind
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[-1].value
        return LEGACY_PROXY_CNS[str(cn)], None
    if not info.critical:
        raise unauthorized(f"proxy {slash_dn(cert.subject)}: proxyCertInfo must be critical")
    if info.policy not in proxycert.ACCEPTED_POLICIES:
        raise unauthorized(
            f"proxy {slash_dn(cert.subject)}: {info.policy_name} proxies are not accepted "
            "(ordinary or limited proxies only)"
        )
    return info.policy, info.path_length


def _check_proxy_chain(proxies: list[x509.Certificate]) -> bool:
    """RFC 3820's rules over the proxies of a chain (the client's first): policies, path
    lengths, limited proxies only below a limited one. True if the client's proxy is limited."""
    policies: list[str] = []
    for below, cert in enumerate(proxies):
        policy, path_length = _proxy_policy(cert)
        if path_length is not None and below > path_length:
            raise unauthorized(
                f"proxy {slash_dn(cert.subject)} allows {path_length} proxies after it, "
                f"the chain has {below}"
            )
        if policy == proxycert.LIMITED and any(p != proxycert.LIMITED for p in policies):
            raise unauthorized(f"a proxy of the limited proxy {slash_dn(cert.subject)} must be "
                               "limited too")  # fmt: skip
        policies.append(policy)
    return bool(policies) and policies[0] == proxycert.LIMITED


def _check_time(cert: x509.Certificate, now: dt.datetime, what: str) -> None:
    if now < cert.not_valid_before_utc:
        raise unauthorized(f"{what} {slash_dn(cert.subject)} is not valid before "
                           f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M:%S} UTC")  # fmt: skip
    if now > cert.not_valid_after_utc:
        raise unauthorized(f"{what} {slash_dn(cert.subject)} expired on "
                           f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC")  # fmt: skip


def _check_revocation(
    cert: x509.Certificate,
    issuer: x509.Certificate,
    trust: TrustStore,
    now: dt.datetime,
    require_crl: bool,
) -> None:
    crls = [
        c
        for c in trust.crls.get(issuer.subject, [])
        # The issuer signed `cert` (_signed_by): its key is one that signs.
        if c.is_signature_valid(cast(CertificateIssuerPublicKeyTypes, issuer.public_key()))
    ]
    if not crls:
        if require_crl:
            raise unauthorized(f"no valid CRL of CA {slash_dn(issuer.subject)} in the CA directory")
        return
    current = [c for c in crls if c.next_update_utc is None or c.next_update_utc >= now]
    if not current:
        raise unauthorized(f"the CRL of CA {slash_dn(issuer.subject)} is out of date")
    for crl in current:
        if crl.get_revoked_certificate_by_serial_number(cert.serial_number) is not None:
            raise unauthorized(f"certificate {slash_dn(cert.subject)} is revoked")


# The RSA keys a client's chain may hold: a public exponent of 65537 or less and a modulus of
# 8192 bits or less. A forged proxy chain with 3,070-bit exponents had cost the front end
# ~200 ms of CPU per handshake (each signature check is an exponentiation by e).
MAX_RSA_EXPONENT = 65537
MAX_RSA_BITS = 8192
EC_CURVES = ("secp256r1", "secp384r1", "secp521r1")


def key_fault(key: object) -> str | None:
    """Why a certificate's public key is refused (a public key of `cryptography`), or None:
    RSA within its bounds, or EC on a NIST curve; no other kind (a DSA key of 4096 bits took
    11 ms a signature, and OpenSSL takes them up to 10,000 bits)."""
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size > MAX_RSA_BITS:
            return f"an RSA key of {key.key_size} bits (at most {MAX_RSA_BITS})"
        if key.public_numbers().e > MAX_RSA_EXPONENT:
            return f"an RSA public exponent above {MAX_RSA_EXPONENT}"
        return None
    if isinstance(key, ec.EllipticCurvePublicKey):
        if key.curve.name not in EC_CURVES:
            return f"an EC key on {key.curve.name} (only {', '.join(EC_CURVES)})"
        return None
    kind = type(key).__name__.removeprefix("_").removesuffix("PublicKey")
    return f"a key of type {kind} (only RSA and EC keys)"


def verify_chain(
    chain: list[x509.Certificate],
    trust: TrustStore,
    *,
    require_crl: bool = True,
    now: dt.datetime | None = None,
) -> Identity:
    """The identity a client's certificate chain (its certificate first, then what it sent
    with it) stands for, or Refused(401) with the reason."""
    if not chain:
        raise unauthorized("a client certificate (or proxy) is required")
    if len(chain) > MAX_CHAIN:
        raise unauthorized(f"{len(chain)} certificates sent (at most {MAX_CHAIN})")
    now = now or dt.datetime.now(dt.UTC)
    for sent_cert in chain:  # before any signature is checked with these keys
        fault = key_fault(sent_cert.public_key())
        if fault:
            raise unauthorized(f"{slash_dn(sent_cert.subject)}: {fault}")
    trust.refresh()
    sent = chain[1:]
    cert, proxies = chain[0], 0
    walked: list[x509.Certificate] = []
    # Proxies: each signed by the certificate it was made from, which the client sent.
    while is_proxy(cert):
        _check_time(cert, now, "proxy")
        issuer = next((c for c in sent if c.subject == cert.issuer), None)
        if issuer is None:
            raise unauthorized(f"the issuer of proxy {slash_dn(cert.subject)} was not sent")
        if not _signed_by(cert, issuer):
            raise unauthorized(f"proxy {slash_dn(cert.subject)} is not signed by its issuer's key")
        if (
            x509.Name(cert.subject.rdns[:-1]) != issuer.subject
            or len(cert.subject.rdns[-1]) != 1
            or cert.subject.rdns[-1].get_attributes_for_oid(NameOID.COMMON_NAME) == []
        ):
            raise unauthorized(f"proxy {slash_dn(cert.subject)}: subject is not its issuer's + CN")
        if _is_ca(issuer):
            raise unauthorized("a CA certificate cannot issue proxies")
        proxies += 1
        if proxies > MAX_DEPTH:
            raise unauthorized("too many proxies in the chain")
        walked.append(cert)
        cert = issuer
    limited = _check_proxy_chain(walked)
    end_entity = cert
    if _is_ca(end_entity):
        raise unauthorized(f"{slash_dn(end_entity.subject)} is a CA, not a user or service")
    # The end-entity certificate and any intermediate CAs, up to a trusted self-signed CA.
    for _ in range(MAX_DEPTH):
        _check_time(cert, now, "certificate" if cert is end_entity else "CA")
        candidates = trust.cas.get(cert.issuer, []) + [c for c in sent if c.subject == cert.issuer]
        issuer = next((c for c in candidates if _is_ca(c) and _signed_by(cert, c)), None)
        if issuer is None:
            if candidates:
                raise unauthorized(
                    f"{slash_dn(cert.subject)} is not signed by the CA {slash_dn(cert.issuer)}"
                )
            raise unauthorized(f"{slash_dn(cert.issuer)} is not a trusted CA")
        _check_revocation(cert, issuer, trust, now, require_crl)
        if issuer.subject == issuer.issuer:
            if issuer not in trust.cas.get(issuer.subject, []):
                raise unauthorized(f"{slash_dn(issuer.subject)} is not a trusted CA")
            _check_time(issuer, now, "CA")
            return Identity(slash_dn(end_entity.subject), proxies, limited)
        cert = issuer
    raise unauthorized("the certificate chain is too long")
