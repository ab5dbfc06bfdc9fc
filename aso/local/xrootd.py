"""The embedded storage: one XRootD server per embedded site of the catalogue, on loopback.

Each server serves its site's export directory over root:// (`root_url`) and over HTTP/WebDAV
with TLS (`http_url`; XrdHttp also accepts plain HTTP on that port), computes adler32
checksums, and makes third-party copies both ways: root:// (`ofs.tpc`, which runs xrdcp) and
HTTP (XrdHttpTPC, which XrdHttp loads only when TLS is configured). Measured facts behind every
directive: docs/design.md, "Real storage on one machine".

There is no authentication, so a server accepts connections from loopback addresses only
(`xrd.allow`). xrootd refuses to run as root: started by root it runs as the `xrootd` user
(`-R xrootd`, the user Debian's xrootd-server creates), which must be able to enter
`storage.data_dir` and owns the export directories; started by anyone else it runs as them.

Layout of `storage.data_dir`:
  tls/                 throw-away CA (ca.pem, ca.key) and host certificate (host.pem, host.key)
                       for 127.0.0.1, ::1 and localhost, made once; tls/certificates/ is the
                       hashed CA directory (<subject hash>.0) for X509_CERT_DIR and xrd.tlsca
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
import ipaddress
import logging
import os
import pwd
import shutil
import socket
import ssl
import stat
import struct
import subprocess
import tempfile
import time
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aso import procs, sites
from aso.config import Config
from aso.grid.certs import TlsFiles, subject_hash, tls_files

log = logging.getLogger("aso.storage")
XROOTD_USER = "xrootd"  # created by Debian's xrootd-server; xrootd will not run as root
LOOPBACK = ("127.0.0.1", "localhost", "::1")
ALLOWED_CLIENTS = ("127.0.0.1", "[::1]")  # xrd.allow takes addresses (no DNS needed)
CERT_DAYS = 3650
# XRootD 5.5.3 now and then segfaults while starting here (docs/design.md, "Real storage on
# one machine"); such a start is tried again this many times before it is reported.
CRASH_RESTARTS = 2


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


# -- TLS: a throw-away CA and a host certificate for loopback -------------------------------------
def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: rsa.RSAPrivateKey
) -> x509.CertificateBuilder:
    now = datetime.now(UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )


def _ca_certificate(key: rsa.RSAPrivateKey) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ASO"),
            x509.NameAttribute(NameOID.COMMON_NAME, "ASO embedded storage throw-away CA"),
        ]
    )
    usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
    return (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )


def _host_certificate(
    ca_key: rsa.RSAPrivateKey, ca: x509.Certificate, key: rsa.RSAPrivateKey
) -> x509.Certificate:
    names = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    usage = x509.KeyUsage(True, False, True, False, False, False, False, False, False)
    eku = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    ca_ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        _builder(subject, ca.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), False
        )
        .sign(ca_key, hashes.SHA256())
    )


def _write_private(path: Path, data: bytes) -> None:
    """Write a file readable by its owner only, from its creation on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _tls_usable(files: TlsFiles) -> bool:
    paths = (files.ca_cert, files.ca_key, files.host_cert, files.host_key)
    if not all(p.is_file() for p in paths):
        return False
    host = x509.load_pem_x509_certificate(files.host_cert.read_bytes())
    return host.not_valid_after_utc > datetime.now(UTC) + timedelta(days=1)


def ensure_tls(files: TlsFiles, owner: RunAs) -> None:
    """Make the CA and host certificate once (again only if one is missing or about to expire);
    publish the CA in the hashed directory; let the servers' account read the host key."""
    _make_dirs(files.dir)
    if not _tls_usable(files):
        ca_key, host_key = _new_key(), _new_key()
        ca = _ca_certificate(ca_key)
        _write_private(files.ca_key, _key_pem(ca_key))
        files.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        host = _host_certificate(ca_key, ca, host_key)
        _write_private(files.host_key, _key_pem(host_key))
        files.host_cert.write_bytes(host.public_bytes(serialization.Encoding.PEM))
    _give(files.host_key, owner)
    pem = files.ca_cert.read_bytes()
    hashed = files.ca_dir / f"{subject_hash(x509.load_pem_x509_certificate(pem))}.0"
    if hashed.is_file() and hashed.read_bytes() == pem:
        return  # untouched: running servers re-read this directory
    if files.ca_dir.exists():
        shutil.rmtree(files.ca_dir)  # drop the hash file of a replaced CA
    _make_dirs(files.ca_dir)
    hashed.write_bytes(pem)


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


def server_config(server: SiteServer, tls: TlsFiles, xrdcp: Path, admin: Path) -> str:
    """The xrootd config file of one site (see STORAGE-NOTES.md for why each line is there)."""
    lines = [
        f"# {server.site}: written by `aso storage start` at every start; edits are lost",
        f"xrd.port {server.root_port}",
        f"xrd.protocol XrdHttp:{server.http_port} libXrdHttp.so",
        # No authentication is configured: accept loopback clients only.
        *(f"xrd.allow host {client}" for client in ALLOWED_CLIENTS),
        f"all.adminpath {admin}",
        f"all.pidpath {server.dir / 'run'}",
        f"oss.localroot {server.export}",
        "all.export / r/w",
        # Without `max`, concurrent checksum requests stalled or were never answered.
        "xrootd.chksum max 32 adler32",
        f"ofs.tpc autorm xfr 32 pgm {xrdcp} --server",
        # XrdHttp loads the HTTP third-party-copy handler only when TLS is configured.
        f"xrd.tls {tls.host_cert} {tls.host_key}",
        f"xrd.tlsca certdir {tls.ca_dir}",
        "http.exthandler xrdtpc libXrdHttpTPC.so",
        # One log line per HTTP third-party copy (PULL_START, TRANSFER_SUCCESS/FAIL, with the
        # path): the storage's own record of every copy, which tests check for double copies.
        "tpc.trace info",
    ]
    return "\n".join(lines) + "\n"


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
    """Whether an HTTPS server with a certificate of our CA answers at host:port."""
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
            server.http_host, server.http_port, self.tls.ca_cert
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
        running = {name: self._our_pid(server) for name, server in self.servers.items()}
        wanted = {
            name: server_config(server, self.tls, xrdcp, admin_dir(server, owner))
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
                    spawned[name] = self._spawn(server, xrootd, wanted[name], owner)
            for name, server in self.servers.items():
                for attempt in range(CRASH_RESTARTS + 1):
                    try:
                        self._wait_until_answering(
                            server, spawned.get(name), crash_is_final=attempt == CRASH_RESTARTS
                        )
                        break
                    except CrashedAtStart as crash:
                        log.warning("%s; starting it again", crash)
                        spawned[name] = self._spawn(server, xrootd, wanted[name], owner)
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
        self, server: SiteServer, xrootd: Path, server_cfg: str, owner: RunAs
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
            argv, cwd=server.dir, output=server.out_file, pid_file=server.pid_file
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
                return
            time.sleep(0.1)
        raise StorageError(
            f"{server.site}: xrootd did not answer on ports {server.root_port} and"
            f" {server.http_port} within {timeout:.0f} s: {self._log_tail(server)}"
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

    def check(self, now: float) -> list[str]:
        """One look at every embedded site at monotonic time `now`; what it did, a line each."""
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
