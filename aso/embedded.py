"""The embedded document store: a pouchdb-server process on loopback, started and stopped by ASO.

It is only a process manager. Everything else talks to the store through aso.store and the
CouchDB 3 API, so a real CouchDB (`store.url`) replaces it with no code change.

Layout of `embedded.data_dir`: `dbs/` (the databases), `config.json` (the server's own config,
holding the hashed admin password), `pouchdb-server.pid`, `pouchdb-server.log` (the server's
output, crash traces included) and `log.txt` (its request log).
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
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

    def _spawn(self) -> int:
        command = self.server_command()
        (self.data_dir / "dbs").mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        argv = [
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
