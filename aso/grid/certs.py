"""X.509 helpers shared by ASO's pieces that run TLS: the OpenSSL subject hash that names a CA
in a grid-style hashed CA directory (`<hash>.0`), computed in Python so that no `openssl`
command is needed (a test checks it against `openssl x509 -hash`); where the embedded storage's
TLS files are (`tls_files`), which its servers and gfal2's clients both need."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

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


def common_names(cert_file: Path) -> str:
    """The CNs of a certificate file's subject, comma-separated: XrdSecGSISRVNAMES of the
    embedded sites' XrdSecgsi clients (XRootD 5.5.3 compares the server's CN, not its
    subjectAltName, with the host name dialled, and 127.0.0.1 is no CN a CA issues)."""
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    return ",".join(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME))


def slash_dn(subject: x509.Name) -> str:
    """The grid's (OpenSSL one-line) form of a name: /DC=org/DC=aso-test/CN=alice."""
    return "".join(
        f"/{attr.rfc4514_attribute_name}={attr.value!s}" for rdn in subject.rdns for attr in rdn
    )


# -- the embedded storage's TLS files (aso/local/xrootd.py writes them; gfal2's clients read them)
@dataclass(frozen=True)
class TlsFiles:
    """The embedded sites trust the grid CA directory of the front end (`frontend.capath`) and
    serve the front end's host certificate; `dir` holds what the servers' account reads."""

    dir: Path
    ca_dir: Path  # the grid CA directory (X509_CERT_DIR of the clients, xrd.tlsca of the servers)
    source_cert: Path  # the front end's host certificate and key, copied at every start
    source_key: Path

    @property
    def ca_bundle(self) -> Path:
        """The CAs of `ca_dir` in one file (SSL_CERT_FILE of gfal2's clients)."""
        return self.dir / "ca-bundle.pem"

    @property
    def host_cert(self) -> Path:
        return self.dir / "host.pem"

    @property
    def host_key(self) -> Path:
        return self.dir / "host.key"


def tls_files(config: Config) -> TlsFiles:
    fe = config.frontend
    return TlsFiles(
        config.path(config.storage.data_dir) / "tls",
        config.path(fe.capath),
        config.path(fe.host_cert),
        config.path(fe.host_key),
    )
