"""The embedded document store: a pouchdb-server process on loopback, started and stopped by ASO
(`store.engine = "pouchdb"`, the default; aso/local/stores.py has what it shares with a local
CouchDB).

It is only a process manager. Everything else talks to the store through aso.store and the
CouchDB 3 API, so a real CouchDB (`store.url`) replaces it with no code change. The node it
starts loads ASO's workarounds of pouchdb-server first (PRELOADS, deploy/store/*.js), its
request guard among them: what the store gets wrong is refused whoever sends it.

Layout of `embedded.data_dir`: `dbs/` (the databases), `config.json` (the server's own config,
holding the hashed admin password), `pouchdb-server.pid`, `pouchdb-server.log` (the server's
output, crash traces included) and `log.txt` (its request log).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

from aso import model
from aso.config import Config
from aso.local.stores import LocalStore, LocalStoreError
from aso.provision.store_check import ATTACHMENTS_CSP
from aso.store import Server, Settings, StoreError
from aso.store import admin as store_admin

log = logging.getLogger("aso.store")

CHECKOUT = Path(__file__).resolve().parents[2]  # aso/local/embedded.py → the checkout
BUNDLED_SERVER = CHECKOUT / "deploy" / "store" / "node_modules" / ".bin" / "pouchdb-server"
ATTACHMENTS_CSP_MODULE = CHECKOUT / "deploy" / "store" / "attachments-csp.js"
VIEW_FUNCTIONS_MODULE = CHECKOUT / "deploy" / "store" / "view-functions.js"
REQUEST_GUARD_MODULE = CHECKOUT / "deploy" / "store" / "request-guard.js"
CPU_PROFILE_MODULE = CHECKOUT / "deploy" / "store" / "cpu-profile.js"
# The embedded store's workarounds that node loads before pouchdb-server (server_env).
PRELOADS: tuple[Path, ...] = (ATTACHMENTS_CSP_MODULE, VIEW_FUNCTIONS_MODULE, REQUEST_GUARD_MODULE)


class EmbeddedStore(LocalStore):
    engine = "pouchdb"
    program = "pouchdb-server"

    def __init__(self, config: Config):
        super().__init__(config, config.store.url, config.path(config.embedded.data_dir))

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "pouchdb-server.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "pouchdb-server.log"

    def server_command(self) -> Path:
        configured = self.config.embedded.server
        candidates = [self.config.path(configured)] if configured else [BUNDLED_SERVER]
        if not configured and shutil.which("pouchdb-server"):
            candidates.append(Path(shutil.which("pouchdb-server") or ""))
        for candidate in candidates:
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        raise LocalStoreError(
            f"pouchdb-server not found (looked at {', '.join(map(str, candidates))}); "
            "run `make setup` to install it from deploy/store/package-lock.json"
        )

    def is_ours(self, argv: list[str]) -> bool:
        return any("pouchdb-server" in a for a in argv) and any(
            a.startswith(str(self.data_dir)) for a in argv
        )

    def server_argv(self) -> list[str]:
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

    def server_env(self) -> dict[str, str]:
        """Modules node loads first: EMBEDDED_NO_ATTACHMENTS_CSP, the attachments'
        Content-Security-Policy CouchDB sends with ASO's settings
        (deploy/store/attachments-csp.js); EMBEDDED_VIEW_CONTEXT_PER_DOCUMENT, view functions
        compiled once per view update instead of once per document
        (deploy/store/view-functions.js); the request guard, which refuses what the store gets
        wrong (requests that kill it, writes that make a member an admin) and releases feeds
        whose client has gone (deploy/store/request-guard.js; it bounds batches of store users
        but not of the agent role)."""
        preload = [f"--require={module}" for module in PRELOADS]
        if os.environ.get("ASO_STORE_CPU_PROFILE"):
            # The simulator's profile of the store (SIGUSR2 starts and stops V8's profiler).
            preload.append(f"--require={CPU_PROFILE_MODULE}")
        options = " ".join(o for o in (os.environ.get("NODE_OPTIONS", ""), *preload) if o)
        return {
            "NODE_OPTIONS": options,
            "ASO_ATTACHMENTS_CSP": ATTACHMENTS_CSP,
            "ASO_AGENT_ROLE": model.AGENT_ROLE,
        }

    def ensure_admin(self) -> None:
        store = self.config.store
        anonymous = Server(self.url, settings=Settings(retries=2))
        if "_admin" in (anonymous.session().get("roles") or []):
            # A new store has no admin (anyone is admin): create the configured one.
            store_admin.set_server_admin(anonymous, store.admin_user, store.admin_password)
            config_json = self.data_dir / "config.json"
            if config_json.exists():
                config_json.chmod(0o600)
        try:
            if self.admin().is_admin():
                return
        except StoreError:
            pass
        raise LocalStoreError(
            f"store.admin_user/admin_password are not an admin of the store in {self.data_dir} "
            "(was it created with another config file?)"
        )


COMPACT_TIMEOUT = 3600.0  # seconds the embedded store may take to answer one compaction


class Compactor:
    """EMBEDDED_NEVER_COMPACTS: pouchdb-server keeps the body of every revision of a document
    until its database is compacted, and never compacts by itself (CouchDB's smoosh does):
    1,729 writes of 69 KB had grown the store by 153 MB in 38 s. Every
    `embedded.compact_interval` seconds, each database written to since its last compaction is
    compacted, in a thread of its own (20,000 requests of five revisions: 120 → 49 MB in 10 s,
    the store's reads stalled up to 6 s once). A compaction takes up where the last one ended
    (pouchdb keeps its sequence in `_local/compaction`): more often, less each time."""

    def __init__(self, config: Config, now: float):
        self.config = config
        self.interval = config.embedded.compact_interval
        self.due = now + self.interval
        self.compacted: dict[str, object] = {}  # database → its update_seq when last compacted
        self.thread: threading.Thread | None = None

    def maybe(self, now: float) -> None:
        if self.interval <= 0 or now < self.due or (self.thread and self.thread.is_alive()):
            return
        self.due = now + self.interval
        self.thread = threading.Thread(target=self.compact_written, name="compactor", daemon=True)
        self.thread.start()

    def compact_written(self) -> list[str]:
        """Compact each database written to since its last compaction; their names."""
        store = self.config.store
        settings = replace(Settings.of(store), read_timeout=COMPACT_TIMEOUT)
        server = Server(store.url, store.admin_user, store.admin_password, settings)
        started, done = time.monotonic(), []
        try:
            for name in store_admin.all_dbs(server):
                if name.startswith("_"):
                    continue
                db = server.db(name)
                seq = db.info().get("update_seq")
                if self.compacted.get(name) == seq:
                    continue
                store_admin.compact(db)
                self.compacted[name] = seq
                done.append(name)
        except StoreError as exc:
            log.warning("compaction of the embedded store stopped (next in %.0f s): %s",
                        self.interval, exc)  # fmt: skip
        if done:
            log.info("compacted %d databases of the embedded store in %.1f s: %s", len(done),
                     time.monotonic() - started, ", ".join(done))  # fmt: skip
        return done
