"""Where a grid client finds its X.509 credential and trusted CAs, as grid tools do.

The credential, first found wins:
1. what the configuration names (a proxy file, or a certificate and its key);
2. `$X509_USER_PROXY`;
3. `$X509_USER_CERT` and `$X509_USER_KEY` (a service or host certificate: the agents);
4. `/tmp/x509up_u<uid>` (where voms-proxy-init writes a proxy);
5. `~/.globus/usercert.pem` and `~/.globus/userkey.pem`.
The CA directory: the configuration's, else `$X509_CERT_DIR`, else
`/etc/grid-security/certificates` (hashed `<hash>.0` files, as OpenSSL's capath reads them).

A credential is a proxy file (certificate, key and the chain above it in one file) or a
(certificate, key) pair: what `requests` takes as `cert`.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CERT_DIR = "/etc/grid-security/certificates"
Credential = str | tuple[str, str]


class CredentialError(Exception):
    """No usable X.509 credential or CA directory: the message says where it looked."""


def default_proxy() -> str:
    """`$X509_USER_PROXY`, else the usual proxy path of this user."""
    return os.environ.get("X509_USER_PROXY") or f"/tmp/x509up_u{os.geteuid()}"


def _readable(path: str | Path) -> bool:
    return os.path.isfile(path) and os.access(path, os.R_OK)


def client_credential(proxy: str = "", cert: str = "", key: str = "") -> Credential:
    """The credential to present (see the module's order)."""
    env = os.environ
    candidates: list[tuple[str, Credential]] = []
    if proxy:
        candidates.append(("configured proxy", proxy))
    if cert or key:
        candidates.append(("configured certificate", (cert, key or cert)))
    if env.get("X509_USER_PROXY"):
        candidates.append(("$X509_USER_PROXY", env["X509_USER_PROXY"]))
    if env.get("X509_USER_CERT") or env.get("X509_USER_KEY"):
        user_cert = env.get("X509_USER_CERT", "")
        candidates.append(("$X509_USER_CERT/KEY", (user_cert, env.get("X509_USER_KEY", user_cert))))
    candidates.append(("proxy of this user", f"/tmp/x509up_u{os.geteuid()}"))
    globus = Path.home() / ".globus"
    candidates.append(("~/.globus", (str(globus / "usercert.pem"), str(globus / "userkey.pem"))))
    explicit = len(candidates) - 2  # the two default locations are only tried quietly
    for n, (where, credential) in enumerate(candidates):
        files = [credential] if isinstance(credential, str) else list(credential)
        if all(_readable(f) for f in files):
            return credential
        if n < explicit:  # named by the config or the environment, and not there: say so
            raise CredentialError(f"{where}: cannot read {' or '.join(map(str, files))}")
    raise CredentialError(
        "no X.509 credential: set X509_USER_PROXY (or X509_USER_CERT and X509_USER_KEY), "
        "create a proxy, or name one in the config (store.x509_proxy)"
    )


def ca_directory(capath: str = "") -> str:
    """The trusted CA directory (see the module)."""
    where = capath or os.environ.get("X509_CERT_DIR") or DEFAULT_CERT_DIR
    if not os.path.isdir(where):
        raise CredentialError(
            f"CA directory {where} does not exist (set X509_CERT_DIR or store.x509_cert_dir)"
        )
    return where
