"""`aso sim`: the lifecycle simulator (after PhEDEx's LifeCycle agent in the paper).

One run, start to end:

1. a workspace (`var/sim/<run>/`) with a config of its own: the `sim` transfer back end, the
   embedded catalog, the simulated durations of the plan divided by its compression, and a
   local store of its own on free loopback ports (`--engine pouchdb|couchdb`, `--nodes N` for
   a CouchDB cluster whose agent hosts each talk to one node) or `--store-url` (fresh databases
   of their own);
2. the store and its databases, optionally the store's bulk-write ceiling measured on a scratch
   database with ASO's design documents (the same store, the same run);
3. every agent as in production: `aso run --agents-only` supervising one process per instance;
4. injections every `plan.interval` simulated seconds through the job wrappers' upload path
   (`aso.upload.upload`, one call per job, from a pool of uploader threads), with a live
   progress display fed by the monitoring summaries (`monitor:live`);
5. a drain: injection stops and the run waits until every injected file is final;
6. the agents stop, every document is read once from the `_changes` feed and the report is
   computed from the documents themselves (sim/report.py): the accounting check, per-bucket
   figures, latencies, the store's write rate and each process's CPU share.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, urlsplit, urlunsplit

import psutil
import requests
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from aso import model, sites
from aso.catalog.embedded import SETTLE_EVERY, SETTLE_LOOKS
from aso.config import Config, render
from aso.local.couchdb import node_url
from aso.local.managed import local_store
from aso.local.stores import LocalCluster, LocalStore, free_ports
from aso.monitoring import summaries
from aso.provision.designdocs import FILES_SECURITY, design_documents, init_databases
from aso.sim.chaos import Chaos, ChaosLog, ChaosPlan, chaos_outages
from aso.sim.held import hold_spans, quota_figures
from aso.sim.profile import StoreProfiler
from aso.sim.report import (
    Analysis,
    Report,
    Sample,
    account,
    check_catalog,
    check_copies,
    percentiles,
    recheck_catalog,
    recheck_twice,
    warmup_of,
    work_by_host,
)
from aso.sim.workload import Plan, Workload, injections, site_names
from aso.store import NotFound, Server, StoreError
from aso.store import admin as store_admin
from aso.transfer.jobstore import JOB_TYPE
from aso.transfer.sim import SimService
from aso.transfer.sim_quota import byte_quotas, ledger_id
from aso.upload import upload

log = logging.getLogger("aso.sim")

AGENTS = (
    "submitter",
    "monitor",
    "retry-manager",
    "cleaner",
    "publisher",
    "analytics",
    "hold-checker",
    "notifier",
)
HOST_ID = "sim"
DATABASES = ("files_db", "transfers_db", "catalog_db", "stats_db")
SHORT_DB = {
    "files_db": "files",
    "transfers_db": "jobs",
    "catalog_db": "catalog",
    "stats_db": "stats",
}
START_TIMEOUT = 120.0
STOP_GRACE = 60.0
UPLOAD_BACKOFF = (0.5, 5.0)  # first and longest wait between two tries of one upload


@dataclass
class RunOptions:
    workdir: Path
    store_url: str | None = None  # an external store (admin credentials in the URL)
    engine: str = "pouchdb"  # the local store's engine (store.engine), when not store_url
    nodes: int = 1  # engine couchdb: nodes of the local store (a cluster on loopback)
    instances: dict[str, int] = field(default_factory=lambda: dict.fromkeys(AGENTS, 1))
    uploaders: int = 8
    sample_every: float = 5.0  # wall seconds between two samples of the store and processes
    drain_timeout: float = 900.0  # wall seconds the drain may take
    bucket: float | None = None  # simulated seconds per report row (default: fits the run)
    measure_ceiling: bool = True
    ceiling_docs: int = 10_000
    keep_store: bool = False  # leave the embedded store running after the run
    drop_databases: bool = False  # an external store: delete the run's databases at the end
    log_level: str = "INFO"
    progress: bool = True
    hosts: int = 1  # agent hosts: `aso run --agents-only` processes, each with every agent
    chaos: ChaosPlan | None = None  # faults during the injection (sim/chaos.py)
    upload_patience: float = 180.0  # wall seconds a job's upload keeps being retried
    # What makes this run's LFNs unique (default: the time and a random tag). A fixed one on a
    # fresh store gives every run of one plan the same requests, and so, with the plan's seed,
    # the same fates for each attempt (make bench: runs of two commits side by side).
    run_token: str | None = None
    # A store prepared before (sim/bench_long.py: 1M finished requests, their summaries and
    # view indexes): its data directory is copied into the workspace and run with its admin
    # password. The report then reads the run's own requests by id, not the whole store.
    store_data: Path | None = None
    store_admin_password: str | None = None
    # Profile the store over the injection after its warm-up (sim/profile.py): the embedded
    # store's CPU profile, or CouchDB's own counters.
    profile_store: bool = False
    # The service's own timings (None: production's defaults). Short ones let a short run see a
    # dead host's leases and partitions pass on.
    lease: float | None = None  # transfer.lease
    heartbeat_expiry: float | None = None  # agents.heartbeat_expiry
    blocks_per_call: int | None = None  # publisher.blocks_per_call (make bench-long's A/B)


def sim_config(plan: Plan, options: RunOptions) -> Config:
    """The workspace's configuration: production defaults, the sim back end, the plan's
    simulated durations in wall seconds."""
    workdir = options.workdir.resolve()
    config = Config(source=workdir / "aso.toml")
    store, wall = config.store, plan.wall
    if options.store_url:
        parts = urlsplit(options.store_url)
        store.url = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], "", "", ""))
        store.admin_user = parts.username or "admin"
        store.admin_password = parts.password or ""
        suffix = f"_sim{uuid.uuid4().hex[:8]}"
        for name in DATABASES:
            setattr(store, name, getattr(store, name) + suffix)
        # An agent account of its own: never change the password of the store's real one.
        store.agent_user = f"aso-agent{suffix.replace('_', '-')}"
    else:
        store.engine = options.engine
        store.url = f"http://127.0.0.1:{free_ports(options.nodes)}"
        store.admin_password = options.store_admin_password or secrets.token_urlsafe(12)
        config.embedded.data_dir = str(workdir / "store")
        config.couchdb.nodes = options.nodes
    store.agent_password = secrets.token_urlsafe(12)
    config.log.level = options.log_level
    config.transfer.backend = "sim"
    config.sites = sites.simulated(site_names(plan.sites))
    config.sim.mean_duration = wall(plan.mean_duration)
    config.sim.distribution = plan.distribution
    config.sim.failure_rate = plan.failure_rate
    config.sim.seed = plan.seed
    config.sim.timeout = wall(plan.transfer_timeout)
    config.sim.outages = [
        {**o, "start": wall(float(o["start"])), "end": wall(float(o["end"]))} for o in plan.outages
    ]
    config.retry.base_delay = wall(plan.retry_delay)
    config.retry.max_delay = wall(3600.0)
    # Holds run on simulated time too: a look a simulated minute after a hold starts, then
    # every few, the breaker's window and the holds' deadline as the service's.
    config.holds.first_check = wall(60.0)
    config.holds.max_check_interval = wall(600.0)
    config.holds.interval = min(config.holds.interval, wall(60.0))
    config.holds.breaker_window = wall(config.holds.breaker_window)
    config.holds.deadline = wall(config.holds.deadline)
    config.holds.look_timeout = max(1.0, wall(config.holds.look_timeout))
    # The submitter's admission asks a destination's room again on simulated time too (a size
    # limit fills up as copies land).
    config.holds.space_refresh = wall(config.holds.space_refresh)
    config.cleaner.base_delay = wall(60.0)
    config.cleaner.max_delay = wall(3600.0)
    config.publisher.block_closure_timeout = wall(plan.block_timeout)
    if options.blocks_per_call is not None:
        config.publisher.blocks_per_call = options.blocks_per_call
    config.publisher.base_delay = wall(60.0)
    config.publisher.max_delay = wall(3600.0)
    # The report reads every document at the end: nothing may be purged during the run.
    config.analytics.purge_after = 0.0
    config.analytics.summary_interval = min(config.analytics.summary_interval, 5.0)
    config.agents.instances = dict(options.instances)
    if options.lease is not None:
        config.transfer.lease = options.lease
    if options.heartbeat_expiry is not None:
        config.agents.heartbeat_expiry = options.heartbeat_expiry
        config.agents.heartbeat_interval = min(
            config.agents.heartbeat_interval, options.heartbeat_expiry / 4
        )
    config.agents.log_dir = str(workdir / "log")
    return config


# -- the store's ceiling -------------------------------------------------------------------------
def measure_write_ceiling(admin: Server, config: Config, docs: int, writers: int = 2) -> float:
    """New request documents per second that bulk writes of 500 get into a scratch database
    with ASO's design documents (the same validation as the files database), from `writers`
    concurrent clients: what the store can take at most in this run."""
    name = f"{config.store.files_db}_ceiling"
    store_admin.create_db(admin, name, FILES_SECURITY)
    db = admin.db(name)
    for ddoc in design_documents(config):
        store_admin.push_design(db, ddoc)
    token = uuid.uuid4().hex[:8]
    batches = [
        [
            model.request_of(
                user="ceiling",
                task=model.task_name("ceiling", f"ceiling_{token}"),
                job_id=str(i),
                source="T2_SM_Site000",
                destination="T2_SM_Site001",
                source_lfn=f"/store/temp/user/ceiling/{token}/{i}.root",
                destination_lfn=f"/store/user/ceiling/{token}/{i}.root",
                size=1000,
                adler32="00000001",
                publish=True,
                publish_info={"dataset": f"/Ceiling/ceiling-{token}/USER"},
            )
            for i in range(start, min(docs, start + 500))
        ]
        for start in range(0, docs, 500)
    ]
    started = time.monotonic()
    with ThreadPoolExecutor(writers) as pool:
        written = sum(pool.map(lambda b: sum(r.ok for r in db.bulk_write(b)), batches))
    rate = written / (time.monotonic() - started)
    store_admin.delete_db(admin, name)
    return rate


# -- the service under test ----------------------------------------------------------------------
def host_ids(hosts: int) -> list[str]:
    """`sim`, then `sim2`, `sim3`…: instances are named `<host>-<slot>`."""
    return [HOST_ID] + [f"{HOST_ID}{k}" for k in range(2, hosts + 1)]


class Service:
    """The store (a local one of its own, unless external) and `aso run --agents-only` over it,
    once per agent host. On a local cluster agent host k talks to node k (round robin), as
    agent hosts of a production cluster each have their own `store.url`."""

    def __init__(self, config: Config, options: RunOptions):
        self.config, self.options = config, options
        self.local: LocalStore | LocalCluster | None = None
        if not options.store_url:
            self.local = local_store(config, nodes=options.nodes)
        self.supervisors: dict[str, subprocess.Popen[bytes]] = {}
        self.admin = Server.from_config(config, account="admin")

    def start_store(self) -> None:
        if self.local is not None:
            prepared = self.options.store_data
            if prepared is not None:
                data_dir = self.config.path(self.config.embedded.data_dir)
                shutil.rmtree(data_dir, ignore_errors=True)
                shutil.copytree(prepared, data_dir, symlinks=True)
                for stale in data_dir.rglob("*.pid"):
                    stale.unlink()
            log.info(self.local.start())
        init_databases(self.admin, self.config)

    def node_of(self, host_index: int) -> int:
        """The node (1-based) agent host `host_index` (0-based) talks to."""
        return host_index % self.options.nodes + 1

    def host_config(self, host_index: int, host: str) -> Path:
        """The config file of one agent host: the run's, with its node's store.url."""
        config_file = self.config.source
        assert config_file is not None
        if self.options.nodes == 1:
            return config_file
        url = node_url(self.config.store.url, self.node_of(host_index))
        own = dataclasses.replace(
            self.config, store=dataclasses.replace(self.config.store, url=url)
        )
        path = config_file.with_name(f"aso-{host}.toml")
        path.write_text(render(own, show_secrets=True))
        path.chmod(0o600)
        return path

    def start_agents(self) -> None:
        for index, host in enumerate(host_ids(self.options.hosts)):
            config_file = self.host_config(index, host)
            log_file = self.options.workdir / f"aso-run-{host}.log"
            argv = [sys.executable, "-m", "aso", "--config", str(config_file), "run"]
            argv += ["--agents-only", "--host-id", host]
            with open(log_file, "ab") as out:
                self.supervisors[host] = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
        self._wait_for_heartbeats()

    def _wait_for_heartbeats(self) -> None:
        """Every planned instance beat once: the agents are up and following the feed."""
        db = self.admin.db(self.config.store.files_db)
        wanted = {
            model.heartbeat_id(agent, f"{host}-{slot}")
            for host in self.supervisors
            for agent, n in self.config.agents.instances.items()
            for slot in range(n)
        }
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if all(db.get_many(wanted).values()):
                return
            if any(p.poll() is not None for p in self.supervisors.values()):
                break
            time.sleep(0.5)
        raise RuntimeError(
            f"the agents did not start in {START_TIMEOUT:.0f} s: see {self.options.workdir}/log"
        )

    def store_pids(self) -> dict[str, int]:
        """ "store" (or "store node2"...) → pid of each local store process that runs; for an
        external store on this host, the process listening on its port."""
        if self.local is None:
            pid = listening_pid(self.config.store.url)
            return {"store": pid} if pid else {}
        if isinstance(self.local, LocalCluster):
            statuses = self.local.statuses()
            return {f"store {s.name}": s.pid for s in statuses if s.pid}
        pid = self.local.status().pid
        return {"store": pid} if pid else {}

    def processes(self) -> dict[str, psutil.Process]:
        """Name → process of the store, every agent process and the simulator itself."""
        found: dict[str, psutil.Process] = {"simulator": psutil.Process()}
        for name, pid in self.store_pids().items():
            with contextlib.suppress(psutil.Error):
                found[name] = psutil.Process(pid)
        return found | self.agent_processes()

    def agent_processes(self) -> dict[str, psutil.Process]:
        """ "AGENT INSTANCE" → process, for every host's running agents."""
        found: dict[str, psutil.Process] = {}
        for supervisor in self.supervisors.values():
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(supervisor.pid).children():
                    with contextlib.suppress(psutil.Error):
                        argv = child.cmdline()
                        if "agent" in argv:
                            at = argv.index("agent")
                            found[f"{argv[at + 1]} {argv[at + 3]}"] = child
        return found

    def stop_agents(self) -> None:
        for supervisor in self.supervisors.values():
            if supervisor.poll() is None:
                supervisor.send_signal(signal.SIGTERM)
        for host, supervisor in self.supervisors.items():
            try:
                supervisor.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                log.warning("the agents' supervisor of %s did not stop: killed", host)
                with contextlib.suppress(psutil.Error):
                    for child in psutil.Process(supervisor.pid).children(recursive=True):
                        child.kill()
                supervisor.kill()
                supervisor.wait()

    def stop(self) -> None:
        self.stop_agents()
        if self.local is not None and not self.options.keep_store:
            self.local.stop()
        if self.local is None and self.options.drop_databases:
            for name in DATABASES:
                with contextlib.suppress(StoreError):
                    store_admin.delete_db(self.admin, getattr(self.config.store, name))


# -- sampling while the run goes -----------------------------------------------------------------
def seq_number(seq: Any) -> int:
    """The count in an update sequence: an integer on the embedded store, "N-opaque" on
    CouchDB (where N is the number of updates this node saw: enough for a rate)."""
    return int(str(seq).split("-", 1)[0])


def listening_pid(url: str) -> int | None:
    """The pid of the process listening on a loopback URL's port (an external store that runs
    on this host: its CPU is part of the run's cost), or None."""
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return cast("int | None", conn.pid)  # psutil is untyped here
    return None


def tree_cpu(proc: psutil.Process, js_seen: dict[tuple[int, float], float]) -> tuple[float, float]:
    """CPU seconds of a store's process tree: (the store's processes, its JavaScript processes).
    CouchDB runs validate_doc_update and the views in couchjs (spidermonkey) or couchjs_mainjs
    (quickjs) processes below it, and ends and starts them as it likes (an idle one is ended,
    a crashed one replaced): a JavaScript process's seconds are kept in `js_seen` by process, so
    one that ended still counts with what it had used when last seen, and the sum never goes
    back. Reaped children's times (`children_*`) are left out: they would count an ended
    JavaScript process a second time, in its parent."""
    own = 0.0
    for member in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = member.cpu_times()
            seconds = times.user + times.system
            if member.name().startswith("couchjs"):
                key = (member.pid, member.create_time())  # a pid may be used again
                js_seen[key] = max(seconds, js_seen.get(key, 0.0))
            else:
                own += seconds
    return own, sum(js_seen.values())


class Sampler(threading.Thread):
    """Every `every` seconds: the files database's update count, the monitoring summary's
    totals and backlog, and the CPU seconds of every process of the run."""

    def __init__(self, service: Service, every: float):
        super().__init__(name="sampler", daemon=True)
        self.service, self.every = service, every
        self.samples: list[Sample] = []
        self.latest: Sample | None = None
        self._halt = threading.Event()
        self._procs: dict[str, psutil.Process] = {}
        # Each store process's JavaScript processes ever seen (see tree_cpu).
        self._js_seen: dict[str, dict[tuple[int, float], float]] = {}
        # Store processes to look for: the local nodes, or an external store on this host.
        local = service.local is not None
        self._stores = service.options.nodes if local else len(service.store_pids())

    def run(self) -> None:
        while not self._halt.is_set():
            with contextlib.suppress(StoreError, psutil.Error, OSError):
                self.take()
            self._halt.wait(self.every)

    def take(self) -> Sample:
        config = self.service.config
        admin = self.service.admin
        info = admin.db(config.store.files_db).info()
        live = admin.db(config.store.stats_db).get(summaries.LIVE_ID) or {}
        # The simulator, the embedded store (if any) and every agent instance: look again
        # while one is missing (still starting, or restarted by the supervisor).
        per_host = sum(config.agents.instances.values())
        stores = self._stores
        expected = 1 + stores + per_host * self.service.options.hosts
        if len(self._procs) < expected:
            self._procs = self.service.processes()
        cpu, rss, fds = {}, {}, {}
        for name, proc in list(self._procs.items()):
            try:
                if name.startswith("store"):
                    cpu[name], js = tree_cpu(proc, self._js_seen.setdefault(name, {}))
                    if js:
                        cpu[name.replace("store", "store-js", 1)] = js
                with proc.oneshot():
                    if not name.startswith("store"):
                        times = proc.cpu_times()
                        cpu[name] = times.user + times.system
                    rss[name] = proc.memory_info().rss
                    fds[name] = proc.num_fds()
            except psutil.Error:
                self._procs.pop(name)  # a restarted agent is found again next time
        sample = Sample(
            at=time.time(),
            seq=seq_number(info.get("update_seq", 0)),
            docs=int(info.get("doc_count", 0)),
            totals=live.get("totals", {}),
            backlog=live.get("backlog"),
            cpu=cpu,
            rss=rss,
            fds=fds,
        )
        self.samples.append(sample)
        self.latest = sample
        return sample

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


# -- injection -----------------------------------------------------------------------------------
@dataclass
class Injected:
    ids: set[str] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)
    failed_calls: int = 0
    lag: list[float] = field(default_factory=list)  # wall seconds an upload started late

    def __len__(self) -> int:
        return len(self.ids)


class Injector:
    """Uploads each injection's jobs, one upload call per job, from a pool of threads."""

    def __init__(self, config: Config, uploaders: int, patience: float):
        self.patience = patience
        server = Server.from_config(config, account="admin")
        self.db = server.db(config.store.files_db)
        self.pool = ThreadPoolExecutor(uploaders, thread_name_prefix="uploader")
        self.injected = Injected()
        self._lock = threading.Lock()
        self._futures: list[Future[None]] = []

    def submit(self, docs: Iterable[dict[str, Any]], due: float) -> None:
        self._futures.append(self.pool.submit(self._upload, list(docs), due))

    def _upload(self, docs: list[dict[str, Any]], due: float) -> None:
        lag = time.time() - due
        give_up = time.monotonic() + self.patience
        wait, longest = UPLOAD_BACKOFF
        while True:
            try:
                report = upload(self.db, docs)
                break
            except StoreError as exc:
                # A job wrapper retries its stage-out upload (a store restarting, say);
                # upload() is idempotent, so a write whose answer was lost is not doubled.
                with self._lock:
                    self.injected.failed_calls += 1
                if time.monotonic() + wait > give_up:
                    with self._lock:
                        for doc in docs:
                            self.injected.refused[doc["_id"]] = f"upload failed: {exc}"
                    return
                time.sleep(wait)
                wait = min(longest, 2 * wait)
        with self._lock:
            self.injected.ids.update(report.recorded)
            self.injected.ids.update(report.already)
            self.injected.refused.update(report.refused)
            self.injected.lag.append(lag)

    def wait(self) -> None:
        for future in self._futures:
            future.result()
        self._futures.clear()
        self.pool.shutdown()

    @property
    def queued(self) -> int:
        return sum(not f.done() for f in self._futures)


# -- the run -------------------------------------------------------------------------------------
def request_counts(text: str) -> dict[tuple[str, str, str], list[float]]:
    """(database, route, method) → [store requests, seconds to their answers] in a process's
    Prometheus metrics (aso.metrics: aso_store_requests_total, aso_store_request_seconds)."""
    counts: dict[tuple[str, str, str], list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "aso_store_requests_total":
                index = 0
            elif sample.name == "aso_store_request_seconds_sum":
                index = 1
            else:
                continue
            labels = sample.labels
            key = (labels.get("db", ""), str(labels.get("route")), str(labels.get("method")))
            counts.setdefault(key, [0.0, 0.0])[index] += sample.value
    return counts


class Simulation:
    def __init__(self, plan: Plan, options: RunOptions, console: Console | None = None):
        if options.chaos is not None:
            plan = dataclasses.replace(
                plan, outages=[*plan.outages, *chaos_outages(plan, options.chaos)]
            )
        self.plan, self.options = plan, options
        self.console = console or Console(stderr=True)
        options.workdir.mkdir(parents=True, exist_ok=True)
        self.config = sim_config(plan, options)
        assert self.config.source is not None
        self.config.source.write_text(render(self.config, show_secrets=True))
        self.config.source.chmod(0o600)
        self.service = Service(self.config, options)
        # The simulator's own store requests before this run (a process that runs several
        # simulations, as make bench-long does, counts them all): subtracted in the report.
        self.simulator_before = request_counts(generate_latest(REGISTRY).decode())
        self.chaos_log: ChaosLog | None = None
        self.run_token = options.run_token or (
            time.strftime("%y%m%d_%H%M%S", time.gmtime()) + "_" + uuid.uuid4().hex[:4]
        )

    def run(self) -> Report:
        service = self.service
        try:
            if self.options.profile_store:
                # Read by the embedded store's start (aso/local/embedded.py): its profiler.
                self.profile_dir.mkdir(parents=True, exist_ok=True)
                os.environ["ASO_STORE_CPU_PROFILE"] = str(self.profile_dir)
            try:
                service.start_store()
            finally:
                os.environ.pop("ASO_STORE_CPU_PROFILE", None)
            ceiling = None
            if self.options.measure_ceiling:
                self.console.print("measuring the store's bulk-write ceiling…")
                ceiling = measure_write_ceiling(
                    service.admin, self.config, self.options.ceiling_docs
                )
            service.start_agents()
            writes_before = self._update_counts()
            sampler = Sampler(service, self.options.sample_every)
            sampler.take()
            sampler.start()
            injector = Injector(self.config, self.options.uploaders, self.options.upload_patience)
            started = time.time()
            chaos = self._start_chaos(started)
            self.chaos_log = chaos.log if chaos is not None else None
            profiling = self._start_profile(started, injector)
            with self._progress() as progress:
                self._inject(injector, started, progress, sampler)
                injection_end = time.time()
                store_profile = self._stop_profile(profiling, injector)
                if chaos is not None:
                    chaos.stop()
                unfinished = self._drain(injector.injected.ids, progress, sampler)
            drained = time.time()
            self._let_the_catalog_settle()
            sampler.stop()
            sampler.take()
            store_requests = self._store_requests()
            service.stop_agents()
            writes = {
                name: count - writes_before.get(name, 0)
                for name, count in self._update_counts().items()
            }
            report = self._report(injector.injected, started, injection_end, drained, sampler)
            report.writes = writes
            report.store_requests = store_requests
            report.store_profile = store_profile
            report.ceiling = ceiling
            report.drain_unfinished = unfinished
            if chaos is not None:
                report.chaos = chaos.log.to_dict(started)
            return report
        finally:
            service.stop()

    # -- phases ----------------------------------------------------------------------------------
    @property
    def profile_dir(self) -> Path:
        return self.options.workdir.resolve() / "profile"

    def _start_profile(
        self, started: float, injector: Injector
    ) -> tuple[StoreProfiler, threading.Timer, list[int]] | None:
        """Start profiling the store once the injection's warm-up is over (a timer)."""
        if not self.options.profile_store:
            return None
        # The embedded store's profiler is loaded only into a store this run started (a
        # SIGUSR2 would end another); CouchDB's counters are any CouchDB's.
        local = self.service.local is not None
        kind = self.config.store.engine if local else self.service.admin.kind
        pid = next(iter(self.service.store_pids().values()), None) if local else None
        profiler = StoreProfiler(self.service.admin, kind, pid, self.profile_dir)
        injected_at_start: list[int] = []

        def begin() -> None:
            injected_at_start.append(len(injector.injected))
            profiler.start()

        delay = self.plan.wall(warmup_of(self.plan)) - (time.time() - started)
        timer = threading.Timer(max(0.0, delay), begin)
        timer.start()
        return profiler, timer, injected_at_start

    def _stop_profile(
        self, profiling: tuple[StoreProfiler, threading.Timer, list[int]] | None, injector: Injector
    ) -> dict[str, Any] | None:
        if profiling is None:
            return None
        profiler, timer, injected_at_start = profiling
        timer.cancel()
        if not injected_at_start:
            return {"error": "the injection ended before its warm-up"}
        try:
            return profiler.stop(len(injector.injected) - injected_at_start[0])
        except (StoreError, OSError) as exc:
            return {"error": f"the profile failed: {exc}"}

    def _start_chaos(self, started: float) -> Chaos | None:
        if self.options.chaos is None:
            return None
        chaos = Chaos(
            self.options.chaos,
            agents=self.service.agent_processes,
            store=self.service.local,
            hosts=lambda: dict(self.service.supervisors),
            start=started,
            end=started + self.plan.wall(self.plan.duration),
            tick=self.plan.wall(self.plan.interval),
        )
        chaos.start()
        return chaos

    def _progress(self) -> Progress:
        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[figures]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.options.progress,
            refresh_per_second=2,
        )

    def _figures(self, injector_count: int, sampler: Sampler) -> str:
        sample = sampler.latest
        state = (sample.totals.get(model.STATE, {}) if sample else {}) or {}
        publication = (sample.totals.get(model.PUBLICATION, {}) if sample else {}) or {}
        backlog = sample.backlog if sample and sample.backlog is not None else "?"
        return (
            f"injected {injector_count} · done {state.get('done', 0)} · failed "
            f"{state.get('failed', 0)} · published {publication.get('published', 0)} · "
            f"backlog {backlog}"
        )

    def _inject(
        self, injector: Injector, started: float, progress: Progress, sampler: Sampler
    ) -> None:
        plan = self.plan
        workload = Workload(plan, self.run_token)
        bar = progress.add_task(
            f"simulated time (×{plan.compression:g})", total=plan.duration, figures=""
        )
        for at in injections(plan):
            due = started + plan.wall(at)
            self._wait_until(due, bar, started, progress, injector, sampler)
            for job in workload.tick(time.time()):
                injector.submit(job.docs, due)
        end = started + plan.wall(plan.duration)
        self._wait_until(end, bar, started, progress, injector, sampler)
        injector.wait()
        progress.update(bar, completed=plan.duration)

    def _wait_until(
        self,
        deadline: float,
        bar: TaskID,
        started: float,
        progress: Progress,
        injector: Injector,
        sampler: Sampler,
    ) -> None:
        """Sleep until `deadline` (wall epoch), moving the simulated-time bar meanwhile."""
        plan = self.plan
        while (left := deadline - time.time()) > 0:
            time.sleep(min(left, 0.5))
            progress.update(
                bar,
                completed=min(plan.duration, (time.time() - started) * plan.compression),
                figures=self._figures(len(injector.injected), sampler),
            )

    def _let_the_catalog_settle(self) -> None:
        """On a cluster, the publishers look at their last blocks again a few seconds after
        writing them (EmbeddedCatalog.settle: two blocks sharing a file both got past their
        checks): a service goes on after its last file, so the agents do here for that long
        before they stop and the catalog is read."""
        if self.options.nodes > 1 and self.config.publisher.catalog == "embedded":
            time.sleep(SETTLE_LOOKS[0] + 2 * SETTLE_EVERY)

    def _drain(self, ids: set[str], progress: Progress, sampler: Sampler) -> int:
        """Wait until every injected file is final (read back in batches; final files are not
        read again). Returns how many were still unfinished at the drain's time limit."""
        db = self.service.admin.db(self.config.store.files_db)
        waiting = sorted(ids)
        bar = progress.add_task("drain: files not final", total=len(waiting), figures="")
        deadline = time.monotonic() + self.options.drain_timeout
        while waiting and time.monotonic() < deadline:
            still = []
            try:
                for start in range(0, len(waiting), 1000):
                    chunk = waiting[start : start + 1000]
                    docs = db.get_many(chunk)
                    still += [
                        i for i in chunk if (doc := docs[i]) is None or not model.has_ended(doc)
                    ]
            except StoreError as exc:
                log.warning("drain: the store did not answer (%s); trying again", exc)
                time.sleep(2.0)
                continue
            waiting = still
            progress.update(
                bar,
                completed=len(ids) - len(waiting),
                figures=self._figures(len(ids), sampler),
            )
            if waiting:
                time.sleep(2.0)
        return len(waiting)

    def _report(
        self,
        injected: Injected,
        started: float,
        injection_end: float,
        drained: float,
        sampler: Sampler,
    ) -> Report:
        plan = self.plan
        bucket = self.options.bucket or default_bucket(plan.duration)
        analysis = Analysis(started, plan.compression, bucket)
        requests: dict[str, dict[str, Any]] = {}
        hold_docs = []
        for doc in self._requests(injected.ids):
            if doc.get("type") == model.REQUEST_TYPE:
                requests[doc["_id"]] = doc
            elif doc.get("type") == model.HOLD_TYPE:
                hold_docs.append(doc)
        analysis.holds = hold_spans(hold_docs, drained)
        accounting = account(injected.ids, requests.values())
        check_copies(accounting, self._copies())
        holders = self._catalog_holders()
        lfns = (lfn for lfn, blocks in holders.items() for _ in blocks)
        check_catalog(accounting, lfns, requests.values())
        cleared = recheck_twice(accounting, holders, self._quorum_block)
        if cleared:
            log.info("%d files found twice in the feed, once at the quorum", len(cleared))
        late = recheck_catalog(accounting, requests.values(), self._quorum_block)
        if late:
            log.info("%d published files found in their block at the quorum only", len(late))
        hosts = self._work_by_host(requests.values())
        for doc in requests.values():
            analysis.add(doc)
        quotas = self._quota_figures(requests.values(), analysis)
        # Each revision's number counts the writes that made it: the requests' own writes.
        own_writes = sum(int(str(doc["_rev"]).split("-", 1)[0]) for doc in requests.values())
        return Report(
            request_writes=own_writes,
            plan=plan,
            started=started,
            injection_end=injection_end,
            drained=drained,
            bucket=bucket,
            analysis=analysis,
            accounting=accounting,
            samples=sampler.samples,
            refused=dict(list(injected.refused.items())[:20]),
            refused_count=len(injected.refused),
            upload_retries=injected.failed_calls,
            upload_lag=sorted(injected.lag),
            hosts=hosts,
            quotas=quotas,
        )

    def _quota_figures(
        self, requests: Iterable[dict[str, Any]], analysis: Analysis
    ) -> list[dict[str, Any]]:
        """The figures of each destination with a size limit, with its ledger from the job
        table (the plan's outages and the service's are in the same order)."""
        jobs = self.service.admin.db(self.config.store.transfers_db)
        docs = list(requests)
        return [
            quota_figures(
                planned, jobs.get(ledger_id(served)), docs, analysis.held_files,
                analysis.holds, percentiles, self.plan.compression,
            )
            for planned, served in zip(
                byte_quotas(self.plan.outages), byte_quotas(self.config.sim.outages), strict=True
            )
        ]  # fmt: skip

    def _store_requests(self) -> dict[str, dict[str, list[float]]]:
        """Who asked the store for what over the run: agent (or `simulator`: its uploads, its
        samples and the drain's reads) → "database route METHOD" → [requests, seconds to the
        answer], from each agent process's Prometheus metrics (its heartbeat has the address)
        and the simulator's own."""
        names = {getattr(self.config.store, name): short for name, short in SHORT_DB.items()}
        found: dict[str, dict[str, list[float]]] = {}
        texts = [("simulator", generate_latest(REGISTRY).decode())]
        files = self.service.admin.db(self.config.store.files_db)
        for host in self.service.supervisors:
            ids = [
                model.heartbeat_id(agent, f"{host}-{slot}")
                for agent, n in self.config.agents.instances.items()
                for slot in range(n)
            ]
            for beat in files.get_many(ids).values():
                if beat and beat.get("metrics"):
                    with contextlib.suppress(requests.RequestException):
                        answer = requests.get(f"http://{beat['metrics']}/metrics", timeout=10)
                        texts.append((str(beat.get("agent")), answer.text))
        for who, text in texts:
            before = self.simulator_before if who == "simulator" else {}
            mine = found.setdefault(who, {})
            for (db, route, method), counts in request_counts(text).items():
                was = before.get((db, route, method), [0.0, 0.0])
                if counts[0] - was[0] <= 0:
                    continue
                key = f"{names.get(db, db or 'server')} {route} {method}"
                mine[key] = [counts[0] - was[0], counts[1] - was[1]]
        return found

    def _update_counts(self) -> dict[str, int]:
        """Each of the run's databases (files_db, transfers_db, ...) → updates so far: what
        every writer (agents, uploads, the sim service, the catalog) wrote to it."""
        counts = {}
        for name in DATABASES:
            info = self.service.admin.db(getattr(self.config.store, name)).info()
            counts[name] = seq_number(info.get("update_seq", 0))
        return counts

    def _work_by_host(self, docs: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
        if self.options.hosts < 2:
            return None
        killed = None
        chaos = self.options.chaos
        if chaos is not None and chaos.kill_host and self.chaos_log is not None:
            at = [e.at for e in self.chaos_log.events if e.what == "host_killed"]
            killed = (chaos.kill_host, at[0]) if at else None
        return work_by_host(docs, host_ids(self.options.hosts), killed)

    def _requests(self, ids: set[str]) -> Iterable[dict[str, Any]]:
        """The requests to account for: every document of the files database (so that one
        nobody injected is seen), or, in a prepared store of a million others, the run's own."""
        if self.options.store_data is None:
            yield from self._all_docs(self.config.store.files_db)
            return
        db = self.service.admin.db(self.config.store.files_db)
        wanted = sorted(ids)
        for start in range(0, len(wanted), 2000):
            yield from (d for d in db.get_many(wanted[start : start + 2000]).values() if d)

    def _all_docs(self, name: str) -> Iterable[dict[str, Any]]:
        """Every live document of one of the run's databases: the ids from its `_changes`
        feed; on a cluster each document read at the quorum (CLUSTER_VIEW_READS_ONE_COPY: a
        feed's documents come from one copy of each shard range, and a restarted node's copy
        had two requests as they were before they were published)."""
        db = self.service.admin.db(name)
        one_copy = self.options.nodes <= 1
        for batch in db.follow("0", batch=1000, include_docs=one_copy):
            live = [c for c in batch.results if not c.get("deleted")]
            if one_copy:
                yield from (c["doc"] for c in live if c.get("doc"))
                continue
            found = db.get_many(c["id"] for c in live)
            for doc_id in (c["id"] for c in live):
                doc = found[doc_id] or db.get(doc_id)  # CLUSTER_READ_MAY_MISS: asked alone
                if doc is not None:
                    yield doc

    def _copies(self) -> Iterable[tuple[str, float, float]]:
        """(file id, start, end) of every copy the sim service made, from its job table: each
        job as the service sees it, over all its branches (a job stored below a cluster's
        quorum that came back beside its fence: aso.transfer.jobstore.merged)."""
        jobs_db = self.service.admin.db(self.config.store.transfers_db)
        service = SimService(jobs_db, self.config.sim)
        ids = [
            doc["_id"]
            for doc in self._all_docs(self.config.store.transfers_db)
            if doc.get("type") == JOB_TYPE
        ]
        for start in range(0, len(ids), 1000):
            for job in service.jobs.get_many(ids[start : start + 1000]).values():
                if job is not None:
                    for file_id, (begun, end) in service.copies(job).items():
                        yield file_id, begun, end

    def _quorum_block(self, name: str) -> dict[str, Any] | None:
        """A catalog block read from every copy of a cluster (`r`: a copy that has it is heard
        even when the others do not have it yet)."""
        db = self.service.admin.db(self.config.store.catalog_db)
        params = {"r": str(min(3, self.options.nodes))} if self.options.nodes > 1 else None
        try:
            return cast(
                dict[str, Any],
                db.server.raw("GET", f"/{db.name}/{quote(name, safe='')}", params=params),
            )
        except NotFound:
            return None

    def _catalog_holders(self) -> dict[str, list[str]]:
        """LFN → the blocks holding it, as the catalog's `_changes` shows them."""
        holders: dict[str, list[str]] = defaultdict(list)
        for doc in self._all_docs(self.config.store.catalog_db):
            if doc.get("type") == "block":
                for f in doc.get("files", []):
                    holders[f["lfn"]].append(doc["_id"])
        return holders


def default_bucket(duration: float) -> float:
    """Report rows per simulated hour, or finer when the run is short (at least ~12 rows)."""
    for width in (3600.0, 900.0, 300.0, 60.0):
        if duration / width >= 12:
            return width
    return max(10.0, duration / 12)


def run_simulation(
    plan: Plan,
    options: RunOptions,
    console: Console | None = None,
    on_report: Callable[[Report], None] | None = None,
) -> Report:
    """Run one simulation and write its report (JSON and plots) into the workspace."""
    report = Simulation(plan, options, console).run()
    out = options.workdir / "report"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=1))
    report.plot(out)
    if on_report:
        on_report(report)
    return report
