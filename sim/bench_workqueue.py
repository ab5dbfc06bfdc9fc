"""Benchmark: how should agents find their work? The shared queue view against `_changes`-driven
work sets, side by side in one run, on the same store.

A small pipeline moves every file through the agents' steps (upload → submitted →
done → cleaned, and published for outputs) in rounds. Each agent reads its work
before it acts, either

* view:         a fresh read of its kind in the shared queue view (`queue/work`),
* changes:      a refresh of its own ChangesWorkSet (the `_changes` feed since its checkpoint),
* changes+warm: the same, plus one read of the queue view's backlog per round (what an agent's
                heartbeat does), which keeps the view's index warm for the agents' start-up.
                In production that read is lazy (update after answering); here it is fresh so
                that the indexing it causes falls inside the strategy's own round and is
                counted in its wall time and store CPU.

The strategies run on databases of one store, round by round in rotating order, so the
machine's noise falls on all. Printed: pipeline throughput (files/s), the latency of the
agents' work reads (median, p95), the store's CPU seconds per 1000 files (embedded store only:
read from /proc), and the time an agent restarted after the run needs to rebuild its work set
from the view (warm or cold index) or from the whole feed.

    python -m aso.sim.bench_workqueue [--files 3000] [--batch 250] [--monitoring]
    python -m aso.sim.bench_workqueue --url http://admin:pw@couchdb:5984   # a real CouchDB
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from aso import model
from aso.config import Config
from aso.model import AGENT, CLEANUP, PUBLICATION, STATE, Change
from aso.provision.designdocs import init_databases
from aso.sim.benchstore import bench_store
from aso.sites import simulated
from aso.store import Database, Server, Settings
from aso.store import admin as store_admin
from aso.workqueue import ACTIVE, CLEAN, PUBLISH, SUBMIT, ChangesWorkSet, QueueView

console = Console()
USER = "benchuser"

# (agent, kind it reads, the changes it makes on each document of that kind)
STRATEGIES = ("view", "changes", "changes+warm")
STEPS: list[tuple[str, str, list[list[tuple[str, str]]]]] = [
    ("submitter", SUBMIT, [[(STATE, "submitted")]]),
    ("monitor", ACTIVE, [[(STATE, "done")]]),
    ("cleaner", CLEAN, [[(CLEANUP, "cleaned")]]),
    ("publisher", PUBLISH, [[(PUBLICATION, "published")]]),
]


@dataclass
class Tally:
    reads: list[float] = field(default_factory=list)
    wall: float = 0.0
    files: int = 0
    writes: int = 0
    store_cpu: float = 0.0
    conflicts: int = 0
    startup: dict[str, float] = field(default_factory=dict)


def make_docs(round_no: int, batch: int, strategy: str) -> list[dict[str, Any]]:
    docs = []
    for i in range(batch):
        name = f"{strategy}_{round_no}_{i}"
        publish = i % 2 == 0  # half outputs to publish, half logs
        docs.append(
            model.request_of(
                user=USER,
                task=f"261121_000000:{USER}_bench_{round_no}",
                job_id=str(i),
                source=f"T2_XX_Site{i % 7}",
                destination="T2_YY_Dest",
                source_lfn=f"/store/temp/user/{USER}/bench/{name}.root",
                destination_lfn=f"/store/user/{USER}/bench/{name}.root",
                size=1000 + i,
                adler32="0a1b2c3d",
                file_type="output" if publish else "log",
                publish=publish,
                publish_info={"dataset": f"/Bench/{USER}-bench-v1/USER"} if publish else None,
            )
        )
    return docs


class Pipeline:
    """One strategy's agents over one database."""

    def __init__(self, strategy: str, owner: Database, agent: Database, monitoring: bool):
        self.strategy, self.owner, self.agent, self.monitoring = strategy, owner, agent, monitoring
        self.view = QueueView(agent)
        self.worksets = {kind: ChangesWorkSet(agent, (kind,)) for _, kind, _ in STEPS}
        if strategy.startswith("changes"):
            for workset in self.worksets.values():
                workset.start()
        else:
            for _, kind, _ in STEPS:  # build the index before timing starts
                self.view.docs(kind, limit=1)

    def read_work(self, kind: str) -> list[dict[str, Any]]:
        if self.strategy == "view":
            return self.view.docs(kind)
        workset = self.worksets[kind]
        workset.refresh()
        return workset.of_kind(kind)

    def round(self, docs: list[dict[str, Any]], tally: Tally) -> None:
        started = time.perf_counter()
        self.owner.bulk_write(docs)
        tally.writes += len(docs)
        for _agent, kind, changes in STEPS:
            t0 = time.perf_counter()
            work = self.read_work(kind)
            tally.reads.append(time.perf_counter() - t0)
            for change in changes:
                updated = [
                    model.transition(d, [Change(a, to, _agent) for a, to in change], AGENT)
                    for d in work
                ]
                results = self.agent.bulk_write(updated)
                tally.writes += len(updated)
                tally.conflicts += sum(not r.ok for r in results)
                revs = {r.id: r.rev for r in results if r.ok}
                work = [dict(d, _rev=revs[d["_id"]]) for d in updated if d["_id"] in revs]
                if self.strategy != "view":
                    # The agent's own writes are in the feed too; applying them here only saves
                    # the agent from acting on a revision it has already replaced.
                    self.worksets[kind].apply(work)
        if self.strategy == "changes+warm":
            self.view.backlog(freshness="fresh")
        if self.monitoring:
            self.agent.view(
                "asyncstageout", "by_state", reduce=True, group_level=1, freshness="lazy"
            )
        tally.wall += time.perf_counter() - started
        tally.files += len(docs)


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in clock ticks


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(
    server: Server,
    agent_server: Server,
    owner_server: Server,
    pid: int | None,
    files: int,
    batch: int,
    monitoring: bool,
    config: Config,
) -> dict[str, Tally]:
    pipelines, tallies = {}, {}
    for strategy in STRATEGIES:
        name = f"bench_{strategy.replace('+', '_')}_{int(time.time())}"
        init_databases(server, _with_db(config, name))
        pipelines[strategy] = Pipeline(
            strategy, owner_server.db(name), agent_server.db(name), monitoring
        )
        tallies[strategy] = Tally()
    rounds = max(1, files // batch)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("rounds", total=rounds)
        for r in range(rounds):
            order = STRATEGIES[r % 3 :] + STRATEGIES[: r % 3]
            for strategy in order:
                before = cpu_seconds(pid)
                pipelines[strategy].round(make_docs(r, batch, strategy), tallies[strategy])
                tallies[strategy].store_cpu += cpu_seconds(pid) - before
            progress.advance(task)
    time.sleep(2)  # let the last lazy index update finish
    for strategy, pipeline in pipelines.items():
        tallies[strategy].startup = startup_times(pipeline.agent)
        store_admin.delete_db(server, pipeline.agent.name)
    return tallies


def startup_times(db: Database) -> dict[str, float]:
    """Seconds for a restarted agent to rebuild a work set of every kind: from the view (as it
    is left by the strategy: warm or cold), then from the whole feed."""
    kinds = tuple(kind for _, kind, _ in STEPS)
    times = {}
    for source in ("view", "feed"):
        t0 = time.perf_counter()
        ChangesWorkSet(db, kinds).start(source)
        times[source] = time.perf_counter() - t0
    return times


def _with_db(config: Config, name: str) -> Config:
    import dataclasses

    return dataclasses.replace(config, store=dataclasses.replace(config.store, files_db=name))


def report(tallies: dict[str, Tally], pid: int | None, batch: int) -> None:
    table = Table(title=f"agents' work reads, {batch} files per round")
    columns = (
        "strategy",
        "files",
        "files/s",
        "writes/s",
        "read p50 ms",
        "read p95 ms",
        "store CPU s/1000 files",
        "restart: view s",
        "restart: feed s",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for strategy, t in tallies.items():
        cpu = f"{1000 * t.store_cpu / t.files:.2f}" if pid else "n/a"
        table.add_row(
            strategy,
            str(t.files),
            f"{t.files / t.wall:.1f}",
            f"{t.writes / t.wall:.0f}",
            f"{1000 * statistics.median(t.reads):.1f}",
            f"{1000 * percentile(t.reads, 0.95):.1f}",
            cpu,
            f"{t.startup['view']:.2f}",
            f"{t.startup['feed']:.2f}",
        )
    console.print(table)
    base = tallies["view"]
    for strategy in STRATEGIES[1:]:
        t = tallies[strategy]
        line = (
            f"{strategy} / view: throughput x{(t.files / t.wall) / (base.files / base.wall):.2f}"
            f", median read latency x"
            f"{statistics.median(t.reads) / statistics.median(base.reads):.2f}"
        )
        if pid:
            line += f", store CPU per file x{t.store_cpu / max(base.store_cpu, 1e-9):.2f}"
        console.print(line)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=3000, help="files per strategy")
    parser.add_argument("--batch", type=int, default=250, help="files uploaded per round")
    parser.add_argument(
        "--monitoring",
        action="store_true",
        help="also read the by_state monitoring view (lazy) once per round",
    )
    parser.add_argument(
        "--url",
        help="use this store (with admin credentials in the URL) instead of a fresh embedded one",
    )
    args = parser.parse_args(argv)

    with bench_store(args.url) as (config, embedded):
        config.store.agent_password = "bench-agent"
        config.sites = simulated([*(f"T2_XX_Site{i}" for i in range(7)), "T2_YY_Dest"])
        server = Server.from_config(config, account="admin")
        store_admin.put_user(server, USER, "bench-user", [model.USER_ROLE])
        init_databases(server, config)  # creates the agent account
        agent = Server.from_config(config, account="agent")
        owner = Server(config.store.url, USER, "bench-user", Settings())
        pid = embedded.status().pid if embedded else None
        console.print(
            f"store: {server.kind} at {config.store.url}; {args.files} files per "
            f"strategy in rounds of {args.batch}"
        )
        tallies = run(server, agent, owner, pid, args.files, args.batch, args.monitoring, config)
        report(tallies, pid, args.batch)


if __name__ == "__main__":
    main()
