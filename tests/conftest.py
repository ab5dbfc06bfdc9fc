"""Fixtures: a real document store on a free loopback port, started once per test session
through ASO's own local-store manager (aso/local/stores.py) and stopped afterwards, and fresh
databases and accounts on it for each test module.

The store is the engine `ASO_TEST_STORE` names: `pouchdb` (the embedded pouchdb-server, the
default) or `couchdb` (Apache CouchDB 3 from $COUCHDB_HOME, else /opt/couchdb). `make test`
runs the whole suite once on each (docs/testing.md). A test that holds for one engine only
says so with `@only_on("couchdb")` or `@only_on("pouchdb")` and why."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from aso import model
from aso.config import Config
from aso.local.managed import local_store
from aso.local.stores import LocalCluster, LocalStore, distinct_free_ports, free_port
from aso.local.xrootd import EmbeddedStorage
from aso.provision.designdocs import init_catalog_db, init_databases
from aso.provision.storejs import owner_refusal
from aso.sites import simulated
from aso.store import Database, Server, Settings
from aso.store import admin as store_admin
from tests.storage_helpers import Watchdog, reachable_tmp_dir, storage_config

ARTEFACTS = Path(__file__).parent / "artefacts"
ENGINE = os.environ.get("ASO_TEST_STORE", "pouchdb")
if ENGINE not in ("pouchdb", "couchdb"):
    raise SystemExit(f"ASO_TEST_STORE must be pouchdb or couchdb, not {ENGINE!r}")
# CouchDB's JavaScript engine (couchdb.js_engine): `make test` runs the whole suite on quickjs,
# ASO's default, then the tests of the store's own JavaScript (validation, views) again on
# spidermonkey, CouchDB's default: ASO's functions must work on both.
JS_ENGINE = os.environ.get("ASO_TEST_JS_ENGINE", "quickjs")
if JS_ENGINE not in ("quickjs", "spidermonkey"):
    raise SystemExit(f"ASO_TEST_JS_ENGINE must be quickjs or spidermonkey, not {JS_ENGINE!r}")


def only_on(engine: str, why: str) -> pytest.MarkDecorator:
    """A test of a feature one store engine has and the other has not (`why` says which)."""
    return pytest.mark.skipif(engine != ENGINE, reason=f"{engine} only: {why}")


def make_config(tmp: Path, port: int, **store: Any) -> Config:
    config = Config(source=tmp / "aso.toml")
    config.store.engine = ENGINE
    config.store.url = f"http://127.0.0.1:{port}"
    config.store.admin_password = secrets.token_urlsafe(12)
    config.store.agent_password = secrets.token_urlsafe(12)
    config.store.retries = 2
    config.store.backoff = 0.1
    config.embedded.data_dir = str(tmp / "store")
    config.couchdb.js_engine = JS_ENGINE
    for key, value in store.items():
        setattr(config.store, key, value)
    return config


def write_config(config: Config) -> Path:
    from aso.config import render

    assert config.source is not None
    config.source.write_text(render(config, show_secrets=True))
    return config.source


@contextlib.contextmanager
def own_store(tmp: Path, **store: Any) -> Iterator[tuple[Config, LocalStore | LocalCluster]]:
    """A store of its own (the engine under test) on a free port, data under `tmp`, stopped at
    the end."""
    config = make_config(tmp, free_port(), **store)
    write_config(config)
    local = local_store(config)
    local.start()
    try:
        yield config, local
    finally:
        local.stop()


@pytest.fixture(scope="session")
def store_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Config]:
    """The session's store; its config (admin credentials included). Its catalogue is the
    default one and, as simulated sites, the other sites the tests name (SIM_SITES)."""
    with own_store(tmp_path_factory.mktemp("store")) as (config, _):
        config.sites.update(simulated(s for s in SIM_SITES if s not in config.sites))
        yield config


@pytest.fixture(scope="session")
def admin(store_config: Config) -> Server:
    return Server.from_config(store_config, account="admin")


PASSWORD = "pw-" + secrets.token_hex(6)
_counter = itertools.count()


# The store accounts of the `accounts` fixture and their roles.
ACCOUNT_ROLES: dict[str, list[str]] = {
    "alice": [model.USER_ROLE],
    "bob": [model.USER_ROLE],
    "agent": [model.AGENT_ROLE],
    "operator": ["aso-admin"],
    "stranger": [],
    "hugo": [model.USER_ROLE, f"{model.GROUP_ROLE}higgs"],  # granted /store/group/higgs/
}


@pytest.fixture(scope="session")
def accounts(admin: Server) -> dict[str, Server]:
    """Store accounts by role: alice and bob (aso-user), agent (aso-agent), operator (aso-admin),
    stranger (no ASO role), hugo (aso-user with the group area of higgs), anonymous."""
    servers = {}
    for name, role_list in ACCOUNT_ROLES.items():
        store_admin.put_user(admin, name, PASSWORD, role_list)
        servers[name] = Server(admin.url, name, PASSWORD, Settings(retries=1, backoff=0.1))
    servers["anonymous"] = Server(admin.url, settings=Settings(retries=1, backoff=0.1))
    servers["admin"] = admin
    return servers


@pytest.fixture(scope="module")
def files_db(admin: Server, store_config: Config) -> Iterator[str]:
    """A freshly initialised files database (name) for one test module."""
    name = f"asynctransfer_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    config = dataclasses.replace(
        store_config, store=dataclasses.replace(store_config.store, files_db=name)
    )
    init_databases(admin, config)
    yield name
    store_admin.delete_db(admin, name)


def db_as(accounts: dict[str, Server], who: str, name: str) -> Database:
    return accounts[who].db(name)


_lfn_counter = itertools.count()


def sample_request(user: str = "alice", **overrides: Any) -> dict[str, Any]:
    """A valid new request with a unique source LFN."""
    n = next(_lfn_counter)
    token = f"{os.getpid()}_{n}_{uuid.uuid4().hex[:8]}"
    args: dict[str, Any] = dict(
        user=user,
        task=f"261121_120000:{user}_crab_test",
        job_id=str(n),
        source="T2_CH_CERN",
        destination="T2_DE_DESY",
        source_lfn=f"/store/temp/user/{user}.abc/prim/proc/0000/out_{token}.root",
        destination_lfn=f"/store/user/{user}/prim/proc/0000/out_{token}.root",
        size=1000 + n,
        adler32="0a1b2c3d",
    )
    args.update(overrides)
    return owned_request(**args)


def owned_request(**fields: Any) -> dict[str, Any]:
    """model.request_of(**fields), refused (Refusal) if its owner may not record it (another
    user's task, a priority above the owner's: lib/owner.js) but not judged by the schema: a
    test may build a document the store is to refuse."""
    doc = model.request_of(**fields)
    refused = owner_refusal(doc)
    if refused is not None:
        raise refused
    return doc


# The sites of the sim back end's tests: simulated sites (protocol sim), which the store knows.
SIM_SITES = ("T1_DE_KIT", "T1_US_FNAL", "T2_CH_CERN", "T2_DE_DESY", "T2_ES_PIC", "T2_FR_GRIF",
             "T2_IT_Bari", "T2_IT_Pisa", "T2_UK_ICL", "T2_UK_London", "T2_US_MIT",
             "T2_US_Nebraska")  # fmt: skip


@pytest.fixture()
def sim_config(store_config: Config, admin: Server, tmp_path: Path) -> Iterator[Config]:
    """A fresh files and jobs database with the sim back end (fast, fixed transfer times)."""
    with fresh_sim_config(store_config, admin, tmp_path) as config:
        yield config


@contextlib.contextmanager
def fresh_sim_config(store_config: Config, admin: Server, tmp_path: Path) -> Iterator[Config]:
    """sim_config's databases and settings, for a fixture of a wider scope."""
    config = sim_settings(store_config, tmp_path)
    init_databases(admin, config)
    yield config
    store_admin.delete_db(admin, config.store.files_db)
    store_admin.delete_db(admin, config.store.transfers_db)
    store_admin.delete_db(admin, config.store.pages_db)
    store_admin.delete_db(admin, config.store.notify_db)


def sim_settings(store_config: Config, tmp_path: Path) -> Config:
    """`store_config` with databases of their own and the sim back end's settings (the store
    itself untouched: the real store's fixtures and the in-memory store's share this)."""
    suffix = uuid.uuid4().hex[:8]
    return dataclasses.replace(
        store_config,
        source=tmp_path / "aso.toml",
        store=dataclasses.replace(
            store_config.store,
            files_db=f"files_{suffix}",
            transfers_db=f"jobs_{suffix}",
            pages_db=f"pages_{suffix}",
            notify_db=f"notify_{suffix}",
        ),
        transfer=dataclasses.replace(
            store_config.transfer, backend="sim", max_files_per_job=10, lease=4.0
        ),
        sites=simulated(SIM_SITES),
        sim=dataclasses.replace(store_config.sim, mean_duration=0.3, distribution="fixed"),
        agents=dataclasses.replace(
            store_config.agents, poll_interval=0.2, heartbeat_interval=0.5, heartbeat_expiry=3.0
        ),
    )


@pytest.fixture()
def pub_config(sim_config: Config, admin: Server) -> Iterator[Config]:
    """sim_config with a catalog of its own, blocks of 4 files and a short publication backoff."""
    config = pub_settings(sim_config)
    init_catalog_db(admin, config.store.catalog_db)
    yield config
    store_admin.delete_db(admin, config.store.catalog_db)


def pub_settings(sim_config: Config) -> Config:
    """pub_config's catalog database (its name) and publisher settings."""
    return dataclasses.replace(
        sim_config,
        store=dataclasses.replace(
            sim_config.store, catalog_db=f"catalog_{sim_config.store.files_db}"
        ),
        publisher=dataclasses.replace(
            sim_config.publisher, max_files_per_block=4, block_closure_timeout=3600, base_delay=0.1
        ),
    )


# The sites of the storage tests: two sources and a destination.
SOURCES, DESTINATION = ("T2_CH_CERN", "T2_IT_Pisa"), "T2_DE_DESY"


@pytest.fixture(scope="module")
def watchdog() -> Iterator[Watchdog]:
    with reachable_tmp_dir() as base:
        # HTTPS, as the default embedded sites (plain HTTP is anonymous: refused). XRootD
        # 5.5.3 has segfaulted in libssl under concurrent HTTPS third-party copies: the
        # watchdog starts a dead site again, as `aso run` does.
        config = storage_config(base, [*SOURCES, DESTINATION], protocol="https")
        embedded = EmbeddedStorage(config)
        embedded.start()
        dog = Watchdog(embedded)
        dog.start()
        try:
            yield dog
        finally:
            dog.done.set()
            dog.join()
            embedded.stop()


@pytest.fixture()
def storage(watchdog: Watchdog) -> Config:
    return watchdog.storage.config


@pytest.fixture()
def gfal_config(
    store_config: Config, storage: Config, admin: Server, tmp_path: Path
) -> Iterator[Config]:
    suffix = uuid.uuid4().hex[:8]
    config = dataclasses.replace(
        store_config,
        source=tmp_path / "aso.toml",
        store=dataclasses.replace(
            store_config.store,
            files_db=f"files_{suffix}",
            transfers_db=f"jobs_{suffix}",
            pages_db=f"pages_{suffix}",
        ),
        sites=storage.sites,
        storage=storage.storage,
        frontend=dataclasses.replace(
            store_config.frontend,
            capath=storage.frontend.capath,
            host_cert=storage.frontend.host_cert,
            host_key=storage.frontend.host_key,
            mapfile=storage.frontend.mapfile,
        ),
        transfer=dataclasses.replace(
            store_config.transfer, backend="gfal", max_files_per_job=25, lease=6.0
        ),
        gfal=dataclasses.replace(
            store_config.gfal,
            workers=8,
            poll_interval=0.2,
            timeout=60,
            retry_delay=0.5,
            x509_cert=storage.gfal.x509_cert,
            x509_key=storage.gfal.x509_key,
        ),
        agents=dataclasses.replace(
            store_config.agents, poll_interval=0.2, heartbeat_interval=0.5, heartbeat_expiry=3.0
        ),
    )
    init_databases(admin, config)
    yield config
    store_admin.delete_db(admin, config.store.files_db)
    store_admin.delete_db(admin, config.store.transfers_db)


def preloaded_cli(
    config: Config,
    commands: dict[str, Any] | None = None,
    typers: dict[str, Any] | None = None,
) -> typer.Typer:
    """`aso` commands and sub-apps mounted as aso/cli/__init__.py mounts them, on a preloaded
    config."""
    app = typer.Typer()

    @app.callback()
    def main(ctx: typer.Context) -> None:
        ctx.obj = {"config_file": None, "verbose": False, "config": config}

    for name, command in (commands or {}).items():
        app.command(name)(command)
    for name, sub in (typers or {}).items():
        app.add_typer(sub, name=name)
    return app


@pytest.fixture()
def agents_in_background(pub_config: Config) -> Iterator[None]:
    """The pipeline's agents (submitter, monitor, retry manager, cleaner, publisher; sim back
    end, the embedded catalog) stepping in a thread of their own for the whole test, as a
    service runs beside its clients (tests/test_status_client.py, whose own code may not
    import ASO)."""
    import threading

    from aso.agents.cleaner import Cleaner
    from aso.agents.monitor import Monitor
    from aso.agents.publisher import Publisher
    from aso.agents.retry_manager import RetryManager
    from aso.agents.submitter import Submitter
    from aso.runtime import Runner

    runners = [Runner(agent) for agent in (
        Submitter(pub_config, "s1"), Monitor(pub_config, "m1"),
        RetryManager(pub_config, "r1"), Cleaner(pub_config, "c1"), Publisher(pub_config, "p1"),
    )]  # fmt: skip
    for runner in runners:
        runner.workset.start()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            for runner in runners:
                runner.step(wait=False)
            stop.wait(0.1)

    thread = threading.Thread(target=loop, name="agents", daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(60)
    for runner in runners:
        runner.agent.close()


@contextlib.contextmanager
def running_frontend(config: Config) -> Iterator[str]:
    """`aso frontend` on `config` (written next to its source) in a process of its own, as an
    operator runs it, until the block ends; its URL. Its log is `frontend.log` beside the
    config."""
    assert config.source is not None
    write_config(config)
    log = config.source.parent / "frontend.log"
    aso = Path(sys.executable).parent / "aso"
    with open(log, "w") as out:
        process = subprocess.Popen([str(aso), "--config", str(config.source), "frontend"],
                                   stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "listening" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield f"https://{config.frontend.listen}"
    finally:
        process.terminate()
        process.wait(30)


@dataclasses.dataclass(frozen=True)
class FrontDoor:
    """What a user of the status API is handed (docs/status-api.md, docs/frontend.md): the
    front end's address, the CA that signed its certificate, the user's proxy (certificate,
    key and chain in one file, as voms-proxy-init writes it), the name the grid-mapfile maps
    it to, the files database and the catalogue's site names."""

    url: str
    ca_file: str
    proxy: str
    user: str
    db: str
    sites: tuple[str, ...]


FRONT_DOOR_USER = "wendy"  # no store account of the `accounts` fixture: the front end's own


@pytest.fixture()
def front_door(pub_config: Config, tmp_path: Path) -> Iterator[FrontDoor]:
    """A real X.509 front end (`aso frontend`, its own process and PKI) before the test's files
    database, and a proxy of a user its grid-mapfile maps."""
    from aso.local.pki import Pki

    pki = Pki.create(tmp_path / "pki")
    user = pki.user(FRONT_DOOR_USER)
    (pki.root / "grid-mapfile").write_text(f'"{user.dn}" {FRONT_DOOR_USER}\n')
    port, metrics_port = distinct_free_ports(2)
    config = dataclasses.replace(
        pub_config,
        source=tmp_path / "frontend" / "aso.toml",
        frontend=dataclasses.replace(
            pub_config.frontend, listen=f"127.0.0.1:{port}", host_cert=str(pki.host_cert),
            host_key=str(pki.host_key), capath=str(pki.capath),
            mapfile=str(pki.root / "grid-mapfile"), secret=secrets.token_urlsafe(16),
        ),
        metrics=dataclasses.replace(pub_config.metrics, frontend_port=metrics_port),
    )  # fmt: skip
    config.source.parent.mkdir()
    with running_frontend(config) as url:
        yield FrontDoor(url, str(pki.ca_file), str(pki.proxy_file(user)), FRONT_DOOR_USER,
                        pub_config.store.files_db, tuple(sorted(pub_config.sites)))  # fmt: skip
