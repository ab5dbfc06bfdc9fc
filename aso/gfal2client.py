"""gfal2 as ASO uses it: the client environment to set before `import gfal2`, and configured
contexts. The gfal transfer back end and the cleaner take their contexts from here.

Measured reasons (docs/design.md, "Real storage on one machine", and the notes below):
- XRootD client (read once, when the XRootD plugin first starts, hence before the import):
  without XRD_CONNECTIONWINDOW/XRD_CONNECTIONRETRY a refused connection takes ~480 s; without
  XRD_REQUESTTIMEOUT/XRD_STREAMTIMEOUT a server that accepts and never answers hangs a copy.
  Neither timeout bounds a long third-party copy (a 1.5 GB root:// copy passed with both at 1 s).
- X509_CERT_DIR (read when a context is created): the grid CA directory (`frontend.capath`),
  which the embedded sites' certificates are issued by, or the operator's own for real sites.
- SSL_CERT_FILE: davix (gfal2's HTTP library) loads OpenSSL's default CA file for every HTTPS
  request; Debian's bundle (~140 CAs) costs ~27 ms each time, which made one davs://
  third-party copy take ~0.15 s instead of ~0.012 s. Pointing it at the grid CAs' bundle
  removes that cost; OpenSSL still finds the system CAs through its hashed directory
  (SSL_CERT_DIR, by default /usr/lib/ssl/certs), looked up by hash only when needed.
- The credential (`gfal.x509_cert`/`x509_key`: the agents' service certificate): the sites
  authorise by it (aso/local/storage_auth.py); X509_USER_CERT/KEY, read by davix and by the
  XRootD client's XrdSecgsi, which takes the certificate itself with XrdSecGSICREATEPROXY=0
  (else it tries to make a proxy and fails without a terminal) and needs XrdSecGSISRVNAMES (it
  compares the server's CN with the host name dialled, 127.0.0.1).
- HTTP plugin: OPERATION_TIMEOUT (`gfal.operation_timeout`: a stalled request blocked a thread
  > 10 min without it; it does not bound a third-party copy, whose server sends progress
  markers; a frozen destination cost a copy two of them, 10 s at 5 s, measured), the headers
  `Credential: none` and `X-No-Delegate: true` (else the servers want a delegated proxy).
  Without the headers gfal2 silently fell back to streaming the data through the client:
  stream copies between two HTTP endpoints are off unless asked for, so a failed third-party
  copy is an error, not a silent detour.
- HTTP third-party copies with authentication: XrdHttpTPC 5.5.3 pulls from the source without
  any credential; the embedded sites let any (loopback) client read (aso/local/storage_auth.py).
  gfal2's own RETRIEVE_BEARER_TOKEN stays off: it asked the destination for a token too, and a
  frozen destination held that request 120 s whatever OPERATION_TIMEOUT said (measured: a
  copy to it took 125 s instead of ~20 s); and it asked for one before every stat and
  deletion.
"""

from __future__ import annotations

import json
import os
from types import ModuleType
from typing import Any, cast
from urllib.parse import urlsplit

from aso import sites
from aso.config import Config
from aso.grid.certs import common_names, tls_files

XRD_ENVIRONMENT = {
    "XRD_CONNECTIONWINDOW": "5",  # seconds to wait for a TCP connection
    "XRD_CONNECTIONRETRY": "1",  # connection attempts
    "XRD_REQUESTTIMEOUT": "120",  # seconds for one request (a checksum of a big file included)
    "XRD_STREAMTIMEOUT": "60",  # seconds a stream with requests in flight may stay silent
    # Seconds a server that could not be reached stays failed without a new connection
    # (1800 by default): a site back from an outage must answer the next look at once.
    "XRD_STREAMERRORWINDOW": "0",
}
HTTP_HEADERS = ["Credential: none", "X-No-Delegate: true"]


def _embedded_ca(config: Config) -> dict[str, str]:
    """The grid CA directory and bundle and XrdSecgsi's settings for the embedded sites, if
    the catalogue has one."""
    if not any(site.embedded for site in config.sites.values()):
        return {}
    files = tls_files(config)
    env = {"X509_CERT_DIR": str(files.ca_dir), "SSL_CERT_FILE": str(files.ca_bundle)}
    env["XrdSecGSICREATEPROXY"] = "0"
    if files.source_cert.is_file():
        env["XrdSecGSISRVNAMES"] = common_names(files.source_cert)
    return env


def _credential(config: Config) -> dict[str, str]:
    """The agents' certificate and key, if configured."""
    if not config.gfal.x509_cert:
        return {}
    cert = str(config.path(config.gfal.x509_cert))
    key = str(config.path(config.gfal.x509_key)) if config.gfal.x509_key else cert
    return {"X509_USER_CERT": cert, "X509_USER_KEY": key}


def client_environment(config: Config, *, agent: bool = True) -> dict[str, str]:
    """The environment variables the gfal2 client of this config needs: an agent's presents
    the agents' certificate; a user's (`agent=False`: `aso upload --write`) keeps the user's
    own credential of the environment."""
    credential = _credential(config) if agent else {}
    return {**XRD_ENVIRONMENT, **_embedded_ca(config), **credential}


FORCED = (
    "X509_CERT_DIR",
    "SSL_CERT_FILE",
    "X509_USER_CERT",
    "X509_USER_KEY",
    "XrdSecGSICREATEPROXY",
    "XrdSecGSISRVNAMES",
)


def set_client_environment(config: Config, *, agent: bool = True) -> None:
    """Set the client environment in this process. XRD_* values already set win (an
    operator's tuning); the CA settings are replaced when the catalogue has embedded sites
    (those are trusted only through the grid CAs, and a generic SSL_CERT_FILE=<system
    bundle>, set on many machines, costs ~27 ms per HTTPS request); a configured credential
    replaces the environment's, a proxy included (XrdSecgsi would prefer a proxy, davix the
    certificate: the two protocols would present different identities)."""
    env = client_environment(config, agent=agent)
    for name, value in env.items():
        if name in FORCED:
            os.environ[name] = value
        else:
            os.environ.setdefault(name, value)
    if "X509_USER_CERT" in env:
        os.environ.pop("X509_USER_PROXY", None)


def import_gfal2(config: Config, *, agent: bool = True) -> ModuleType:
    """gfal2, imported after the client environment is set: the XRootD client reads it once,
    when the first context loads its plugin (its XrdSecgsi settings too: one credential and
    one CA directory per process)."""
    set_client_environment(config, agent=agent)
    import gfal2

    return cast(ModuleType, gfal2)


def new_context(config: Config, *, allow_streaming: bool = False, agent: bool = True) -> Any:
    """A gfal2 context with ASO's settings. One context runs one operation at a time: give
    each thread its own. `allow_streaming` permits copies through the client between two HTTP
    endpoints (uploads and downloads are always streamed)."""
    gfal2 = import_gfal2(config, agent=agent)
    ctx = gfal2.creat_context()
    ctx.set_opt_integer("HTTP PLUGIN", "OPERATION_TIMEOUT", config.gfal.operation_timeout)
    ctx.set_opt_string_list("HTTP PLUGIN", "HEADERS", HTTP_HEADERS)
    ctx.set_opt_boolean("HTTP PLUGIN", "RETRIEVE_BEARER_TOKEN", False)
    ctx.set_opt_boolean("HTTP PLUGIN", "ENABLE_STREAM_COPY", allow_streaming)
    ctx.set_opt_string("XROOTD PLUGIN", "COPY_CHECKSUM_TYPE", "ADLER32")
    return ctx


def transfer_parameters(ctx: Any, *, overwrite: bool = False, adler32: str | None = None) -> Any:
    """Copy parameters ASO always wants: adler32 compared at both ends (and with `adler32` if
    given), parents created, no proxy delegation (with it a missing root:// source reads as
    ENOTSUP "does not support delegation")."""
    import gfal2

    params = ctx.transfer_parameters()
    params.overwrite = overwrite
    params.create_parent = True
    params.proxy_delegation = False
    params.set_checksum(gfal2.checksum_mode.both, "ADLER32", adler32 or "")
    return params


class TransferEvents:
    """An `event_callback` that records (stage, description) of every gfal2 event of a copy,
    to tell afterwards how the data moved."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def __call__(self, event: Any) -> None:
        self.events.append((str(event.stage), str(event.description)))

    @property
    def types(self) -> list[str]:
        """The TRANSFER:TYPE descriptions in order ('3rd pull', '3rd push', 'streamed'):
        gfal2 announces each mode it tries; the last one moved the data."""
        return [description for stage, description in self.events if stage == "TRANSFER:TYPE"]

    @property
    def third_party(self) -> bool:
        """Whether the data went from storage to storage, not through this client."""
        return bool(self.types) and self.types[-1].startswith("3rd")


# Directories up from a path asked for their free space (the first that exists answers).
SPACE_LEVELS = 12


def free_space(ctx: Any, config: Config, url: str) -> int | None:
    """Bytes free where `url` is or would be written, as its storage reports them (XRootD's
    space query, gfal2's `spacetoken` attribute, asked of the nearest existing directory from
    `url` up); None: not reported (no root:// endpoint, or the storage says nothing)."""
    gfal2 = import_gfal2(config)
    query = sites.space_url(config, url)
    for _ in range(SPACE_LEVELS):
        if query is None or not urlsplit(query).path.strip("/"):
            return None
        try:
            tokens = json.loads(ctx.getxattr(query, "spacetoken"))
        except (gfal2.GError, ValueError):
            query = query.rstrip("/").rsplit("/", 1)[0]
            continue
        spaces = tokens if isinstance(tokens, list) else [tokens]
        free = [s.get("unusedsize") for s in spaces if isinstance(s, dict)]
        known = [f for f in free if isinstance(f, int) and f >= 0]
        return min(known) if known else None
    return None
