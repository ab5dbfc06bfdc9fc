"""Who may do what at the embedded sites: the XRootD security of `aso storage start`.

The sites authenticate as grid sites do: root:// with XrdSecgsi (a certificate or RFC 3820
proxy of a CA in the grid CA directory `frontend.capath`, the front end's), HTTPS with XrdHttp's
client certificates against the same directory. The DN is mapped to a user by the front end's
grid-mapfile (`frontend.mapfile`, parsed by the front end's own GridMap: one rule), from which
each server gets a plain XRootD gridmap (DN → name) and an authorisation database (authdb).
An unmapped DN, an anonymous client and plain http:// may read and list, nothing else.

Rights (`site_rules`), for every site (paths in the site's namespace, path_prefix included):
- any client: read and list /store/ (the HTTP third-party pulls have no credential);
- every mapped user: also write and delete, only under their temporary areas
  `<temp_area><name>/` and `<temp_area><name>.<hash>/` (the store's rule, aso/model.py);
- `aso-agent`: also delete in the temp area (the cleaner, the reconciler) and write, overwrite
  and delete in the final areas (`user_area`, /store/group/): the agents copy into them.
XrdAcc matches a path by its leading characters: every user rule ends in "/" or "." so that
`al` never matches `/store/temp/user/alice/`.

Third-party copies with authentication on (XRootD 5.5.3):
- root://: the source lets the destination read by the rendezvous key the client's own read
  opened (ofs.tpc), but the destination's xrdcp must still authenticate: it runs with the
  host certificate (X509_USER_CERT/KEY in the server's environment), mapped to HOST_NAME, which
  has no right of its own.
- HTTPS: XrdHttpTPC 5.5.3 pulls with libcurl and no credential at all ("Credential: none" is
  the only kind it takes), so every (loopback) client may read and list /store/; writes and
  deletions stay the identities' above. No token is taken: XrdMacaroons 5.5.3, which gave the
  pulls a token, let a `name:` caveat anyone may append rename the client for the authdb (the
  agents' rights with no credential: storage round 2, N1). The servers' curl takes https alone,
  and no file call under the export names `..` (tpc_guard.c: XrdHttpTPC opens a COPY's path
  as given, after the authdb judged it by its first characters).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from aso import model
from aso.config import Config, SiteConfig
from aso.grid.certs import slash_dn

# The name the sites' own host certificate maps to: a "." never occurs in a user's name
# (the front end's USER_NAME_PATTERN), so no user can hold it; it has no rule in any authdb.
HOST_NAME = "aso.site"
GROUP_AREA = model.GROUP_AREA
# Privileges (XrdAcc letters): a = all; l = lookup, r = read, d = delete.
READ, ALL, CLEAN = "lr", "a", "lrd"


class AuthError(Exception):
    """The security files of the embedded sites cannot be made; the message says why."""


@dataclass(frozen=True)
class Mapped:
    dn: str
    name: str
    roles: tuple[str, ...]


def mapped_identities(config: Config) -> list[Mapped]:
    """The front end's grid-mapfile, read by the front end's own parser."""
    from aso.frontend.server import GridMap, MapfileError

    path = config.path(config.frontend.mapfile)
    try:
        parsed = GridMap.parse(path.read_text(), str(path))
    except (OSError, MapfileError) as error:
        raise AuthError(f"frontend.mapfile: {error}") from None
    return [Mapped(dn, who.name, who.roles) for dn, who in parsed.items()]


def host_dn(config: Config) -> str:
    cert = x509.load_pem_x509_certificate(config.path(config.frontend.host_cert).read_bytes())
    return slash_dn(cert.subject)


def _quote(dn: str) -> str:
    if '"' in dn or "\n" in dn:
        raise AuthError(f"a DN with a quote or a newline cannot be written to a gridmap: {dn!r}")
    return f'"{dn}"'


def gridmap_text(identities: Iterable[Mapped], host: str) -> str:
    lines = [f"{_quote(who.dn)} {who.name}" for who in identities]
    lines.append(f"{_quote(host)} {HOST_NAME}")
    return "# written by `aso storage start` from frontend.mapfile; edits are lost\n" + (
        "\n".join(lines) + "\n"
    )


def _area(site: SiteConfig, area: str) -> str:
    """An LFN area as the site's namespace spells it (path_prefix + area), with a final /."""
    prefix = site.path_prefix.strip("/")
    path = f"/{prefix}{area}" if prefix else area
    return path.rstrip("/") + "/"


def site_rules(site: SiteConfig, who: Mapped) -> list[tuple[str, str]]:
    """(path, privileges) of one identity at one site, longest path first: XrdAcc takes the
    first path that matches."""
    temp, store = _area(site, site.temp_area), _area(site, "/store/")
    rules = [(f"{temp}{who.name}/", ALL), (f"{temp}{who.name}.", ALL)]
    if model.AGENT_ROLE in who.roles:
        rules += [
            (_area(site, site.user_area), ALL),
            (_area(site, GROUP_AREA), ALL),
            (temp, CLEAN),
        ]
    rules.append((store, READ))
    return sorted(rules, key=lambda rule: len(rule[0]), reverse=True)


def authdb_text(site: SiteConfig, identities: Iterable[Mapped]) -> str:
    lines = ["# written by `aso storage start` from frontend.mapfile; edits are lost"]
    for who in identities:
        rules = " ".join(f"{path} {privileges}" for path, privileges in site_rules(site, who))
        lines.append(f"u {who.name} {rules}")
    # Any client (the loopback ones the sites take) reads and lists: a destination's HTTP
    # third-party pull has no credential at all (XrdHttpTPC 5.5.3).
    lines.append(f"u * {_area(site, '/store/')} {READ}")
    return "\n".join(lines) + "\n"


def area_dirs(site: SiteConfig, identities: Iterable[Mapped]) -> list[str]:
    """Directories made at start: the areas and each user's temporary area. XrdAcc judges a
    new directory by its own path, and `/store/temp/user/alice` (no final /) matches none of
    alice's rules: a client could not make it."""
    temp = _area(site, site.temp_area)
    top = [temp, _area(site, site.user_area), _area(site, GROUP_AREA)]
    return top + [f"{temp}{who.name}/" for who in identities]


def ca_bundle(capath: Path) -> bytes:
    """The CA certificates of a hashed CA directory, one PEM file (SSL_CERT_FILE of gfal2's
    clients: see aso/gfal2client.py)."""
    files = sorted(p for p in capath.iterdir() if p.name.partition(".")[2].isdigit())
    return b"".join(p.read_bytes() for p in files)


def copy_private(source: Path, target: Path) -> None:
    """Copy a key (0600) for the servers' account, which cannot read the front end's."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle, open(source, "rb") as original:
        shutil.copyfileobj(original, handle)
