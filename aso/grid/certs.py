"""X.509 helpers shared by ASO's pieces that run TLS: the OpenSSL subject hash that names a CA
in a grid-style hashed CA directory (`<hash>.0`), computed in Python so that no `openssl`
command is needed (a test checks it against `openssl x509 -hash`); where the embedded storage's
TLS files are (`tls_files`), which its servers and gfal2's clients both need."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from aso.config import Config


def _der(tag: int, body: bytes) -> bytes:
    size = len(body)
    if size < 0x80:
        return bytes([tag, size]) + body
    raw = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(raw)]) + raw + body


def _der_oid(dotted: str) -> bytes:
    first, second, *rest = (int(arc) for arc in dotted.split("."))
    body = bytearray([40 * first + second])
    for arc in rest:
        chunk = [arc & 0x7F]
        while arc > 0x7F:
            arc >>= 7
            chunk.append(0x80 | (arc & 0x7F))
        body += bytes(reversed(chunk))
    return _der(0x06, bytes(body))


def _canonical_value(value: str) -> bytes:
    """OpenSSL's canonical form of a name value: whitespace folded, ASCII lower-cased."""
    folded = " ".join(value.split())
    return "".join(c.lower() if c < "\x80" else c for c in folded).encode()


def subject_hash(cert: x509.Certificate) -> str:
    """OpenSSL's subject hash (`openssl x509 -hash`), the file name of a CA in a hashed CA
    directory: SHA-1 of the concatenated DER of the canonical RDNs (each value a lower-cased
    UTF8String), its first four bytes read little-endian."""
    canonical = b""
    for rdn in cert.subject.rdns:
        entries = sorted(
            _der(0x30, _der_oid(a.oid.dotted_string) + _der(0x0C, _canonical_value(str(a.value))))
            for a in rdn
        )
        canonical += _der(0x31, b"".join(entries))
    digest = hashlib.sha1(canonical).digest()
    return f"{int.from_bytes(digest[:4], 'little'):08x}"


def slash_dn(subject: x509.Name) -> str:
    """The grid's (OpenSSL one-line) form of a name: /DC=org/DC=aso-test/CN=alice."""
    return "".join(
        f"/{attr.rfc4514_attribute_name}={attr.value!s}" for rdn in subject.rdns for attr in rdn
    )


# -- the embedded storage's TLS files (aso/local/xrootd.py makes them; gfal2's clients trust them)
@dataclass(frozen=True)
class TlsFiles:
    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def host_cert(self) -> Path:
        return self.dir / "host.pem"

    @property
    def host_key(self) -> Path:
        return self.dir / "host.key"

    @property
    def ca_dir(self) -> Path:
        """The hashed CA directory (X509_CERT_DIR of the clients, xrd.tlsca of the servers)."""
        return self.dir / "certificates"


def tls_files(config: Config) -> TlsFiles:
    return TlsFiles(config.path(config.storage.data_dir) / "tls")
