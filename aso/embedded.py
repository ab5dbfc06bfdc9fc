"""The embedded document store: a pouchdb-server process on loopback, started and stopped by ASO.

It is only a process manager. Everything else talks to the store through aso.store and the
CouchDB 3 API, so a real CouchDB (`store.url`) replaces it with no code change.

Layout of `embedded.data_dir`: `dbs/` (the databases), `config.json` (the server's own config,
holding the hashed admin password), `pouchdb-server.pid`, `pouchdb-server.log` (the server's
output, crash traces included) and `log.txt` (its request log).

`start` runs the server detached (for `aso run` and `aso store start`); `serve` runs it in the
foreground of the calling process, for a service manager (deploy/systemd/aso-store.service).
"""

from __future__ import annotations

import array
import contextlib
import os
import select
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

from aso import procs
from aso.config import Config
from aso.store import Server, Settings, StoreError, redact

LOOPBACK = ("127.0.0.1", "localhost", "::1")
CHECKOUT = Path(__file__).resolve().parent.parent
BUNDLED_SERVER = CHECKOUT / "deploy" / "store" / "node_modules" / ".bin" / "pouchdb-server"


class EmbeddedError(Exception):
    """The embedded store cannot be started, stopped or used; the message says why."""


@dataclass
class Status:
    url: str
    pid: int | None  # our process, if it runs
    answering: bool  # something answers at the URL
    data_dir: Path

    @property
    def running(self) -> bool:
        return self.pid is not None


class EmbeddedStore:
    def __init__(self, config: Config):
        self.config = config
        self.url = config.store.url.rstrip("/")
        parts = urlsplit(self.url)
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.data_dir = config.path(config.embedded.data_dir)
        self.pid_file = self.data_dir / "pouchdb-server.pid"
        self.log_file = self.data_dir / "pouchdb-server.log"

    def host_is_loopback(self) -> bool:
        return self.host in LOOPBACK

    # -- inspection -----------------------------------------------------------------------------
    def server_command(self) -> Path:
        configured = self.config.embedded.server
        candidates = [self.config.path(configured)] if configured else [BUNDLED_SERVER]
        if not configured and shutil.which("pouchdb-server"):
            candidates.append(Path(shutil.which("pouchdb-server") or ""))
        for candidate in candidates:
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        raise EmbeddedError(
            f"pouchdb-server not found (looked at {', '.join(map(str, candidates))}); "
            "run `make setup` to install it from deploy/store/package-lock.json"
        )

    def _our_pid(self) -> int | None:
        """The pid in the pid file if that process is our pouchdb-server for this data dir."""
        return procs.pid_if_ours(
            self.pid_file,
            lambda argv: (
                any("pouchdb-server" in a for a in argv)
                and any(a.startswith(str(self.data_dir)) for a in argv)
            ),
        )

    def _answers(self) -> bool:
        try:
            Server(self.url, settings=Settings(retries=0, connect_timeout=1, read_timeout=5)).info()
            return True
        except StoreError:
            return False

    def status(self) -> Status:
        return Status(redact(self.url), self._our_pid(), self._answers(), self.data_dir)

    # -- start ----------------------------------------------------------------------------------
    def start(self) -> str:
        """Start the store (if it is not running) and make sure the admin account exists."""
        self._check_startable()
        pid = self._our_pid()
        if pid is None and self._answers():
            raise EmbeddedError(
                f"another server already answers at {redact(self.url)}; stop it or change store.url"
            )
        if pid is None:
            pid = self._spawn()
            message = f"embedded store started (pid {pid}) at {redact(self.url)}"
        else:
            message = f"embedded store already running (pid {pid}) at {redact(self.url)}"
        self._ensure_admin()
        return message

    def _check_startable(self) -> None:
        """Refuse a configuration the embedded store cannot serve."""
        if self.host not in LOOPBACK:
            raise EmbeddedError(
                f"the embedded store listens on loopback only; store.url has host {self.host!r}"
            )
        if self.url.startswith("https://"):
            raise EmbeddedError("the embedded store speaks plain HTTP on loopback; use http://")
        if not self.config.store.admin_password:
            raise EmbeddedError(
                "store.admin_password is empty; run `aso config init` to write a config file"
            )

    def _server_argv(self) -> list[str]:
        """pouchdb-server's command line (detached or in the foreground alike); makes its
        directories, private to the owner (config.json holds the admin's password hash)."""
        command = self.server_command()
        (self.data_dir / "dbs").mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        return [
            str(command),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir / "dbs"),
            "--config",
            str(self.data_dir / "config.json"),
            "--no-stdout-logs",
            "--no-color",
        ]

    def _spawn(self) -> int:
        argv = self._server_argv()
        process = procs.spawn_detached(
            argv, cwd=self.data_dir, output=self.log_file, pid_file=self.pid_file
        )
        deadline = time.monotonic() + self.config.embedded.start_timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                raise EmbeddedError(
                    f"pouchdb-server exited with code {process.returncode}: {self._log_tail()}"
                )
            if self._answers():
                return process.pid
            time.sleep(0.2)
        process.kill()
        self.pid_file.unlink(missing_ok=True)
        raise EmbeddedError(
            f"pouchdb-server did not answer within {self.config.embedded.start_timeout:.0f} s: "
            f"{self._log_tail()}"
        )

    def _ensure_admin(self) -> None:
        store = self.config.store
        anonymous = Server(self.url, settings=Settings(retries=2))
        if "_admin" in (anonymous.session().get("roles") or []):
            # A new store has no admin (anyone is admin): create the configured one.
            anonymous.set_server_admin(store.admin_user, store.admin_password)
            config_json = self.data_dir / "config.json"
            if config_json.exists():
                config_json.chmod(0o600)
        admin = Server(self.url, store.admin_user, store.admin_password, Settings(retries=2))
        try:
            if admin.is_admin():
                return
        except StoreError:
            pass
        raise EmbeddedError(
            f"store.admin_user/admin_password are not an admin of the store in {self.data_dir} "
            "(was it created with another config file?)"
        )

    def _log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_file.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"

    # -- foreground (a service manager supervises the server) -----------------------------------
    def serve(self) -> NoReturn:
        """Become pouchdb-server (exec: same pid, same arguments as `start`) and serve until
        stopped, output on this process's stdout and stderr (journald under systemd).

        A detached helper process waits for the server to answer, makes sure the admin account
        exists and, under systemd (Type=notify), says READY=1. If the store cannot be made
        usable (no answer within embedded.start_timeout, or the configured admin is not its
        admin), the helper says why on stderr and stops the server: the service then fails
        instead of serving half."""
        self._check_startable()
        pid = self._our_pid()
        if pid is not None:
            raise EmbeddedError(f"the embedded store already runs (pid {pid}); stop it first")
        if self._answers():
            raise EmbeddedError(
                f"another server already answers at {redact(self.url)}; stop it or change store.url"
            )
        argv = self._server_argv()
        server_pid = os.getpid()  # exec keeps the pid: the helper watches this one
        self.pid_file.write_text(f"{server_pid}\n")
        run_detached(lambda: self._finish_start(server_pid))
        os.chdir(self.data_dir)  # pouchdb-server writes its request log (log.txt) in its cwd
        # Python ignores SIGPIPE and SIGXFSZ; an exec keeps ignored signals ignored, so give
        # the server the defaults it would get from a shell (as subprocess does for `start`).
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)
        try:
            os.execv(argv[0], argv)
        except OSError as exc:
            self.pid_file.unlink(missing_ok=True)
            raise EmbeddedError(f"cannot run {argv[0]}: {exc}") from None

    def _finish_start(self, server_pid: int) -> int:
        """In the helper: wait for the server, make sure of the admin, tell systemd. Returns
        the helper's exit status."""
        deadline = time.monotonic() + self.config.embedded.start_timeout
        while not self._answers():
            if not procs.alive(server_pid):
                return 1  # it died; its own output (just before this) says why
            if time.monotonic() > deadline:
                return self._give_up(
                    server_pid,
                    f"pouchdb-server did not answer within "
                    f"{self.config.embedded.start_timeout:.0f} s",
                )
            time.sleep(0.2)
        try:
            self._ensure_admin()
        except (EmbeddedError, StoreError) as exc:
            return self._give_up(server_pid, str(exc))
        notify_systemd(f"READY=1\nSTATUS=serving at {redact(self.url)}")
        return 0

    def _give_up(self, server_pid: int, reason: str) -> int:
        print(f"aso store: {reason}; stopping pouchdb-server", file=sys.stderr, flush=True)
        with contextlib.suppress(ProcessLookupError):
            os.kill(server_pid, signal.SIGTERM)  # the server only: its group holds this helper
        return 1

    # -- stop -----------------------------------------------------------------------------------
    def stop(self, timeout: float = 10.0) -> str:
        pid = self._our_pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return "embedded store is not running"
        procs.terminate([pid], timeout)
        self.pid_file.unlink(missing_ok=True)
        return f"embedded store stopped (pid {pid})"


def free_port() -> int:
    """A TCP port free on loopback now (for tests and benchmarks that start their own store)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
