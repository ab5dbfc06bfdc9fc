"""The site catalogue: CMS site name → storage endpoints, LFN → PFN.

A site (`[sites.NAME]` in the config) has an XRootD endpoint (`root_url`) and an HTTP/WebDAV
endpoint (`http_url`); `protocol` says which one transfers use. The PFN of an LFN is the
endpoint, then `path_prefix`, then the LFN, spelled the way gfal2 needs it:

- root: `root://host:port//store/...` (the double slash makes the path absolute for XRootD);
- https: `davs://host:port/store/...`: gfal2's WebDAV scheme (an `https://` URL makes the same
  third-party copy, measured, but `davs://` also lists and creates directories with WebDAV);
- http: `http://host:port/store/...`, plain HTTP to the same XrdHttp port (XrdHttp accepts
  plain and TLS connections on one port); on loopback the fastest third-party copy;
- sim: `sim://SITE/store/...`, a simulated site (the sim back end's): no endpoint and no data,
  so the agents, the cleaner and the reconciler treat the simulator's sites as any other.

The cleaner may delete only inside a site's temp area: `in_temp_area` is the one strict test
(normalised absolute path, no `.`/`..` or empty segments, strictly below `temp_area`), and
`temp_pfn` refuses everything else.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from aso.config import Config, SiteConfig
from aso.model import LFN_PATTERN

PROTOCOLS = ("root", "http", "https", "sim")
SCHEMES = {"root": "root", "http": "http", "https": "davs", "sim": "sim"}
_LFN = re.compile(LFN_PATTERN)


class SiteError(ValueError):
    """An unknown site, a site without the endpoint asked for, or an LFN that cannot be used."""


def simulated(names: Iterable[str]) -> dict[str, SiteConfig]:
    """A site catalogue of simulated sites (protocol sim), for the sim back end."""
    return {name: SiteConfig(protocol="sim", embedded=False) for name in names}


def with_storage(config: Config) -> list[str]:
    """The sites that have storage to list: all but the simulated ones."""
    return sorted(name for name, site in config.sites.items() if site.protocol != "sim")


def site_of(config: Config, name: str) -> SiteConfig:
    try:
        return config.sites[name]
    except KeyError:
        known = ", ".join(sorted(config.sites)) or "none"
        raise SiteError(f"unknown site {name!r}; the site catalogue has: {known}") from None


def check_lfn(lfn: str) -> str:
    """The LFN itself if it is a valid, normalised /store/ path; SiteError otherwise."""
    if not isinstance(lfn, str) or not _LFN.match(lfn) or posixpath.normpath(lfn) != lfn:
        raise SiteError(f"not a valid LFN: {lfn!r} (absolute /store/ path, no ./.. or //)")
    return lfn


def endpoint_url(config: Config, site: str, protocol: str | None = None) -> str:
    """The configured URL of the site's endpoint for `protocol` (default: the site's)."""
    conf = site_of(config, site)
    protocol = protocol or conf.protocol
    if protocol not in PROTOCOLS:
        raise SiteError(f"unknown protocol {protocol!r}; one of {', '.join(PROTOCOLS)}")
    if protocol == "sim":
        if conf.protocol != "sim":
            raise SiteError(f"site {site} is not a simulated site")
        return f"sim://{site}"
    key = "root_url" if protocol == "root" else "http_url"
    url: str = getattr(conf, key)
    if not url:
        raise SiteError(f"site {site} has no {key} for protocol {protocol}")
    return url


def offers(config: Config, site: str, protocol: str) -> bool:
    """Whether the site has an endpoint for `protocol`."""
    conf = site_of(config, site)
    if protocol == "sim" or conf.protocol == "sim":
        return protocol == conf.protocol  # a simulated site offers nothing else
    return bool(conf.root_url if protocol == "root" else conf.http_url)


def namespace_path(config: Config, site: str, lfn: str) -> str:
    """The path of an LFN in the site's storage namespace: path_prefix + LFN."""
    prefix = site_of(config, site).path_prefix.strip("/")
    check_lfn(lfn)
    return f"/{prefix}{lfn}" if prefix else lfn


def pfn(config: Config, site: str, lfn: str, protocol: str | None = None) -> str:
    """The URL a transfer (or a deletion) of `lfn` at `site` uses."""
    protocol = protocol or site_of(config, site).protocol
    parts = urlsplit(endpoint_url(config, site, protocol))
    base = parts.path.strip("/")  # an endpoint may carry a path of its own
    path = (f"/{base}" if base else "") + namespace_path(config, site, lfn)
    if protocol == "root":
        return f"root://{parts.netloc}/{path}"  # root://host:port//store/...
    return f"{SCHEMES[protocol]}://{parts.netloc}{path}"


def space_url(config: Config, url: str) -> str | None:
    """The root:// URL of the same file or directory as `url` (a PFN) at the site whose
    endpoint `url` names: free space is asked over XRootD (`xrdfs query space`, gfal2's
    `spacetoken` attribute); XrdHttp answers no WebDAV quota property. None: no site of the
    catalogue has that endpoint and a root_url."""
    parts = urlsplit(url)
    for conf in config.sites.values():
        for endpoint in (conf.root_url, conf.http_url):
            where = urlsplit(endpoint) if endpoint else None
            if not conf.root_url or where is None or where.netloc != parts.netloc:
                continue
            base = where.path.strip("/")
            path = "/" + parts.path.lstrip("/")
            if base and not path.startswith(f"/{base}/"):
                continue
            namespace = path[len(base) + 1 :] if base else path
            root = urlsplit(conf.root_url)
            root_base = root.path.strip("/")
            return f"root://{root.netloc}/{'/' + root_base if root_base else ''}{namespace}"
    return None


def link_protocol(config: Config, source: str, destination: str) -> str:
    """The protocol both ends of a copy use: a third-party copy needs one protocol on both.

    The destination's own protocol if the source offers it, else the source's if the
    destination offers it; with no common endpoint, the destination's (gfal2 then streams the
    data through the client, which the transfer back end reports)."""
    dst_protocol = site_of(config, destination).protocol
    src_protocol = site_of(config, source).protocol
    if offers(config, source, dst_protocol):
        return dst_protocol
    if offers(config, destination, src_protocol):
        return src_protocol
    return dst_protocol


def transfer_urls(
    config: Config, source: str, destination: str, source_lfn: str, destination_lfn: str
) -> tuple[str, str]:
    """(source PFN, destination PFN) of one copy, both in the link's protocol."""
    protocol = link_protocol(config, source, destination)
    return (
        pfn(config, source, source_lfn, protocol),
        pfn(config, destination, destination_lfn, protocol),
    )


def _area(area: str) -> str:
    """An LFN area as a directory prefix: normalised, with one trailing slash."""
    return posixpath.normpath("/" + area.strip("/")) + "/"


def in_area(area: str, lfn: str) -> bool:
    """Whether `lfn` is a valid LFN strictly below the directory `area`."""
    try:
        check_lfn(lfn)
    except SiteError:
        return False
    prefix = _area(area)
    return lfn.startswith(prefix) and len(lfn) > len(prefix)


def in_temp_area(config: Config, site: str, lfn: str) -> bool:
    """Whether `lfn` lies in the site's temp area (the only place the cleaner may delete)."""
    return in_area(site_of(config, site).temp_area, lfn)


def in_user_area(config: Config, site: str, lfn: str) -> bool:
    return in_area(site_of(config, site).user_area, lfn)


def temp_pfn(config: Config, site: str, lfn: str) -> str:
    """The PFN of a temporary copy, for the cleaner; SiteError for anything outside the temp
    area, so that nothing else can ever be deleted by mistake."""
    if not in_temp_area(config, site, lfn):
        raise SiteError(
            f"refusing {lfn!r}: not in the temp area {site_of(config, site).temp_area} of {site}"
        )
    return pfn(config, site, lfn)
