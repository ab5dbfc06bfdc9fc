"""The document store ASO runs itself on loopback (`aso store start|stop|status`, `aso run`):
the embedded pouchdb-server (aso/local/embedded.py) or a local Apache CouchDB 3
(aso/local/couchdb.py), chosen by `store.engine`.

Both are only process managers: everything else talks to the store through aso.store and the
CouchDB 3 API. What they share lives here: a daemon started detached with a pid file (or exec'd
in the foreground for a service manager, which a helper tells when the store is ready), a
liveness probe that works whatever the store's authentication, and the stop that ends only our
own process.
"""

from __future__ import annotations

import array
import contextlib
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

import requests

from aso import procs
from aso.config import Config
from aso.store import Server, Settings, StoreError, redact

LOOPBACK = ("127.0.0.1", "localhost", "::1")
ERROR_LINE = re.compile(r"^\s*\w*Error\b|\[(error|critical|alert|emergency)\]")
LOG_SCAN_LINES = 400  # the end of a server's log searched for its last error


class LocalStoreError(Exception):
    """The local store cannot be started, stopped or used; the message says why."""


@dataclass
class Status:
    url: str
    pid: int | None  # our process, if it runs
    answering: bool  # something answers HTTP at the URL (a 401 too)
    data_dir: Path
    name: str = ""  # "node2" for one node of a local cluster

    @property
    def running(self) -> bool:
        return self.pid is not None


def answers_http(url: str, timeout: float = 5.0) -> bool:
    """Whether an HTTP server answers at `url`. Any answer counts, a 401 too: a CouchDB with
    `require_valid_user = true` refuses anonymous `GET /` and `GET /_up` alike, and a liveness
    probe must not need credentials (a store that answers with a 401 is up:
    COUCHDB_REQUIRE_VALID_USER)."""
    try:
        requests.get(f"{url.rstrip('/')}/_up", timeout=(1.0, timeout), allow_redirects=False)
        return True
    except requests.RequestException:
        return False


class LocalStore(ABC):
    """One store process on the loopback address of a URL, with its data in a directory."""

    engine: str = ""
    program: str = ""  # what messages call the server

    def __init__(self, config: Config, url: str, data_dir: Path, *, name: str = ""):
        self.config = config
        self.url = url.rstrip("/")
        parts = urlsplit(self.url)
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.data_dir = data_dir
        self.name = name

    # -- what each engine says ------------------------------------------------------------------
    @property
    @abstractmethod
    def pid_file(self) -> Path: ...

    @property
    @abstractmethod
    def log_file(self) -> Path: ...

    @abstractmethod
    def server_argv(self) -> list[str]:
        """The server's command line; makes the directories and files it needs."""

    def server_env(self) -> Mapping[str, str]:
        """Environment variables the server needs beyond ours."""
        return {}

    def server_cwd(self) -> Path:
        return self.data_dir

    @abstractmethod
    def is_ours(self, argv: list[str]) -> bool:
        """Whether a process with this command line is this store's server."""

    @abstractmethod
    def ensure_admin(self) -> None:
        """Make sure store.admin_user/admin_password is a server admin (LocalStoreError if not)."""

    def start_timeout(self) -> float:
        return self.config.embedded.start_timeout

    # -- inspection -----------------------------------------------------------------------------
    def host_is_loopback(self) -> bool:
        return self.host in LOOPBACK

    def our_pid(self) -> int | None:
        """The pid in the pid file if that process is our server for this data dir."""
        return procs.pid_if_ours(self.pid_file, self.is_ours)

    def answers(self) -> bool:
        return answers_http(self.url)

    def status(self) -> Status:
        return Status(redact(self.url), self.our_pid(), self.answers(), self.data_dir, self.name)

    def admin(self, retries: int = 2) -> Server:
        store = self.config.store
        return Server(self.url, store.admin_user, store.admin_password, Settings(retries=retries))

    def admin_works(self) -> bool:
        try:
            return self.admin().is_admin()
        except StoreError:
            return False

    # -- start ----------------------------------------------------------------------------------
    def check_startable(self) -> None:
        """Refuse a configuration the local store cannot serve."""
        if self.host not in LOOPBACK:
            raise LocalStoreError(
                f"the local store listens on loopback only; store.url has host {self.host!r}"
            )
        if self.url.startswith("https://"):
            raise LocalStoreError("the local store speaks plain HTTP on loopback; use http://")
        if not self.config.store.admin_password:
            raise LocalStoreError(
                "store.admin_password is empty; run `aso config init` to write a config file"
            )

    def start(self) -> str:
        """Start the store (if it is not running) and make sure the admin account exists.
        Starts and stops of one store take turns (procs.exclusive)."""
        self.check_startable()
        with procs.exclusive(self.pid_file.with_suffix(".lock")):
            return self._start()

    def _start(self) -> str:
        pid = self.our_pid()
        if pid is None and self.answers():
            raise LocalStoreError(
                f"another server already answers at {redact(self.url)}; stop it or change store.url"
            )
        what = f"{self.engine} store{f' {self.name}' if self.name else ''}"
        if pid is None:
            pid = self.spawn()
            message = f"{what} started (pid {pid}) at {redact(self.url)}"
        else:
            message = f"{what} already running (pid {pid}) at {redact(self.url)}"
        self.ensure_admin()
        return message

    def spawn(self) -> int:
        """Start the server detached and wait until it answers; its pid."""
        argv = self.server_argv()
        process = procs.spawn_detached(
            argv,
            cwd=self.server_cwd(),
            output=self.log_file,
            pid_file=self.pid_file,
            env={**os.environ, **self.server_env()},
        )
        self.wait_until_answering(process)
        return process.pid

    def wait_until_answering(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.start_timeout()
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                raise LocalStoreError(
                    f"{self.program} exited with code {process.returncode}: "
                    f"{self.last_error() or self.log_tail()}"
                )
            if self.answers():
                return
            time.sleep(0.2)
        procs.terminate([process.pid], 5.0)
        self.pid_file.unlink(missing_ok=True)
        raise LocalStoreError(
            f"{self.program} did not answer within {self.start_timeout():.0f} s: {self.log_tail()}"
        )

    def log_tail(self, lines: int = 5) -> str:
        if not self.log_file.exists():
            return "(no log)"
        return " | ".join(self.log_lines(lines)) or "(empty log)"

    def log_lines(self, lines: int) -> list[str]:
        """The last `lines` lines of the server's log (each cut at 300 characters)."""
        try:
            text = self.log_file.read_text(errors="replace").strip().splitlines()
        except OSError:
            return []
        return [line[:300] for line in text[-lines:]]

    def last_error(self) -> str:
        """The last line of the server's log that names an error (Node's "FetchError: ...",
        CouchDB's "[error] ..."), or "": what a crash trace's own last lines seldom say."""
        for line in reversed(self.log_lines(LOG_SCAN_LINES)):
            if ERROR_LINE.search(line):
                return line.strip()
        return ""

    # -- foreground (a service manager supervises the server) -----------------------------------
    def serve(self) -> NoReturn:
        """Become the server (exec: same pid, same arguments as `start`) and serve until
        stopped, output on this process's stdout and stderr (journald under systemd).

        A detached helper process waits for the server to answer, makes sure the admin account
        exists and, under systemd (Type=notify), says READY=1. If the store cannot be made
        usable (no answer within the start timeout, or the configured admin is not its admin),
        the helper says why on stderr and stops the server: the service then fails instead of
        serving half."""
        self.check_startable()
        pid = self.our_pid()
        if pid is not None:
            raise LocalStoreError(
                f"the {self.engine} store already runs (pid {pid}); stop it first"
            )
        if self.answers():
            raise LocalStoreError(
                f"another server already answers at {redact(self.url)}; stop it or change store.url"
            )
        argv = self.server_argv()
        server_pid = os.getpid()  # exec keeps the pid: the helper watches this one
        self.pid_file.write_text(f"{server_pid}\n")
        run_detached(lambda: self._finish_start(server_pid))
        os.chdir(self.server_cwd())
        # Python ignores SIGPIPE and SIGXFSZ; an exec keeps ignored signals ignored, so give
        # the server the defaults it would get from a shell (as subprocess does for `start`).
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)
        try:
            os.execve(argv[0], argv, {**os.environ, **self.server_env()})
        except OSError as exc:
            self.pid_file.unlink(missing_ok=True)
            raise LocalStoreError(f"cannot run {argv[0]}: {exc}") from None

    def _finish_start(self, server_pid: int) -> int:
        """In the helper: wait for the server, make sure of the admin, tell systemd. Returns
        the helper's exit status."""
        deadline = time.monotonic() + self.start_timeout()
        while not self.answers():
            if not procs.alive(server_pid):
                return 1  # it died; its own output (just before this) says why
            if time.monotonic() > deadline:
                return self._give_up(
                    server_pid,
                    f"{self.program} did not answer within {self.start_timeout():.0f} s",
                )
            time.sleep(0.2)
        try:
            self.ensure_admin()
        except (LocalStoreError, StoreError) as exc:
            return self._give_up(server_pid, str(exc))
        notify_systemd(f"READY=1\nSTATUS=serving at {redact(self.url)}")
        return 0

    def _give_up(self, server_pid: int, reason: str) -> int:
        print(f"aso store: {reason}; stopping {self.program}", file=sys.stderr, flush=True)
        with contextlib.suppress(ProcessLookupError):
            os.kill(server_pid, signal.SIGTERM)  # the server only: its group holds this helper
        return 1

    # -- stop -----------------------------------------------------------------------------------
    def stop(self, timeout: float = 30.0) -> str:
        what = f"{self.engine} store{f' {self.name}' if self.name else ''}"
        with procs.exclusive(self.pid_file.with_suffix(".lock")):
            pid = self.our_pid()
            if pid is None:
                self.pid_file.unlink(missing_ok=True)
                return f"{what} is not running"
            procs.terminate([pid], timeout)
            self.pid_file.unlink(missing_ok=True)
            return f"{what} stopped (pid {pid})"

    def kill(self) -> int | None:
        """SIGKILL the server (a crash, for tests and chaos runs); its pid, if it ran."""
        pid = self.our_pid()
        if pid is not None:
            procs.signal_group(pid, signal.SIGKILL)
            procs.reap(pid)
            deadline = time.monotonic() + 10
            while procs.alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        return pid


class LocalCluster(ABC):
    """Several local store processes that serve one store (a CouchDB cluster on loopback)."""

    engine: str = ""
    url: str = ""
    data_dir: Path

    @abstractmethod
    def start(self) -> str: ...

    @abstractmethod
    def stop(self, timeout: float = 30.0) -> str: ...

    @abstractmethod
    def statuses(self) -> list[Status]: ...

    @abstractmethod
    def serve(self) -> NoReturn: ...

    def host_is_loopback(self) -> bool:
        return (urlsplit(self.url).hostname or "") in LOOPBACK

    def status(self) -> Status:
        """The store as a whole: answering if its first node (store.url) answers."""
        first = self.statuses()[0]
        return Status(first.url, first.pid, first.answering, self.data_dir)


def run_detached(work: Callable[[], int]) -> None:
    """Run `work` in a grandchild of this process and return at once (double fork). The
    grandchild outlives an exec of this process, and init, not the exec'd program (which does
    not wait() for children it did not start), collects its exit status. Its exit status is
    what `work` returns (1 if it raised)."""
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        if os.fork() == 0:
            code = 1
            try:
                code = work()
            except BaseException as exc:  # never return into the caller's code from here
                print(f"aso store: {exc}", file=sys.stderr)
            finally:
                sys.stderr.flush()
                os._exit(code)
        os._exit(0)
    os.waitpid(child, 0)


NOTIFY_BARRIER_TIMEOUT = 5.0  # seconds: sd_notify_barrier(3)'s default


def notify_systemd(state: str) -> bool:
    """sd_notify(3): send `state` (e.g. "READY=1") to the service manager when it asked for
    it ($NOTIFY_SOCKET, Type=notify), then wait until it has read the message (a barrier): a
    sender that exits at once may be gone before systemd looks up its unit, and the message
    is then dropped. Returns whether a message was sent."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(state.encode())
        _notify_barrier(sock)
    return True


def _notify_barrier(sock: socket.socket) -> None:
    """Send BARRIER=1 with the write end of a pipe; the manager closes it once it has handled
    every earlier message (an older systemd closes fds it does not want: the same signal)."""
    read_end, write_end = os.pipe()
    try:
        fds = array.array("i", [write_end])
        sock.sendmsg([b"BARRIER=1"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        os.close(write_end)
        write_end = -1
        poller = select.poll()
        poller.register(read_end, select.POLLHUP)
        poller.poll(NOTIFY_BARRIER_TIMEOUT * 1000)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


# Servers started here listen on ports chosen outside the kernel's ephemeral range: a port
# handed out by bind(("127.0.0.1", 0)) and closed again is free only until some outgoing
# connection takes it as its local port, or another process on the machine (a second test
# leg, a benchmark) is handed the same one, and the server started on it then dies with
# EADDRINUSE (seen: a CouchDB node of the test cluster while the other test leg ran). Outside
# that range only a listener can hold a port, and a random choice among ~27,000 rarely meets
# another process's.
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PORT = 10000
_random = random.Random()  # seeded from os.urandom: forked processes do not share a sequence


def _listen_ranges() -> list[range]:
    """The loopback ports a server started here may be given: above 10000, outside the
    kernel's ephemeral range (Linux's default 32768-60999 where it cannot be read)."""
    try:
        low, high = (int(word) for word in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    ranges = [
        range(_LOWEST_PORT, max(low, _LOWEST_PORT)),
        range(max(high + 1, _LOWEST_PORT), 65536),
    ]
    return [r for r in ranges if len(r) > 0]


def _candidate_first_ports(count: int) -> list[int]:
    """Up to 500 random first ports of `count` consecutive ports inside one listen range."""
    spans = [range(r.start, r.stop - count + 1) for r in _listen_ranges() if len(r) >= count]
    if not spans:
        return []
    weights = [len(span) for span in spans]
    return [_random.choice(_random.choices(spans, weights)[0]) for _ in range(500)]


def _bind_all(ports: Iterable[int], socks: list[socket.socket]) -> bool:
    """Bind each of `ports` on loopback (the sockets kept in `socks`): all free now?"""
    try:
        for port in ports:
            sock = socket.socket()
            socks.append(sock)
            sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def free_ports(count: int) -> int:
    """The first of `count` consecutive TCP ports free on loopback now (a local cluster's
    nodes listen on store.url's port and the ones after it), outside the ephemeral range."""
    for first in _candidate_first_ports(count):
        socks: list[socket.socket] = []
        try:
            if _bind_all(range(first, first + count), socks):
                return first
        finally:
            for sock in socks:
                sock.close()
    raise LocalStoreError(f"no {count} consecutive free ports on loopback")


def free_port() -> int:
    """A TCP port free on loopback now, outside the ephemeral range (for tests and benchmarks
    that start their own servers)."""
    return free_ports(1)


def distinct_free_ports(count: int) -> list[int]:
    """`count` different TCP ports free on loopback now, outside the ephemeral range: the
    sockets are held until all are chosen, so that no two are the same."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        for first in _candidate_first_ports(1):
            if first not in ports and _bind_all([first], socks):
                ports.append(first)
                if len(ports) == count:
                    return ports
    finally:
        for sock in socks:
            sock.close()
    raise LocalStoreError(f"no {count} free ports on loopback")
