"""A local Apache CouchDB 3 that ASO runs itself (`store.engine = "couchdb"`): one node, or a
cluster of several nodes on loopback (`couchdb.nodes`, `aso store start --nodes 3`).

CouchDB comes from an install of the user's (Apache's packages put it in /opt/couchdb):
`couchdb.home`, else $COUCHDB_HOME, else /opt/couchdb. Every node runs from that one install
with a vm.args and an ini of its own, both written by ASO at each start from the config, with
the settings of deploy/couchdb/local.ini (SETTINGS below; tests/test_deploy.py checks that the
two agree): the admin of store.admin_user, proxy authentication with frontend.secret, the
attachments' Content-Security-Policy that lets the monitoring pages' own script run, limits.
The node reads only CouchDB's defaults (etc/default.ini, etc/default.d/) and that ini, never
the install's local.ini: a system CouchDB on the same machine keeps its own settings.

Layout under `embedded.data_dir`/couchdb: `store.json` (what a new store is created with and
keeps: node names, Erlang cookie, uuid, secret), and per node `nodeN/`: `data/` (databases and
view indexes), `aso.ini`, `vm.args`, `.erlang.cookie` (the node's $HOME: Erlang reads its
cookie there, never from a command line), `couchdb.pid`, `couchdb.log` (its output). Node N listens
on store.url's port + N - 1; node 1 is the one store.url names.

A cluster is joined as in deploy/ (`aso store setup-cluster`, `join_cluster`): every node is
configured with the same admin, secret and cookie by its ini and vm.args; the first node adds
the others (`PUT /_node/_local/_nodes/NAME`, CouchDB's "Adding a node"), then
`POST /_cluster_setup {"action": "finish_cluster"}` creates the system databases and copies the
admin, uuid and secret to every node.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, cast
from urllib.parse import quote, urlsplit, urlunsplit

from aso.config import Config
from aso.local.stores import LocalCluster, LocalStore, LocalStoreError, Status
from aso.provision.store_check import ATTACHMENTS_CSP
from aso.store import Server, StoreError
from aso.store import admin as store_admin

DEFAULT_HOME = Path("/opt/couchdb")
PBKDF2_ITERATIONS = 600000  # CouchDB 3.4's own default for admins and _users

# ASO's CouchDB settings: deploy/couchdb/local.ini explains each (tests/test_deploy.py checks
# that this and local.ini agree). Per node and per config, `node_ini` adds the admin, paths,
# port, uuid, secret, cluster size and log.
SETTINGS: dict[str, dict[str, str]] = {
    "couchdb": {
        "max_document_size": "8000000",
        "os_process_timeout": "20000",
        "default_security": "admin_only",
        "users_db_security_editable": "true",
        "js_engine": "quickjs",
    },
    "chttpd": {
        "bind_address": "127.0.0.1",
        "require_valid_user": "false",
        "admin_only_all_dbs": "true",
        "max_http_request_size": "67108864",
        "authentication_handlers": (
            "{chttpd_auth, proxy_authentication_handler}, "
            "{chttpd_auth, cookie_authentication_handler}, "
            "{chttpd_auth, default_authentication_handler}"
        ),
    },
    "chttpd_auth": {
        "proxy_use_secret": "true",
        "hash_algorithms": "sha256, sha",
        "same_site": "strict",
    },
    "csp": {"attachments_enable": "true", "attachments_header_value": ATTACHMENTS_CSP},
    "cluster": {"q": "2"},
    "query_server_config": {"os_process_limit": "500", "os_process_soft_limit": "100"},
    "smoosh": {
        "db_channels": "upgrade_dbs,ratio_dbs,slack_dbs",
        "view_channels": "upgrade_views,ratio_views,slack_views",
    },
    "smoosh.ratio_dbs": {"priority": "ratio", "min_priority": "2.0", "concurrency": "1"},
    "smoosh.ratio_views": {"priority": "ratio", "min_priority": "2.0", "concurrency": "1"},
    "smoosh.slack_dbs": {"priority": "slack", "min_priority": "536870912"},
    "smoosh.slack_views": {"priority": "slack", "min_priority": "536870912"},
    "ken": {"batch_channels": "20", "incremental_channels": "80"},
}


def couchdb_home(config: Config) -> Path:
    """The CouchDB install to run: couchdb.home, else $COUCHDB_HOME, else /opt/couchdb."""
    if config.couchdb.home:
        return config.path(config.couchdb.home)
    if os.environ.get("COUCHDB_HOME"):
        return Path(os.environ["COUCHDB_HOME"]).expanduser().resolve()
    return DEFAULT_HOME


def check_home(home: Path) -> Path:
    """`home`/bin/couchdb, or a LocalStoreError that says where CouchDB was looked for."""
    program = home / "bin" / "couchdb"
    if not (program.is_file() and os.access(program, os.X_OK)):
        raise LocalStoreError(
            f"Apache CouchDB not found: no {program} (couchdb.home, else $COUCHDB_HOME, else "
            f"{DEFAULT_HOME}); install CouchDB 3 from Apache's packages or point couchdb.home at "
            "an install"
        )
    if not (home / "etc" / "default.ini").is_file():
        raise LocalStoreError(f"{home} has no etc/default.ini: not a CouchDB 3 install")
    return program


def hash_password(password: str, iterations: int = PBKDF2_ITERATIONS) -> str:
    """An [admins] entry CouchDB 3 accepts as already hashed (the form it writes back itself):
    the password never lands in an ini file in clear."""
    salt = secrets.token_hex(16)
    derived = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), iterations)
    return f"-pbkdf2:sha256-{derived.hex()},{salt},{iterations}"


def render_ini(sections: Mapping[str, Mapping[str, str]]) -> str:
    lines = ["; Written by ASO at every start of this node (aso/local/couchdb.py); edits are lost."]
    for section, values in sections.items():
        lines.append(f"\n[{section}]")
        for key, value in values.items():
            if " ;" in value or "\t;" in value or "\n" in value:
                # CouchDB cuts an ini value at " ;" (an inline comment).
                raise LocalStoreError(f"[{section}] {key}: a value may not hold ' ;' or newlines")
            lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


def node_url(url: str, index: int) -> str:
    """The URL of node `index` (1-based) of a local cluster whose first node is at `url`."""
    parts = urlsplit(url.rstrip("/"))
    port = (parts.port or 5984) + index - 1
    return urlunsplit((parts.scheme, f"{parts.hostname}:{port}", parts.path, "", ""))


class CouchDBNode(LocalStore):
    """One CouchDB node of the local store."""

    engine = "couchdb"
    program = "couchdb"

    def __init__(self, store: CouchDBStore, index: int, nodes: int):
        config = store.config
        super().__init__(
            config,
            node_url(config.store.url, index),
            store.root / f"node{index}",
            name=f"node{index}" if nodes > 1 else "",
        )
        self.store = store
        self.index = index
        self.nodes = nodes
        self.home = couchdb_home(config)

    @property
    def state(self) -> dict[str, Any]:
        """The store's identity (made by the first start of its first node)."""
        return self.store.state(create=True)

    @property
    def node_name(self) -> str:
        return str(self.state["names"][self.index - 1])

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "couchdb.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "couchdb.log"

    @property
    def ini_file(self) -> Path:
        return self.data_dir / "aso.ini"

    @property
    def args_file(self) -> Path:
        return self.data_dir / "vm.args"

    def start_timeout(self) -> float:
        return self.config.embedded.start_timeout

    def server_cwd(self) -> Path:
        return self.home  # bin/couchdb changes to it anyway

    def is_ours(self, argv: list[str]) -> bool:
        return any("beam" in a for a in argv[:1]) and str(self.ini_file) in argv

    def ini_files(self) -> list[Path]:
        """CouchDB's defaults, then this node's ini: never the install's local.ini (a system
        CouchDB's settings). CouchDB writes runtime changes to the last file."""
        defaults = sorted((self.home / "etc" / "default.d").glob("*.ini"))
        return [self.home / "etc" / "default.ini", *defaults, self.ini_file]

    def server_env(self) -> Mapping[str, str]:
        return {
            # Erlang reads the cookie from $HOME/.erlang.cookie: never on a command line,
            # where any local user would read it (and could then run code in the node).
            "HOME": str(self.data_dir),
            "COUCHDB_ARGS_FILE": str(self.args_file),
            # Space-separated: check_paths() refuses a data_dir with a space.
            "COUCHDB_INI_FILES": " ".join(map(str, self.ini_files())),
        }

    def check_startable(self) -> None:
        super().check_startable()
        check_home(self.home)
        if any(" " in str(path) for path in self.ini_files()):
            raise LocalStoreError(
                "CouchDB reads its ini files from a space-separated list: embedded.data_dir and "
                "couchdb.home may not contain a space"
            )

    def server_argv(self) -> list[str]:
        program = check_home(self.home)
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        write_private(self.ini_file, render_ini(self.node_ini()))
        write_private(self.args_file, self.vm_args())
        write_private(self.data_dir / ".erlang.cookie", str(self.state["cookie"]), mode=0o400)
        return [str(program)]

    def node_ini(self) -> dict[str, dict[str, str]]:
        config = self.config
        sections = {section: dict(values) for section, values in SETTINGS.items()}
        data = str(self.data_dir / "data")
        sections["couchdb"].update(
            single_node="true" if self.nodes == 1 else "false",
            database_dir=data,
            view_index_dir=data,
            uuid=self.state["uuid"],
            js_engine=config.couchdb.js_engine,
        )
        sections["chttpd"]["port"] = str(self.port)
        sections["chttpd_auth"]["secret"] = config.frontend.secret or self.state["secret"]
        sections["cluster"]["n"] = str(min(self.nodes, 3))
        sections["log"] = {"writer": "stderr", "level": config.couchdb.log_level}
        sections["admins"] = {config.store.admin_user: hash_password(config.store.admin_password)}
        return sections

    def vm_args(self) -> str:
        return "\n".join(
            [
                "# Written by ASO at every start of this node (aso/local/couchdb.py).",
                f"-name {self.node_name}",
                "-kernel inet_dist_use_interface {127,0,0,1}",
                "-kernel error_logger silent",
                "-sasl sasl_error_logger false",
                "-kernel prevent_overlapping_partitions false",
                "+Bd -noinput",
                "-os_mon start_cpu_sup false",
                "-os_mon start_memsup false",
                "",
            ]
        )

    def ensure_admin(self) -> None:
        """The configured admin works; a single node has also made its system databases
        (`single_node = true` creates them a moment after the node first answers: accounts
        cannot be written before)."""
        if not self.admin_works():
            raise LocalStoreError(
                f"store.admin_user/admin_password are not an admin of the CouchDB node in "
                f"{self.data_dir}: {self.log_tail()}"
            )
        if self.nodes > 1:
            return  # join_cluster's finish_cluster makes them
        admin = self.admin()
        deadline = time.monotonic() + self.start_timeout()
        while not (_exists(admin, "_users") and _exists(admin, "_replicator")):
            if time.monotonic() > deadline:
                raise LocalStoreError(f"CouchDB made no _users database: {self.log_tail()}")
            time.sleep(0.1)


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write a file readable by its owner only (it holds a password hash or a cookie)."""
    path.unlink(missing_ok=True)  # a read-only one (the cookie) is replaced, not opened
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


class CouchDBStore:
    """The local CouchDB of a config: its state file and its nodes."""

    def __init__(self, config: Config, nodes: int | None = None):
        self.config = config
        self.root = config.path(config.embedded.data_dir) / "couchdb"
        self.state_file = self.root / "store.json"
        self.requested = nodes
        self._state: dict[str, Any] | None = None

    def _read_state(self) -> dict[str, Any] | None:
        try:
            return cast(dict[str, Any], json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise LocalStoreError(f"cannot read {self.state_file}: {exc}") from None

    def size(self) -> int:
        """Nodes of this store: as created, else as asked (--nodes, couchdb.nodes)."""
        state = self._state or self._read_state()
        if state is None:
            return self.requested or self.config.couchdb.nodes
        size = len(state["names"])
        if self.requested is not None and self.requested != size:
            raise LocalStoreError(
                f"the CouchDB store in {self.root} has {size} node(s); it cannot be started "
                f"with {self.requested} (another embedded.data_dir makes a new one)"
            )
        return size

    def state(self, *, create: bool) -> dict[str, Any]:
        """Node names, Erlang cookie, uuid and secret: made once, kept for the store's life
        (shard maps name the nodes; renaming one loses its shards)."""
        if self._state is None:
            self._state = self._read_state()
        if self._state is None:
            if not create:
                raise LocalStoreError(f"no CouchDB store in {self.root} yet")
            self._state = self._new_state()
        return self._state

    def _new_state(self) -> dict[str, Any]:
        size = self.size()
        port = urlsplit(self.config.store.url).port or 5984
        tag = secrets.token_hex(3)
        state = {
            "names": [f"aso{port}{tag}n{i}@127.0.0.1" for i in range(1, size + 1)],
            "cookie": secrets.token_urlsafe(24),
            "uuid": secrets.token_hex(16),
            "secret": secrets.token_hex(32),
        }
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        write_private(self.state_file, json.dumps(state, indent=1) + "\n")
        return state

    def nodes(self) -> list[CouchDBNode]:
        size = self.size()
        return [CouchDBNode(self, i, size) for i in range(1, size + 1)]


class CouchDBCluster(LocalCluster):
    """A local CouchDB cluster: several nodes on loopback, joined into one store."""

    engine = "couchdb"

    def __init__(self, store: CouchDBStore):
        self.config = store.config
        self.store = store
        self.url = store.config.store.url.rstrip("/")
        self.data_dir = store.root
        self.members = store.nodes()

    def statuses(self) -> list[Status]:
        return [node.status() for node in self.members]

    def start(self) -> str:
        lines = [node.start() for node in self.members]
        admin = self.members[0].admin(retries=3)
        lines.extend(join_cluster(admin, [node.node_name for node in self.members[1:]]))
        return "\n".join(lines)

    def stop(self, timeout: float = 30.0) -> str:
        return "\n".join(node.stop(timeout) for node in self.members)

    def serve(self) -> NoReturn:
        raise LocalStoreError(
            "--foreground runs one process: a cluster of local nodes is started with "
            "`aso store start` (under systemd, run one CouchDB unit per node instead)"
        )

    def node(self, index: int) -> CouchDBNode:
        return self.members[index - 1]


def local_couchdb(config: Config, nodes: int | None = None) -> CouchDBNode | CouchDBCluster:
    """The local CouchDB of a config: its one node, or the cluster its data directory holds
    (or `nodes`, else couchdb.nodes, asks a new one to have)."""
    store = CouchDBStore(config, nodes)
    if store.size() > 1:
        return CouchDBCluster(store)
    return store.nodes()[0]


# --- joining nodes into a cluster ----------------------------------------------------------------
def join_cluster(admin: Server, others: Sequence[str], timeout: float = 60.0) -> list[str]:
    """Make the node `admin` talks to and `others` (Erlang node names) one cluster, as
    deploy/README.md describes: each node already has the same admin, secret and cookie (its
    ini and vm.args); this node adds the others to its `_nodes` database, waits until every
    node is connected, then `finish_cluster` creates the system databases (and copies the
    admin, uuid and secret to every node). Idempotent: what is done already is skipped.
    Returns what it did, one line each."""
    lines = []
    membership = store_admin.membership(admin)
    for name in others:
        if name not in membership.get("cluster_nodes", []):
            try:
                admin.raw("PUT", f"/_node/_local/_nodes/{quote(name, safe='')}", body={})
                lines.append(f"added node {name}")
            except StoreError as exc:
                if exc.status != 409:  # 409: added already
                    raise
    wanted = {admin.raw("GET", "/_node/_local").get("name"), *others}
    deadline = time.monotonic() + timeout
    while True:
        membership = store_admin.membership(admin)
        connected = set(membership.get("all_nodes", []))
        if wanted <= connected and wanted <= set(membership.get("cluster_nodes", [])):
            break
        if time.monotonic() > deadline:
            raise LocalStoreError(
                f"cluster nodes not connected after {timeout:.0f} s: "
                f"{sorted(wanted - connected)} (membership {membership})"
            )
        time.sleep(0.5)
    if not (_exists(admin, "_users") and _exists(admin, "_replicator")):
        answer = admin.raw("POST", "/_cluster_setup", body={"action": "finish_cluster"})
        if answer.get("ok"):
            lines.append(f"cluster of {len(wanted)} nodes finished (system databases created)")
    return lines


def _exists(admin: Server, name: str) -> bool:
    return admin.db(name).exists()
