"""Throw-away grid PKI for demos and tests (`aso certs demo`): a CA, host and user
certificates, RFC 3820 proxies, a CRL, and a CA directory in the grid layout (`<subject
hash>.0` for a CA, `<subject hash>.r0` for its CRL: what `capath`/X509_CERT_DIR point at),
and PKCS#12 files of users' certificates for a browser.

Everything is made with `cryptography`; the CA directory's file names are OpenSSL's subject
hashes, computed here (checked against `openssl x509 -hash`).

    pki = Pki.create(tmp_path)                 # CA, capath, host certificate for 127.0.0.1
    alice = pki.user("alice")                  # user certificate and key
    proxy_path = pki.proxy_file(alice)         # proxy, its key, the user certificate (0600)
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

from aso.grid import proxycert
from aso.grid.certs import slash_dn, subject_hash
from aso.grid.proxycert import PROXY_CERT_INFO

BASE_NAME = (("DC", "org"), ("DC", "aso-test"))
_OIDS = {
    "DC": NameOID.DOMAIN_COMPONENT,
    "C": NameOID.COUNTRY_NAME,
    "O": NameOID.ORGANIZATION_NAME,
    "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
    "CN": NameOID.COMMON_NAME,
}


def new_key(bits: int = 2048) -> rsa.RSAPrivateKey:
    # RSA: the fts3 client loads keys with M2Crypto's RSA.load_key.
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


def name(*parts: tuple[str, str]) -> x509.Name:
    """An x509.Name from (short name, value) pairs, most significant first, one per RDN."""
    return x509.Name(
        [x509.RelativeDistinguishedName([x509.NameAttribute(_OIDS[k], v)]) for k, v in parts]
    )


def is_proxy(cert: x509.Certificate) -> bool:
    try:
        cert.extensions.get_extension_for_oid(PROXY_CERT_INFO)
    except x509.ExtensionNotFound:
        return False
    return True


def end_entity_dn(chain: list[x509.Certificate]) -> str:
    """DN of the identity a (proxy) chain stands for: its first certificate that is no proxy;
    with the leaf alone, the issuer of a proxy (exact for first-level proxies)."""
    for cert in chain:
        if not is_proxy(cert):
            return slash_dn(cert.subject)
    return slash_dn(chain[0].issuer)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Credential:
    """A certificate, its key, and the certificates above it that are not the CA (a proxy's
    issuers)."""

    cert: x509.Certificate
    key: rsa.RSAPrivateKey
    chain: tuple[x509.Certificate, ...] = ()

    @property
    def dn(self) -> str:
        return slash_dn(self.cert.subject)

    def cert_pem(self) -> bytes:
        return b"".join(
            c.public_bytes(serialization.Encoding.PEM) for c in (self.cert, *self.chain)
        )

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: rsa.RSAPrivateKey,
    days: float,
    start: dt.datetime | None = None,
) -> x509.CertificateBuilder:
    # Five minutes in the past by default: tolerate small clock differences.
    start = start or _now() - dt.timedelta(minutes=5)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
    )


class CertificateAuthority:
    def __init__(self, common_name: str = "ASO Test CA", days: float = 30):
        self.key = new_key()
        subject = name(*BASE_NAME, ("CN", common_name))
        self.cert = (
            _builder(subject, subject, self.key, days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )

    @property
    def dn(self) -> str:
        return slash_dn(self.cert.subject)

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def _issue(
        self,
        subject: x509.Name,
        usage: ObjectIdentifier,
        days: float,
        san: list[x509.GeneralName] | None = None,
        start: dt.datetime | None = None,
    ) -> Credential:
        key = new_key()
        builder = (
            _builder(subject, self.cert.subject, key, days, start)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_end_entity_usage(), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return Credential(builder.sign(self.key, hashes.SHA256()), key)

    def host(
        self, hostname: str = "localhost", ip: str = "127.0.0.1", days: float = 30
    ) -> Credential:
        san = [x509.DNSName(hostname), x509.IPAddress(ipaddress.ip_address(ip))]
        subject = name(*BASE_NAME, ("OU", "Hosts"), ("CN", hostname))
        return self._issue(subject, ExtendedKeyUsageOID.SERVER_AUTH, days, san)

    def user(
        self, common_name: str, days: float = 30, start: dt.datetime | None = None
    ) -> Credential:
        """A user certificate valid `days` from `start` (default: now)."""
        subject = name(*BASE_NAME, ("OU", "Users"), ("CN", common_name))
        return self._issue(subject, ExtendedKeyUsageOID.CLIENT_AUTH, days, start=start)

    def crl(
        self, revoked: Sequence[x509.Certificate] = (), days: float = 7
    ) -> x509.CertificateRevocationList:
        """A CRL of this CA listing `revoked`, valid `days`."""
        now = _now() - dt.timedelta(minutes=5)
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.cert.subject)
            .last_update(now)
            .next_update(now + dt.timedelta(days=days))
        )
        for cert in revoked:
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder()
                .serial_number(cert.serial_number)
                .revocation_date(now)
                .build()
            )
        return builder.sign(self.key, hashes.SHA256())


def _end_entity_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=True,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def make_proxy(
    issuer: Credential,
    lifetime: dt.timedelta = dt.timedelta(hours=12),
    *,
    start: dt.datetime | None = None,
    signer: rsa.RSAPrivateKey | None = None,
    policy: str = proxycert.INHERIT_ALL,
    path_length: int | None = None,
) -> Credential:
    """An RFC 3820 proxy of `issuer`: subject = issuer's subject + CN=<number>, proxyCertInfo
    (policy language `policy`, default inherit all; `path_length` proxies may follow it),
    signed with the issuer's key (or, to forge one, `signer`), valid from `start` (default: now)
    and no longer than the issuer."""
    key = new_key()
    serial = secrets.randbelow(2**31) + 1
    subject = x509.Name([*issuer.cert.subject.rdns, *name(("CN", str(serial))).rdns])
    start = start or _now() - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(start)
        .not_valid_after(min(start + lifetime, issuer.cert.not_valid_after_utc))
        .add_extension(_end_entity_usage(), critical=True)
        .add_extension(
            x509.UnrecognizedExtension(PROXY_CERT_INFO, proxycert.encode(policy, path_length)),
            critical=True,
        )
        .sign(signer or issuer.key, hashes.SHA256())
    )
    return Credential(cert, key, (issuer.cert, *issuer.chain))


def load_credential(cert_path: Path, key_path: Path) -> Credential:
    """A usercert.pem / userkey.pem pair (unencrypted key) as a Credential."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError(f"{key_path}: not an RSA key")
    return Credential(cert, key)


def renew_proxy(
    cert_path: Path, key_path: Path, out: Path, lifetime: dt.timedelta = dt.timedelta(hours=12)
) -> Path:
    """What voms-proxy-init does without the VOMS part: a fresh RFC 3820 proxy at `out`."""
    if out.exists():
        out.unlink()
    return write_proxy(out, make_proxy(load_credential(cert_path, key_path), lifetime))


def write_capath(directory: Path, *cas: CertificateAuthority, crl_days: float = 7) -> Path:
    """The CAs, each with an empty CRL, in the grid layout."""
    directory.mkdir(parents=True, exist_ok=True)
    for ca in cas:
        (directory / f"{subject_hash(ca.cert)}.0").write_bytes(ca.pem())
        write_crl(directory, ca, days=crl_days)
    return directory


def write_crl(
    directory: Path,
    ca: CertificateAuthority,
    revoked: Iterable[x509.Certificate] = (),
    days: float = 7,
) -> Path:
    path = directory / f"{subject_hash(ca.cert)}.r0"
    path.write_bytes(ca.crl(list(revoked), days).public_bytes(serialization.Encoding.PEM))
    return path


def write_private(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def write_proxy(path: Path, proxy: Credential) -> Path:
    """The usual proxy file: proxy certificate, its key, then the certificates above it."""
    pem = serialization.Encoding.PEM
    chain = b"".join(c.public_bytes(pem) for c in proxy.chain)
    return write_private(path, proxy.cert.public_bytes(pem) + proxy.key_pem() + chain)


def write_pkcs12(path: Path, user: Credential, ca: CertificateAuthority, password: bytes) -> Path:
    """A browser's import file (0600): the user's certificate and key, the CA certificate in
    the chain, encrypted with `password` as Chromium/NSS and Firefox accept it (PBES2 with
    AES-256-CBC, SHA-256 MAC; not the legacy RC2/3DES encryption)."""
    encryption = (
        serialization.PrivateFormat.PKCS12.encryption_builder()
        .kdf_rounds(50000)
        .key_cert_algorithm(pkcs12.PBES.PBESv2SHA256AndAES256CBC)
        .hmac_hash(hashes.SHA256())
        .build(password)
    )
    cn = user.cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[-1].value
    data = pkcs12.serialize_key_and_certificates(
        f"{cn!s} (ASO demo)".encode(), user.key, user.cert, [ca.cert, *user.chain], encryption
    )
    return write_private(path, data)


def new_password() -> str:
    """A password to paste into a browser's import dialog: 20 letters and digits (a double
    click selects it whole in a terminal)."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(20))


@dataclass
class Pki:
    """A CA with its grid CA directory and a host credential for 127.0.0.1, under `root`."""

    root: Path
    ca: CertificateAuthority
    capath: Path
    ca_file: Path
    host_cert: Path
    host_key: Path
    host: Credential
    users: dict[str, Credential] = field(default_factory=dict)
    days: float = 30  # lifetime of everything it issues, its CRLs included

    @classmethod
    def create(cls, root: Path, days: float = 30) -> Pki:
        root.mkdir(parents=True, exist_ok=True)
        ca = CertificateAuthority(days=days)
        host = ca.host(days=days)
        ca_file = root / "ca.pem"
        ca_file.write_bytes(ca.pem())
        host_cert = root / "hostcert.pem"
        host_cert.write_bytes(host.cert_pem())
        host_key = write_private(root / "hostkey.pem", host.key_pem())
        capath = write_capath(root / "certificates", ca, crl_days=days)
        return cls(root, ca, capath, ca_file, host_cert, host_key, host, days=days)

    def user(self, common_name: str) -> Credential:
        if common_name not in self.users:
            self.users[common_name] = self.ca.user(common_name, self.days)
        return self.users[common_name]

    def proxy_file(
        self,
        user: Credential,
        lifetime: dt.timedelta = dt.timedelta(hours=12),
        tag: str = "",
        **kw: Any,
    ) -> Path:
        cn = user.cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[-1].value
        return self.write_proxy(make_proxy(user, lifetime, **kw), f"x509up_{cn!s}{tag}")

    def write_proxy(self, proxy: Credential, file_name: str) -> Path:
        path = self.root / file_name
        if path.exists():
            os.unlink(path)
        return write_proxy(path, proxy)

    def revoke(self, *certs: x509.Certificate) -> Path:
        """Publish a CRL listing `certs` in the CA directory."""
        return write_crl(self.capath, self.ca, certs, self.days)

    def write_user(self, user: Credential, stem: str) -> tuple[Path, Path]:
        """usercert.pem / userkey.pem style files (the key 0600)."""
        cert = self.root / f"{stem}cert.pem"
        cert.write_bytes(user.cert_pem())
        return cert, write_private(self.root / f"{stem}key.pem", user.key_pem())


DEMO_DAYS = 365  # a throw-away PKI, but one that lasts for a single-machine install


def demo(
    root: Path, users: list[str], agent: str = "aso-agent-host", admin: str = "aso-operator"
) -> dict[str, Path]:
    """`aso certs demo`: a CA directory, a host certificate for 127.0.0.1, and for each user,
    the agent and the operator a certificate, key and proxy; a grid-mapfile mapping them; for
    each user a PKCS#12 file for a browser (`<user>.p12`) with its generated password in
    `<user>.p12.password` (both 0600). Returns the paths by name. Everything is valid DEMO_DAYS
    days (the CRL too)."""
    pki = Pki.create(root, DEMO_DAYS)
    paths: dict[str, Path] = {
        "capath": pki.capath,
        "ca": pki.ca_file,
        "hostcert": pki.host_cert,
        "hostkey": pki.host_key,
    }
    lines = []
    for who, roles in [
        *((u, "aso-user") for u in users),
        (agent, "aso-agent"),
        (admin, "aso-admin"),
    ]:
        cred = pki.user(who)
        paths[f"{who}.cert"], paths[f"{who}.key"] = pki.write_user(cred, f"{who}-")
        paths[f"{who}.proxy"] = pki.proxy_file(cred)
        if who in users:
            password = new_password()
            paths[f"{who}.p12"] = write_pkcs12(root / f"{who}.p12", cred, pki.ca, password.encode())
            paths[f"{who}.p12.password"] = write_private(
                root / f"{who}.p12.password", f"{password}\n".encode()
            )
        lines.append(f'"{cred.dn}" {who} {roles}')
    mapfile = root / "grid-mapfile"
    mapfile.write_text("# DN  user  roles (aso certs demo)\n" + "\n".join(lines) + "\n")
    paths["grid-mapfile"] = mapfile
    return paths
