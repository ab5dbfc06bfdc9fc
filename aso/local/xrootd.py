"""The embedded storage: one XRootD server per embedded site of the catalogue, on loopback.

Each server serves its site's export directory over root:// (`root_url`) and over HTTP/WebDAV
with TLS (`http_url`; XrdHttp also takes plain HTTP on that port, as anonymous), computes adler32
checksums, and makes third-party copies both ways: root:// (`ofs.tpc`, which runs xrdcp) and
HTTP (XrdHttpTPC, which XrdHttp loads only when TLS is configured). Measured facts behind every
directive: docs/design.md, "Real storage on one machine".

The servers authenticate and authorise as grid sites (aso/local/storage_auth.py): the front
end's grid CA directory, host certificate and grid-mapfile; and they accept connections from
loopback addresses only (`xrd.allow`). xrootd refuses to run as root: started by root it runs
as the `xrootd` user (`-R xrootd`, the user Debian's xrootd-server creates), which must be able
to enter `storage.data_dir` and `frontend.capath` and owns the export directories; started by
anyone else it runs as them.

Layout of `storage.data_dir`:
  lib/                 the guard on HTTP third-party copies (tpc_guard.c), built here
  tls/                 the servers' copy of the front end's host certificate (host.pem,
                       host.key), the grid CAs in one file (ca-bundle.pem), the gridmap
                       (grid-mapfile) written from frontend.mapfile
  <site>/authdb        the site's authorisation database, written from frontend.mapfile
  <site>/xrootd.cfg    the server's config, written at every start
  <site>/xrootd.pid    pid of the server ASO started
  <site>/export/       oss.localroot: the LFN /store/x is the file export/store/x
  <site>/admin/        the server's all.adminpath (servers started by root; see admin_dir)
  <site>/run/          its all.pidpath
  <site>/log/          xrootd.log (the server's log) and xrootd.out (its stdout and stderr)
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import pwd
import re
import shutil
import socket
import ssl
import stat
import struct
import subprocess
import tempfile
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from aso import procs, sites
from aso.config import Config
from aso.grid.certs import TlsFiles, common_names, tls_files
from aso.local import storage_auth

log = logging.getLogger("aso.storage")
XROOTD_USER = "xrootd"  # created by Debian's xrootd-server; xrootd will not run as root
LOOPBACK = ("127.0.0.1", "localhost", "::1")
ALLOWED_CLIENTS = ("127.0.0.1", "[::1]")  # xrd.allow takes addresses (no DNS needed)
# XRootD 5.5.3 now and then segfaults while starting here (docs/design.md, "Real storage on
# one machine"); such a start is tried again this many times before it is reported.
CRASH_RESTARTS = 2
READ_ONLY = 0o444  # the gridmap and the authdbs: the servers read them
SERVER_START = re.compile(r"\+{6} xrootd \S+ initialization started")  # a start, in the log


class CrashedAtStart(Exception):
    """Internal: a server killed by a signal while starting (not a configuration error)."""


class StorageError(Exception):
    """The embedded storage cannot be started, stopped or used; the message says why."""


# -- who the servers run as -----------------------------------------------------------------------
@dataclass(frozen=True)
class RunAs:
    user: str | None  # passed to `xrootd -R` (only when we are root)
    uid: int
    gid: int


def run_as() -> RunAs:
    """The account the servers run as: `xrootd` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return RunAs(None, os.geteuid(), os.getegid())
    try:
        account = pwd.getpwnam(XROOTD_USER)
    except KeyError:
        raise StorageError(
            f"xrootd refuses to run as root and there is no {XROOTD_USER!r} user to run it as:"
            " install xrootd-server (it creates the user) or run ASO as an ordinary user"
        ) from None
    return RunAs(XROOTD_USER, account.pw_uid, account.pw_gid)


def _give(path: Path, owner: RunAs) -> None:
    """Hand a path over to the servers' account (only needed when we are root)."""
    if owner.user:
        os.chown(path, owner.uid, owner.gid)


def _make_dirs(path: Path, owner: RunAs | None = None, mode: int = 0o755) -> None:
    """Create the missing directories of `path` with `mode` whatever the umask, owned by
    `owner` if given."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        directory.chmod(mode)
        if owner is not None:
            _give(directory, owner)


def _can_enter(info: os.stat_result, owner: RunAs) -> bool:
    if info.st_uid == owner.uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == owner.gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def check_reachable(path: Path, owner: RunAs) -> None:
    """StorageError if the servers' account cannot reach `path` (a 0700 home or pytest
    directory above it would make xrootd fail with a far less clear message)."""
    if not owner.user:
        return
    for directory in (*reversed(path.parents), path):
        if directory.exists() and not _can_enter(directory.stat(), owner):
            raise StorageError(
                f"the {owner.user} user cannot enter {directory} (mode"
                f" {stat.S_IMODE(directory.stat().st_mode):04o}); put storage.data_dir where it"
                f" can, or allow it (chmod o+x {directory})"
            )


# -- TLS and security: the grid PKI of the front end ----------------------------------------------
def _write_if_changed(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` (atomically) unless the file holds it already: running servers re-read
    their gridmap and authdb, a rewrite with equal content would only wake them."""
    if path.is_file() and path.read_bytes() == data:
        info = path.stat()
        if stat.S_IMODE(info.st_mode) == mode and info.st_uid == os.geteuid():
            return
    temporary = path.with_name(f".{path.name}.new")
    temporary.unlink(missing_ok=True)
    temporary.write_bytes(data)
    temporary.chmod(mode)
    os.replace(temporary, path)


def ensure_tls(files: TlsFiles, owner: RunAs) -> None:
    """The servers' copy of the front end's host certificate and key (the key readable by the
    servers' account only) and the CA bundle of the grid CA directory."""
    for needed, key in ((files.ca_dir, "capath"), (files.source_cert, "host_cert"),
                        (files.source_key, "host_key")):  # fmt: skip
        if not needed.exists():
            raise StorageError(
                f"{needed} (frontend.{key}) does not exist: the embedded sites use the front"
                " end's grid PKI; make one with `aso certs demo`"
            )
    _make_dirs(files.dir)
    check_reachable(files.ca_dir, owner)
    _write_if_changed(files.host_cert, files.source_cert.read_bytes())
    storage_auth.copy_private(files.source_key, files.host_key)
    _give(files.host_key, owner)
    _write_if_changed(files.ca_bundle, storage_auth.ca_bundle(files.ca_dir))


def write_auth_files(config: Config, servers: Iterable[SiteServer], owner: RunAs) -> None:
    """The gridmap, each site's authdb and the areas' directories, from the
    front end's grid-mapfile (aso/local/storage_auth.py); again at every start and by
    `aso run`'s keeper, so that a user added to the mapfile can write without a restart."""
    identities = storage_auth.mapped_identities(config)
    files = tls_files(config)
    gridmap = storage_auth.gridmap_text(identities, storage_auth.host_dn(config))
    # Ours, read-only to the servers: a server tricked into writing a file may not grant itself.
    _write_if_changed(gridmap_file(files), gridmap.encode(), READ_ONLY)
    for server in servers:
        site = sites.site_of(config, server.site)
        _make_dirs(server.dir)
        _write_if_changed(
            server.authdb_file, storage_auth.authdb_text(site, identities).encode(), READ_ONLY
        )
        (server.dir / "macaroon.secret").unlink(missing_ok=True)  # an earlier version's
        for area in storage_auth.area_dirs(site, identities):
            _make_dirs(server.export / area.strip("/"), owner)


def _write_private(path: Path, data: bytes) -> None:
    """Write a file readable by its owner only, from its creation on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def gridmap_file(files: TlsFiles) -> Path:
    return files.dir / "grid-mapfile"


# -- one site's server ----------------------------------------------------------------------------
def _loopback_port(site: str, key: str, url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.hostname not in LOOPBACK or parts.port is None or parts.path.strip("/"):
        raise StorageError(
            f"sites.{site}.{key} = {url!r}: an embedded site needs a loopback URL with a port"
            " and no path, e.g. root://127.0.0.1:21094 (or set embedded = false)"
        )
    return parts.hostname, parts.port


@dataclass(frozen=True)
class SiteServer:
    site: str
    dir: Path
    host: str
    root_port: int
    http_port: int
    http_host: str

    @property
    def export(self) -> Path:
        return self.dir / "export"

    @property
    def config_file(self) -> Path:
        return self.dir / "xrootd.cfg"

    @property
    def pid_file(self) -> Path:
        return self.dir / "xrootd.pid"

    @property
    def log_file(self) -> Path:
        return self.dir / "log" / "xrootd.log"

    @property
    def out_file(self) -> Path:
        return self.dir / "log" / "xrootd.out"

    @property
    def authdb_file(self) -> Path:
        return self.dir / "authdb"

    @property
    def owned_dirs(self) -> tuple[Path, ...]:
        """Directories the server writes to: owned by its account."""
        return (self.export, self.dir / "run", self.dir / "log")


def admin_dir(server: SiteServer, owner: RunAs) -> Path:
    """The server's all.adminpath. xrootd makes every directory of that path that its account
    owns private (chmod 0700, XrdOucUtils::makePath with reset). Run as `xrootd` by root, it
    owns only <site>/admin. Run as an ordinary user, it owns the whole way down from their
    home (checkout and home would become 0700): the admin path then lives in a private
    directory of that user under /tmp instead."""
    if owner.user:
        return server.dir / "admin"
    key = hashlib.sha1(str(server.dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"aso-xrootd-{owner.uid}" / f"{server.site}-{key}"


def _make_admin_dir(path: Path, owner: RunAs) -> None:
    if owner.user:
        _make_dirs(path, owner, mode=0o700)
        _give(path, owner)
        return
    _make_dirs(path.parent, mode=0o700)
    if path.parent.stat().st_uid != owner.uid:  # someone else's directory in /tmp
        raise StorageError(f"{path.parent} belongs to another user; remove it")
    _make_dirs(path, mode=0o700)


def site_server(config: Config, site: str) -> SiteServer:
    conf = sites.site_of(config, site)
    host, root_port = _loopback_port(site, "root_url", conf.root_url)
    http_host, http_port = _loopback_port(site, "http_url", conf.http_url)
    directory = config.path(config.storage.data_dir) / site
    return SiteServer(site, directory, host, root_port, http_port, http_host)


def server_config(
    server: SiteServer,
    tls: TlsFiles,
    xrdcp: Path,
    admin: Path,
    guard: Path,
    require_crl: bool = True,
) -> str:
    """The xrootd config file of one site (see STORAGE-NOTES.md and aso/local/storage_auth.py
    for why each line is there). `require_crl`: the front end's rule (frontend.require_crl)."""
    certdir, gridmap = tls.ca_dir, gridmap_file(tls)
    gsi = (
        f"-certdir:{certdir} -cert:{tls.host_cert} -key:{tls.host_key} -gridmap:{gridmap}"
        # 2: a DN the gridmap does not map is refused; -ca:2: the CA must be in certdir;
        # -crl:3 a CRL of it that has not expired is required (1: used if there);
        # -dlgpxy:0: no delegation asked of clients.
        f" -gmapopt:2 -gmapto:30 -ca:2 -crl:{3 if require_crl else 1} -dlgpxy:0"
    )
    crlcheck = " crlcheck all" if require_crl else ""
    lines = [
        f"# {server.site}: written by `aso storage start` at every start; edits are lost",
        f"xrd.port {server.root_port}",
        f"xrd.protocol XrdHttp:{server.http_port} libXrdHttp.so",
        # Loopback clients only, besides authentication.
        *(f"xrd.allow host {client}" for client in ALLOWED_CLIENTS),
        f"all.adminpath {admin}",
        f"all.pidpath {server.dir / 'run'}",
        f"all.sitename {server.site}",
        f"oss.localroot {server.export}",
        "all.export / r/w",
        # Without `max`, concurrent checksum requests stalled or were never answered.
        "xrootd.chksum max 32 adler32",
        f"ofs.tpc autorm xfr 32 pgm {xrdcp} --server",
        # XrdHttp loads the HTTP third-party-copy handler only when TLS is configured.
        f"xrd.tls {tls.host_cert} {tls.host_key}",
        f"xrd.tlsca certdir {certdir} proxies{crlcheck}",
        "http.exthandler xrdtpc libXrdHttpTPC.so",
        # Its copies go through curl limited to https, and no file call under the export may
        # name `..` (LD_PRELOAD: aso/local/tpc_guard.c): XrdHttpTPC 5.5.3 takes a COPY's
        # file:// Source or Destination, and its own path, as they come.
        f"# guarded by {guard.name}",
        # One log line per HTTP third-party copy (PULL_START, TRANSFER_SUCCESS/FAIL, with the
        # path): the storage's own record of every copy, which tests check for double copies.
        "tpc.trace info",
        # Authentication: gsi only on root://, client certificates on HTTPS.
        "xrootd.seclib libXrdSec.so",
        f"sec.protocol gsi {gsi}",
        "sec.protbind * only gsi",
        f"http.gridmap required {gridmap}",
        # Authorisation: the authdb alone. No token plugin: XrdMacaroons 5.5.3 let a caveat
        # `name:` anyone may append rename the client for the authdb (storage round 2, N1).
        "ofs.authorize 1",
        f"acc.authdb {server.authdb_file}",
        "acc.authrefresh 60",  # seconds; 5.5.3 refuses less (and then denies everything)
        "acc.audit deny",
    ]
    return "\n".join(lines) + "\n"


def tpc_guard(data_dir: Path) -> Path:
    """The guard on the servers' HTTP third-party copies (tpc_guard.c: their curl limited to
    https), built once per version of its source into `data_dir`/lib, where the servers'
    account may read it but not write."""
    source = Path(__file__).with_name("tpc_guard.c")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    target = data_dir / "lib" / f"aso-tpc-guard-{digest}.so"
    if target.is_file():
        return target
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise StorageError(
            "no C compiler (cc) to build the embedded sites' guard on third-party copies"
            " (aso/local/tpc_guard.c): install gcc (deploy/debian-packages.txt)"
        )
    _make_dirs(target.parent)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        built = Path(work) / target.name
        argv = [compiler, "-shared", "-fPIC", "-O2", "-o", str(built), str(source), "-ldl"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise StorageError(f"building {source.name} failed: {done.stderr.strip()[-500:]}")
        built.chmod(0o755)
        os.replace(built, target)
    return target


def server_environment(config: Config, tls: TlsFiles, guard: Path, export: Path) -> dict[str, str]:
    """A server's environment: the guard on its HTTP third-party copies (`tpc_guard`) with the
    export it keeps `..` out of, and the credential its xrdcp (root:// third-party copies)
    authenticates with at the source, as the XrdSecgsi client reads it."""
    return {
        **os.environ,
        "LD_PRELOAD": f"{guard} {os.environ.get('LD_PRELOAD', '')}".strip(),
        "ASO_EXPORT_ROOT": str(export),
        "X509_USER_CERT": str(tls.host_cert),
        "X509_USER_KEY": str(tls.host_key),
        "X509_CERT_DIR": str(tls.ca_dir),
        **gsi_client_environment(config),
    }


def gsi_client_environment(config: Config) -> dict[str, str]:
    """What every XrdSecgsi client of the embedded sites needs: the certificate itself, not a
    proxy made from it (XrdSecgsi would try to make one and fail without a terminal), and the
    sites' certificate names (it compares the CN with the host name dialled, 127.0.0.1)."""
    return {
        "XrdSecGSICREATEPROXY": "0",
        "XrdSecGSISRVNAMES": common_names(tls_files(config).source_cert),
    }


def _root_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether an XRootD server answers the protocol's initial handshake at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack("!5i", 0, 0, 0, 4, 2012))
            reply = sock.recv(8, socket.MSG_WAITALL)
    except OSError:
        return False
    return len(reply) == 8 and struct.unpack("!2sHI", reply)[1] == 0


def _https_answers(host: str, port: int, ca_file: Path, timeout: float = 2.0) -> bool:
    """Whether an HTTPS server with a certificate of the grid CAs answers at host:port (any
    answer: an anonymous HEAD is refused)."""
    try:
        context = ssl.create_default_context(cafile=str(ca_file))
        connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
        try:
            connection.request("HEAD", "/")
            connection.getresponse().read()
        finally:
            connection.close()
    except (OSError, ssl.SSLError, http.client.HTTPException):
        return False
    return True


def _port_taken(port: int) -> bool:
    """Whether some process listens on `port` (xrootd binds every address, IPv4 and IPv6)."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address: tuple[str, int] = ("::", port)
    except OSError:  # no IPv6 on this machine
        sock, address = socket.socket(socket.AF_INET, socket.SOCK_STREAM), ("0.0.0.0", port)
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError:
            return True
    return False


# -- the servers of the catalogue -----------------------------------------------------------------
@dataclass(frozen=True)
class SiteStatus:
    site: str
    embedded: bool
    endpoints: str
    pid: int | None  # our server, if it runs
    answering: bool | None  # None: not checked (not an embedded site)
    export: Path | None

    def line(self) -> str:
        if not self.embedded:
            return f"{self.site}: not embedded ({self.endpoints})"
        if self.pid and self.answering:
            state = f"answering (pid {self.pid})"
        elif self.pid:
            state = f"running (pid {self.pid}) but not answering"
        elif self.answering:
            state = "answering, but not a server started by this config"
        else:
            state = "not running"
        return f"{self.site}: {state} at {self.endpoints}; export {self.export}"


class EmbeddedStorage:
    def __init__(self, config: Config):
        self.config = config
        self.data_dir = config.path(config.storage.data_dir)
        self.tls = tls_files(config)
        self.servers = {
            name: site_server(config, name) for name, site in config.sites.items() if site.embedded
        }

    # -- inspection -----------------------------------------------------------------------------
    def executable(self) -> Path:
        configured = self.config.storage.xrootd
        candidates = [self.config.path(configured)]
        if "/" not in configured and shutil.which(configured):
            candidates.append(Path(shutil.which(configured) or ""))
        for candidate in candidates:
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        raise StorageError(
            f"xrootd not found at {candidates[0]} (storage.xrootd); install Debian's"
            " xrootd-server (deploy/debian-packages.txt)"
        )

    def xrdcp(self, xrootd: Path) -> Path:
        """xrdcp, which the servers run for root:// third-party copies."""
        beside = xrootd.parent / "xrdcp"
        found = beside if beside.is_file() else Path(shutil.which("xrdcp") or "")
        if not found.is_file():
            raise StorageError("xrdcp not found; install Debian's xrootd-client")
        return found

    def pid_of(self, site: str) -> int | None:
        """The pid of the embedded site's running server, without asking it anything (a
        frozen server answers nothing)."""
        server = self.servers.get(site)
        return None if server is None else self._our_pid(server)

    def _our_pid(self, server: SiteServer) -> int | None:
        """The pid in the site's pid file if that process is an xrootd of this site's config."""
        program = Path(self.config.storage.xrootd).name
        return procs.pid_if_ours(
            server.pid_file,
            lambda argv: Path(argv[0]).name == program and str(server.config_file) in argv,
        )

    def _answers(self, server: SiteServer) -> bool:
        return _root_answers(server.host, server.root_port) and _https_answers(
            server.http_host, server.http_port, self.tls.ca_bundle
        )

    def status(self) -> list[SiteStatus]:
        """One entry per site of the catalogue."""
        statuses = []
        for name, site in self.config.sites.items():
            endpoints = " ".join(url for url in (site.root_url, site.http_url) if url)
            server = self.servers.get(name)
            if server is None:
                statuses.append(SiteStatus(name, False, endpoints, None, None, None))
                continue
            pid, answering = self._our_pid(server), self._answers(server)
            statuses.append(SiteStatus(name, True, endpoints, pid, answering, server.export))
        return statuses

    def _log_tail(self, server: SiteServer, lines: int = 6) -> str:
        text: list[str] = []
        for path in (server.out_file, server.log_file):
            try:
                text += path.read_text(errors="replace").strip().splitlines()
            except OSError:
                continue
        return " | ".join(text[-lines:]) or "(empty log)"

    # -- start ----------------------------------------------------------------------------------
    @property
    def lock_file(self) -> Path:
        return self.data_dir / "storage.lock"

    def start(self) -> list[str]:
        """Start the server of every embedded site that does not run yet and wait until each
        answers; one line per site. If one fails, the ones this call started are stopped.
        Starts and stops of one data directory take turns (procs.exclusive)."""
        if not self.servers:
            return ["no embedded site in the site catalogue"]
        with procs.exclusive(self.lock_file):
            return self._start()

    def _start(self) -> list[str]:
        self._check_distinct_ports()
        xrootd = self.executable()
        xrdcp = self.xrdcp(xrootd)
        owner = run_as()
        check_reachable(self.data_dir, owner)
        _make_dirs(self.data_dir)
        ensure_tls(self.tls, owner)
        write_auth_files(self.config, self.servers.values(), owner)
        guard = tpc_guard(self.data_dir)
        fe = self.config.frontend
        running = {name: self._our_pid(server) for name, server in self.servers.items()}
        wanted = {
            name: server_config(
                server, self.tls, xrdcp, admin_dir(server, owner), guard, fe.require_crl
            )
            for name, server in self.servers.items()
        }
        for name, pid in running.items():
            if pid is None:
                self._check_ports_free(self.servers[name])
            else:
                self._check_unchanged(self.servers[name], pid, wanted[name])
        spawned: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for name, server in self.servers.items():
                if running[name] is None:
                    spawned[name] = self._spawn(server, xrootd, wanted[name], owner, guard)
            for name, server in self.servers.items():
                for attempt in range(CRASH_RESTARTS + 1):
                    try:
                        self._wait_until_answering(
                            server, spawned.get(name), crash_is_final=attempt == CRASH_RESTARTS
                        )
                        break
                    except CrashedAtStart as crash:
                        log.warning("%s; starting it again", crash)
                        spawned[name] = self._spawn(server, xrootd, wanted[name], owner, guard)
        except BaseException:
            procs.terminate([p.pid for p in spawned.values()], 10.0)
            for name in spawned:
                self.servers[name].pid_file.unlink(missing_ok=True)
            raise
        return [self._start_line(name, running[name], spawned.get(name)) for name in self.servers]

    def _start_line(
        self, name: str, pid: int | None, process: subprocess.Popen[bytes] | None
    ) -> str:
        server = self.servers[name]
        site = self.config.sites[name]
        how = f"started (pid {process.pid})" if process else f"already running (pid {pid})"
        return f"{name}: {how} at {site.root_url} {site.http_url}; export {server.export}"

    def _check_distinct_ports(self) -> None:
        seen: dict[int, str] = {}
        for name, server in self.servers.items():
            if server.root_port == server.http_port:
                raise StorageError(f"sites.{name}: root_url and http_url use one port")
            for port in (server.root_port, server.http_port):
                if port in seen:
                    raise StorageError(f"sites.{name} and sites.{seen[port]} both use port {port}")
                seen[port] = name

    def _check_ports_free(self, server: SiteServer) -> None:
        for port in (server.root_port, server.http_port):
            if _port_taken(port):
                raise StorageError(
                    f"{server.site}: port {port} is already in use by another process; stop it"
                    f" or change sites.{server.site} in the config"
                )

    def _check_unchanged(self, server: SiteServer, pid: int, wanted: str) -> None:
        """A running server keeps the config it started with: say so rather than wait for it
        on ports it does not listen on."""
        try:
            current = server.config_file.read_text()
        except OSError:
            current = ""
        if current != wanted:
            raise StorageError(
                f"{server.site}: runs (pid {pid}) with an older configuration (ports or paths"
                " changed); run `aso storage stop`, then start again"
            )

    def _spawn(
        self, server: SiteServer, xrootd: Path, server_cfg: str, owner: RunAs, guard: Path
    ) -> subprocess.Popen[bytes]:
        _make_dirs(server.dir)
        for directory in server.owned_dirs:
            _make_dirs(directory, owner)
            _give(directory, owner)
        _make_admin_dir(admin_dir(server, owner), owner)
        server.config_file.write_text(server_cfg)
        # Foreground (no -b), in a session of its own: the pid we get is the server's, and a
        # start-up failure shows as an exit we can report. No -n: it would insert the instance
        # name into the log path.
        argv = [str(xrootd), "-c", str(server.config_file), "-l", str(server.log_file)]
        if owner.user:
            argv[1:1] = ["-R", owner.user]
        return procs.spawn_detached(
            argv,
            cwd=server.dir,
            output=server.out_file,
            pid_file=server.pid_file,
            env=server_environment(self.config, self.tls, guard, server.export),
        )

    def _wait_until_answering(
        self,
        server: SiteServer,
        process: subprocess.Popen[bytes] | None,
        crash_is_final: bool = True,
    ) -> None:
        timeout = self.config.storage.start_timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                if process.returncode < 0 and not crash_is_final:
                    raise CrashedAtStart(
                        f"{server.site}: xrootd was killed by signal {-process.returncode} "
                        "while starting"
                    )
                raise StorageError(
                    f"{server.site}: xrootd exited with code {process.returncode}:"
                    f" {self._log_tail(server)}"
                )
            if self._answers(server):
                if process is not None:
                    self._check_security_started(server)
                return
            time.sleep(0.1)
        raise StorageError(
            f"{server.site}: xrootd did not answer on ports {server.root_port} and"
            f" {server.http_port} within {timeout:.0f} s: {self._log_tail(server)}"
        )

    def refresh_auth(self) -> None:
        """Write the sites' gridmap and authdb again from the front end's grid-mapfile (the
        servers re-read them: acc.authrefresh, XrdSecgsi's -gmapto)."""
        with procs.exclusive(self.lock_file):
            write_auth_files(self.config, self.servers.values(), run_as())

    def _check_security_started(self, server: SiteServer) -> None:
        """XRootD 5.5.3 serves even when its authorisation failed to start (an `acc.authrefresh`
        below 60 s did it): it then refuses everything, silently. Say so at start instead."""
        try:
            text = server.log_file.read_text(errors="replace")
        except OSError:
            return
        this_start = SERVER_START.split(text)[-1]
        for part in ("Authentication", "Authorization"):
            if f"{part} system initialization failed" in this_start:
                raise StorageError(
                    f"{server.site}: xrootd's {part.lower()} did not start: "
                    f"{self._log_tail(server)}"
                )

    # -- a server that runs and does not answer -------------------------------------------------
    def kill_unanswering(self, names: list[str], timeout: float = 20.0) -> list[str]:
        """Kill the servers of sites `names` that run and still do not answer (a frozen XRootD
        takes connections and never answers), and wait until their processes are gone and
        their ports free, so that `start` can start them again; one line per site. A port that
        stays taken is a StorageError naming it."""
        with procs.exclusive(self.lock_file):
            lines = []
            for name in names:
                server = self.servers[name]
                pid = self._our_pid(server)
                if pid is None or self._answers(server):
                    continue  # gone or answering again meanwhile: nothing to kill
                if not procs.kill_group(pid, timeout):
                    raise StorageError(f"{name}: xrootd (pid {pid}) still runs after SIGKILL")
                server.pid_file.unlink(missing_ok=True)
                self._wait_ports_free(server, timeout)
                lines.append(f"{name}: killed (pid {pid}), it did not answer")
            return lines

    def _wait_ports_free(self, server: SiteServer, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while taken := [p for p in (server.root_port, server.http_port) if _port_taken(p)]:
            if time.monotonic() >= deadline:
                raise StorageError(
                    f"{server.site}: port {taken[0]} still taken {timeout:.0f} s after its"
                    " server was killed"
                )
            time.sleep(0.1)

    # -- stop -----------------------------------------------------------------------------------
    def stop(self, timeout: float = 10.0) -> list[str]:
        """Stop the servers this config started (checked by pid file and command line), and no
        other process; one line per embedded site."""
        if not self.servers:
            return ["no embedded site in the site catalogue"]
        with procs.exclusive(self.lock_file):
            pids = {name: self._our_pid(server) for name, server in self.servers.items()}
            procs.terminate([pid for pid in pids.values() if pid], timeout)
            lines = []
            for name, server in self.servers.items():
                server.pid_file.unlink(missing_ok=True)
                pid = pids[name]
                lines.append(f"{name}: stopped (pid {pid})" if pid else f"{name}: not running")
            return lines


class Keeper:
    """Keeps the embedded sites serving, as `aso run` does: starts again a server that died
    (XRootD has crashed under load here), and kills and starts again one that has run without
    answering for `storage.hang_timeout` seconds (its process alive, its ports taking
    connections that nobody answers: every copy to it waited out the client's timeout)."""

    def __init__(self, storage: EmbeddedStorage):
        self.storage = storage
        self.hang_timeout = storage.config.storage.hang_timeout
        self.silent_since: dict[str, float] = {}  # site → when it was first seen not answering
        self.mapfile_stamp: int | None = None  # the grid-mapfile's mtime when last written out

    def check(self, now: float) -> list[str]:
        """One look at every embedded site at monotonic time `now`; what it did, a line each."""
        self._refresh_auth()
        statuses = [s for s in self.storage.status() if s.embedded]
        dead = [s.site for s in statuses if s.pid is None]
        hung = [s.site for s in statuses if s.pid is not None and self._hung(s, now)]
        lines: list[str] = []
        if hung:
            lines += self.storage.kill_unanswering(hung)
        if dead or hung:
            lines += self.storage.start()
            for site in hung:
                self.silent_since.pop(site, None)
        return lines

    def _refresh_auth(self) -> None:
        """A user added to (or removed from) the grid-mapfile gets (or loses) their rights at
        the sites without a restart."""
        config = self.storage.config
        try:
            stamp = config.path(config.frontend.mapfile).stat().st_mtime_ns
        except OSError:
            return  # said at the next start
        if stamp != self.mapfile_stamp and self.storage.servers:
            self.storage.refresh_auth()
            self.mapfile_stamp = stamp

    def _hung(self, status: SiteStatus, now: float) -> bool:
        if status.answering:
            self.silent_since.pop(status.site, None)
            return False
        since = self.silent_since.setdefault(status.site, now)
        return self.hang_timeout > 0 and now - since >= self.hang_timeout


# -- files at a site ------------------------------------------------------------------------------
def adler32_hex(data: bytes) -> str:
    return f"{zlib.adler32(data) & 0xFFFFFFFF:08x}"


@dataclass(frozen=True)
class StoredFile:
    site: str
    lfn: str
    pfn: str
    size: int
    adler32: str


def export_path(config: Config, site: str, lfn: str) -> Path:
    """Where an LFN of an embedded site lies on disk."""
    if not sites.site_of(config, site).embedded:
        raise StorageError(f"{site} is not an embedded site: its files are not on this disk")
    relative = sites.namespace_path(config, site, lfn).lstrip("/")
    return site_server(config, site).export / relative


def write_file(config: Config, site: str, lfn: str, content: bytes | int) -> StoredFile:
    """Place a file at a site (test and demo data): `content`, or that many random bytes.
    Embedded sites: written into the export directory (atomically, owned by the servers'
    account); other sites: uploaded with gfal2."""
    data = content if isinstance(content, bytes) else os.urandom(content)
    if sites.site_of(config, site).embedded:
        _write_into_export(export_path(config, site, lfn), data, run_as())
    else:
        _upload(config, sites.pfn(config, site, lfn), data)
    return StoredFile(site, lfn, sites.pfn(config, site, lfn), len(data), adler32_hex(data))


def _write_into_export(path: Path, data: bytes, owner: RunAs) -> None:
    _make_dirs(path.parent, owner)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(temporary, 0o644)
        _give(Path(temporary), owner)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _upload(config: Config, url: str, data: bytes) -> None:
    from aso import gfal2client

    gfal2 = gfal2client.import_gfal2(config)
    ctx = gfal2client.new_context(config, allow_streaming=True)  # an upload is a streamed copy
    with tempfile.NamedTemporaryFile(prefix="aso-upload-") as local:
        local.write(data)
        local.flush()
        params = ctx.transfer_parameters()
        params.create_parent = True
        try:
            ctx.filecopy(params, f"file://{local.name}", url)
        except gfal2.GError as exc:
            raise StorageError(f"upload to {url} failed: [{exc.code}] {exc.message}") from None
