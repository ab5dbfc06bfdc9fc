"""`aso run`: the whole service on one host, as supervised processes.

It starts what this host needs and is not running yet (the local store, store.engine, unless
`embedded.enabled` is false; the databases and design documents; the embedded storage sites
when the gfal service uses them), then the X.509
front end (`frontend.enabled`) and every agent instance of `agents.instances`, each as its own
process (`aso frontend`, `aso agent NAME --instance ...`), restarts one that dies (with a
growing delay), starts again a local store it started that died (saying why: the end of the
store's log) and an embedded storage server that died or has stopped answering
(`storage.hang_timeout`), compacts an embedded store's databases
(`embedded.compact_interval`: it never compacts by itself), and on Ctrl-C or SIGTERM stops them
(SIGTERM, then SIGKILL after a grace period) and then what it started itself, in reverse
order. `--agents-only` runs only the
agents, against a store that runs elsewhere (a second agent host).

A local store that dies again after STORE_RESTARTS restarts within STORE_RESTART_WINDOW
seconds (one that dies at every start, or cannot be started at all) is not started again: the
service stops and `aso run` exits 1, naming the store's log and its last error. Starting it
for ever would only fill the log, and the agents would wait on a store that never stays.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509

from aso.config import Config
from aso.feedrelay import RELAY_ENV, start_relay
from aso.local.embedded import Compactor
from aso.local.managed import local_store
from aso.local.stores import LocalStoreError
from aso.provision.designdocs import init_databases, pages_url
from aso.runtime import StopFlag
from aso.store import EMBEDDED, Server

log = logging.getLogger("aso.run")

GRACE = 15.0  # seconds agents get to finish their cycle after SIGTERM
MAX_BACKOFF = 30.0
STORAGE_CHECK = 10.0  # seconds between two looks at the embedded storage servers
STORE_CHECK = 5.0  # seconds between two looks at the local store's processes
STORE_RESTARTS = 3  # restarts of the local store within STORE_RESTART_WINDOW before giving up
STORE_RESTART_WINDOW = 60.0
STORE_LOG_LINES = 20  # lines of the store's log in the run's log when it is given up
FRONTEND = "frontend"  # the X.509 front end, supervised as the agents are


@dataclass
class Child:
    agent: str
    instance: str
    log_file: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    started_at: float = field(default=0.0)


HANG_MARK = re.compile(r"^Timeout \((\d+:\d\d:\d\d(?:\.\d+)?)\)!$", re.MULTILINE)


def hang_of(log_file: Path, tail: int = 200_000) -> str | None:
    """How long the agent was stuck when its hang watchdog ended it (faulthandler's
    "Timeout (H:MM:SS)!" line, then its threads' stacks, end its log), or None."""
    try:
        with open(log_file, "rb") as log_data:
            log_data.seek(max(0, log_file.stat().st_size - tail))
            text = log_data.read().decode(errors="replace")
    except OSError:
        return None
    marks = HANG_MARK.findall(text)
    # Only the last run's: an older dump followed by a clean start does not count.
    last_start = text.rfind(" starting (store ")
    return marks[-1] if marks and text.rfind("Timeout (") > last_start else None


def planned_instances(config: Config, host_id: str) -> list[tuple[str, str]]:
    """(agent, instance) for every process this host runs."""
    counts = dict(config.agents.instances)
    if config.transfer.backend == "gfal":
        counts.setdefault("gfal-worker", 1)
    return [(agent, f"{host_id}-{slot}") for agent, n in counts.items() for slot in range(n)]


def check_frontend_files(config: Config) -> None:
    """Say now, not in a restart loop, when the front end cannot start for want of its files."""
    fe = config.frontend
    for key in ("host_cert", "host_key", "capath", "mapfile"):
        if not config.path(getattr(fe, key)).exists():
            raise ValueError(
                f"frontend.{key} {config.path(getattr(fe, key))} does not exist: run "
                "`aso certs demo certs` for a throw-away PKI, or set it (or frontend.enabled "
                "= false)"
            )
    host = x509.load_pem_x509_certificate(config.path(fe.host_cert).read_bytes())
    if host.not_valid_after_utc < datetime.now(UTC):
        raise ValueError(
            f"the front end's certificate {config.path(fe.host_cert)} expired on "
            f"{host.not_valid_after_utc:%Y-%m-%d}: renew it (`aso certs demo` for a demo PKI)"
        )


def pages_addresses(config: Config) -> list[str]:
    """Where a browser opens the monitoring pages, and how it logs in there."""
    lines = [
        f"monitoring pages: {pages_url(config)} (log in with a store account: "
        f"{config.store.admin_user} and store.admin_password of "
        f"{config.source or 'the config'}, or any account with an ASO role)"
    ]
    if config.frontend.enabled:
        lines.append(
            f"  through the front end: {pages_url(config, 'https://' + config.frontend.listen)}"
            " (with a certificate in the browser: docs/frontend.md)"
        )
    return lines


class Supervisor:
    def __init__(
        self,
        config: Config,
        config_file: Path | None,
        *,
        agents_only: bool = False,
        host_id: str | None = None,
    ):
        self.config = config
        self.config_file = config_file
        self.agents_only = agents_only
        self.host_id = host_id or socket.gethostname()
        self.stop_event = StopFlag()
        self.children: list[Child] = []
        self.cleanups: list[tuple[str, Callable[[], object]]] = []
        self.storage: Any = None  # the embedded storage's Keeper, when this host runs it
        self._storage_checked = 0.0
        self.store: Any = None  # the local store, when this supervisor started it
        self._store_checked = 0.0
        self._store_restarts: deque[float] = deque()  # when it was started again, lately
        self.compactor: Compactor | None = None  # for an embedded store

    # -- start-up -------------------------------------------------------------------------------
    def prepare(self) -> None:
        if not self.agents_only:
            store = local_store(self.config)
            managed = self.config.embedded.enabled and store.host_is_loopback()
            if managed and not store.status().answering:
                log.info(store.start())
                self.cleanups.append((f"{store.engine} store", store.stop))
                self.store = store
            admin = Server.from_config(self.config, account="admin")
            init_databases(admin, self.config)
            if admin.kind == EMBEDDED:
                self.compactor = Compactor(self.config, time.monotonic())
            self._start_storage()
            if self.config.frontend.enabled:
                check_frontend_files(self.config)

    def _start_storage(self) -> None:
        if self.config.transfer.backend != "gfal":
            return
        if not any(site.embedded for site in self.config.sites.values()):
            return
        from aso.local.xrootd import EmbeddedStorage, Keeper

        storage = EmbeddedStorage(self.config)
        for line in storage.start():
            log.info(line)
        self.storage = Keeper(storage)
        self.cleanups.append(("embedded storage", storage.stop))

    def start_feed_relay(self) -> None:
        """One changes feed for this host's agents (agents.feed_relay, aso/feedrelay.py): they
        find it by the environment they inherit."""
        relay = start_relay(self.config)
        if relay is None:
            return
        os.environ[RELAY_ENV] = relay.url
        self.cleanups.append(("feed relay", relay.stop))

    def spawn_all(self) -> None:
        log_dir = self.config.path(self.config.agents.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        planned = planned_instances(self.config, self.host_id)
        if self.config.frontend.enabled and not self.agents_only:
            planned.insert(0, (FRONTEND, self.host_id))
        for agent, instance in planned:
            child = Child(agent, instance, log_dir / f"{agent}-{instance}.log")
            self.children.append(child)
            self._spawn(child)

    def _spawn(self, child: Child) -> None:
        command = (
            ["frontend"]
            if child.agent == FRONTEND
            else ["agent", child.agent, "--instance", child.instance]
        )
        argv = [sys.executable, "-m", "aso", *self._config_args(), *command]
        with open(child.log_file, "ab") as out:
            child.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        child.started_at = time.monotonic()
        log.info(
            "started %s %s (pid %d, log %s)",
            child.agent,
            child.instance,
            child.process.pid,
            child.log_file,
        )

    def _config_args(self) -> list[str]:
        return ["--config", str(self.config_file)] if self.config_file else []

    # -- supervision ----------------------------------------------------------------------------
    def watch_storage(self, now: float) -> None:
        """Start again a site server that died or stopped answering (aso.local.xrootd.Keeper)."""
        if self.storage is None or now - self._storage_checked < STORAGE_CHECK:
            return
        self._storage_checked = now
        try:
            lines = self.storage.check(now)
        except Exception as exc:
            log.error("could not start the storage again: %s", exc)
            return
        if lines:
            log.warning("storage started again: %s", "; ".join(lines))

    def watch_store(self, now: float) -> None:
        """Start the local store again if its process is gone (one request had killed the
        embedded store, and the service stayed without it), saying why from its log. A store
        that is slow to answer is left alone: only a dead process is started again. One that
        is dead again after STORE_RESTARTS restarts within STORE_RESTART_WINDOW seconds ends
        the service (LocalStoreError, see the module's docstring)."""
        if self.store is None or now - self._store_checked < STORE_CHECK:
            return
        self._store_checked = now
        nodes = getattr(self.store, "members", None) or [self.store]
        dead = [node for node in nodes if node.our_pid() is None]
        if not dead:
            return
        for node in dead:
            log.error(
                "the %s store%s died; the end of its log (%s): %s; its last error: %s",
                self.store.engine,
                f" {node.name}" if node.name else "",
                node.log_file,
                node.log_tail(),
                node.last_error() or "none in its log",
            )
        while self._store_restarts and now - self._store_restarts[0] > STORE_RESTART_WINDOW:
            self._store_restarts.popleft()
        if len(self._store_restarts) >= STORE_RESTARTS:
            raise self.store_crash_loop(dead)
        self._store_restarts.append(now)
        try:
            log.info(self.store.start())
        except Exception as exc:  # the next look tries again (and counts this restart)
            log.error("could not start the %s store again: %s", self.store.engine, exc)

    def store_crash_loop(self, dead: list[Any]) -> LocalStoreError:
        """Why the store is not started again (EMBEDDED_REPLICATION_CRASH_AT_START: a store that
        dies at every start): its log's last lines in the run's log, and the error `aso run`
        ends with."""
        for node in dead:
            for line in node.log_lines(STORE_LOG_LINES):
                log.error("%s: %s", node.log_file.name, line)
        logs = ", ".join(str(node.log_file) for node in dead)
        errors = "; ".join(error for node in dead if (error := node.last_error()))
        return LocalStoreError(
            f"the {self.store.engine} store died again after {len(self._store_restarts)} "
            f"restarts within {STORE_RESTART_WINDOW:.0f} s: not starting it again. "
            f"Its last error: {errors or '(none in its log)'}. Look at {logs} (what killed it "
            "at start, e.g. a document in _replicator or a store it cannot open), fix that, "
            "then start `aso run` again"
        )

    def supervise(self) -> None:
        while not self.stop_event.wait(1.0):
            now = time.monotonic()
            self.watch_store(now)
            self.watch_storage(now)
            if self.compactor is not None:
                self.compactor.maybe(now)
            for child in self.children:
                if child.process is not None and child.process.poll() is not None:
                    code = child.process.returncode
                    if now - child.started_at > 60:
                        child.restarts = 0  # it ran well for a while: start again at once
                    delay = min(MAX_BACKOFF, 2.0**child.restarts)
                    log.warning(
                        "%s %s exited with code %s; restart in %.0f s",
                        child.agent,
                        child.instance,
                        code,
                        delay,
                    )
                    if stuck := hang_of(child.log_file):
                        log.warning(
                            "%s %s was stuck for %s (agents.hang_timeout): the stacks of its"
                            " threads are in %s",
                            child.agent,
                            child.instance,
                            stuck,
                            child.log_file,
                        )
                    child.process = None
                    child.restarts += 1
                    child.next_start = now + delay
                if child.process is None and now >= child.next_start:
                    self._spawn(child)

    def shutdown(self) -> None:
        running = [(c, c.process) for c in self.children if c.process and c.process.poll() is None]
        for _, process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        for child, process in running:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s %s did not stop in %.0f s: killed", child.agent, child.instance, GRACE
                )
                process.kill()
                process.wait()
        log.info("agents stopped")
        for name, stop in reversed(self.cleanups):
            log.info("stopping %s", name)
            stop()

    def run(self) -> None:
        self.stop_event.install()
        try:
            self.prepare()
            self.start_feed_relay()
            self.spawn_all()
            log.info(
                "ASO running on %s: %d supervised processes (pid %d); Ctrl-C stops it",
                self.host_id,
                len(self.children),
                os.getpid(),
            )
            if not self.agents_only:
                for line in pages_addresses(self.config):
                    log.info(line)
            self.supervise()
        finally:
            self.shutdown()
