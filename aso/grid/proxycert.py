"""RFC 3820 proxy certificates: the proxyCertInfo extension, read and written, and ASO's proxy
policy (which kinds of proxy the front end accepts).

    ProxyCertInfo ::= SEQUENCE {
        pCPathLenConstraint  INTEGER (0..MAX) OPTIONAL,
        proxyPolicy          ProxyPolicy }
    ProxyPolicy ::= SEQUENCE {
        policyLanguage       OBJECT IDENTIFIER,
        policy               OCTET STRING OPTIONAL }

The policy: what the grid's data services (dCache, XRootD, FTS) accept, since ASO's clients are
jobs that record their outputs. An ordinary proxy (id-ppl-inheritAll) and a limited proxy
(Globus' policy language, or a legacy `CN=limited proxy`) are accepted: HTCondor delegates limited
proxies to jobs by default, and a limited proxy may do data operations. A proxy signed by a
limited proxy must be limited too. An independent proxy (id-ppl-independent) carries none of its
issuer's rights and any other policy language is one ASO cannot judge: both are refused, as RFC
3820 asks of a relying party that does not understand a policy. Each proxy's path length limits
how many proxies may follow it (0: none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from cryptography import x509
from cryptography.x509.oid import ObjectIdentifier
from pyasn1.codec.der import decoder, encoder
from pyasn1.error import PyAsn1Error
from pyasn1.type import constraint, namedtype, univ

PROXY_CERT_INFO = ObjectIdentifier("1.3.6.1.5.5.7.1.14")
INHERIT_ALL = "1.3.6.1.5.5.7.21.1"  # id-ppl-inheritAll: every right of the issuer
INDEPENDENT = "1.3.6.1.5.5.7.21.2"  # id-ppl-independent: none of them
LIMITED = "1.3.6.1.4.1.3536.1.1.1.9"  # Globus' limited proxy: data operations, no job submission
POLICY_NAMES = {INHERIT_ALL: "inheritAll", INDEPENDENT: "independent", LIMITED: "limited"}
ACCEPTED_POLICIES = (INHERIT_ALL, LIMITED)


class _ProxyPolicy(univ.Sequence):
    componentType = namedtype.NamedTypes(
        namedtype.NamedType("policyLanguage", univ.ObjectIdentifier()),
        namedtype.OptionalNamedType("policy", univ.OctetString()),
    )


class _ProxyCertInfo(univ.Sequence):
    componentType = namedtype.NamedTypes(
        namedtype.OptionalNamedType(
            "pCPathLenConstraint",
            univ.Integer().subtype(subtypeSpec=constraint.ValueRangeConstraint(0, 2**31 - 1)),
        ),
        namedtype.NamedType("proxyPolicy", _ProxyPolicy()),
    )


class BadProxyCertInfo(ValueError):
    pass


@dataclass(frozen=True)
class ProxyInfo:
    policy: str  # the policy language's OID (dotted)
    path_length: int | None  # how many proxies may follow this one; None: no limit
    critical: bool = True

    @property
    def policy_name(self) -> str:
        return POLICY_NAMES.get(self.policy, self.policy)


def encode(policy: str = INHERIT_ALL, path_length: int | None = None) -> bytes:
    """The DER of a proxyCertInfo extension's value."""
    info = _ProxyCertInfo()
    if path_length is not None:
        info["pCPathLenConstraint"] = path_length
    info["proxyPolicy"]["policyLanguage"] = univ.ObjectIdentifier(policy)
    return cast(bytes, encoder.encode(info))


def decode(der: bytes) -> ProxyInfo:
    try:
        info, rest = decoder.decode(der, asn1Spec=_ProxyCertInfo())
    except PyAsn1Error as error:
        raise BadProxyCertInfo(f"proxyCertInfo is not DER of RFC 3820's: {error}") from None
    if rest:
        raise BadProxyCertInfo("proxyCertInfo has bytes after its value")
    length = info["pCPathLenConstraint"]
    return ProxyInfo(
        policy=str(info["proxyPolicy"]["policyLanguage"]),
        path_length=int(length) if length.isValue else None,
    )


def proxy_info(cert: x509.Certificate) -> ProxyInfo | None:
    """The certificate's proxyCertInfo, or None if it has none (an end-entity certificate or a
    legacy Globus proxy)."""
    try:
        extension = cert.extensions.get_extension_for_oid(PROXY_CERT_INFO)
    except x509.ExtensionNotFound:
        return None
    value = extension.value
    der = value.value if isinstance(value, x509.UnrecognizedExtension) else value.public_bytes()
    info = decode(der)
    return ProxyInfo(info.policy, info.path_length, extension.critical)
