"""`make bench-uploads`: how many job uploads a store takes, and what they cost it, with nothing
else running.

A job wrapper records its files in one upload call (aso/upload.py: one `_bulk_docs` of its
requests, each judged by the store's `validate_doc_update`). At 30x design, 104 files/s in jobs
of 1.4 files are 74 upload calls a second. This measures, on a store of its own (`--engine`)
with ASO's databases and design documents, for each count of concurrent uploaders
(`--uploaders 2,8,32`), single-job uploads of the simulator's workload for `--seconds`:
uploads/s and documents/s, the latency p50/p95, and the CPU of the store, of its JavaScript
processes (CouchDB's couchjs) and of the uploading client (this process), in cores. The store's
background index builds (CouchDB's ken) run as they would: their cost is in the store's share.

    python -m aso.sim.bench_uploads [--engine couchdb] [--uploaders 2,8,32] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from aso.sim.lifecycle import RunOptions, Service, sim_config, tree_cpu
from aso.sim.report import percentiles
from aso.sim.workload import Plan, Workload
from aso.store import Database, Server
from aso.upload import upload

console = Console()


@dataclass
class UploadRound:
    uploaders: int
    seconds: float
    uploads_per_s: float
    docs_per_s: float
    latency_p50_ms: float
    latency_p95_ms: float
    refused: int
    store_cores: float
    store_js_cores: float
    client_cores: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="couchdb", choices=("pouchdb", "couchdb"))
    parser.add_argument("--uploaders", default="2,8,32", help="Counts of concurrent uploaders.")
    parser.add_argument("--seconds", type=float, default=20.0, help="Wall seconds per count.")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--sites", type=int, default=90)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--workdir", type=Path, default=Path("var/bench-uploads"))
    return parser.parse_args(argv)


class Uploads:
    """Jobs of the simulator's workload, drawn one at a time under a lock (the workload's
    random state is not thread-safe), each uploaded in one call."""

    def __init__(self, workload: Workload, db: Database):
        self.workload, self.db = workload, db
        self._lock = threading.Lock()
        self.latencies: list[float] = []
        self.docs = 0
        self.refused = 0

    def next_job(self) -> list[dict[str, Any]]:
        with self._lock:
            user = self.workload.rng.choice(self.workload.users)
            return list(self.workload.job(user, time.time()).docs)

    def upload_until(self, stop: float) -> None:
        while time.monotonic() < stop:
            docs = self.next_job()
            started = time.monotonic()
            report = upload(self.db, docs)
            took = time.monotonic() - started
            with self._lock:
                self.latencies.append(took)
                self.docs += len(report.recorded)
                self.refused += len(report.refused)


def cpu_seconds(
    store: psutil.Process | None, js_seen: dict[tuple[int, float], float]
) -> tuple[float, float, float]:
    """(the store's, its JavaScript's, this process's) CPU seconds so far."""
    own = psutil.Process().cpu_times()
    store_s, js_s = tree_cpu(store, js_seen) if store is not None else (0.0, 0.0)
    return store_s, js_s, own.user + own.system


def measure(db: Database, workload: Workload, uploaders: int, seconds: float,
            store: psutil.Process | None) -> UploadRound:  # fmt: skip
    uploads = Uploads(workload, db)
    js_seen: dict[tuple[int, float], float] = {}
    before = cpu_seconds(store, js_seen)
    started = time.monotonic()
    with ThreadPoolExecutor(uploaders, thread_name_prefix="uploader") as pool:
        for _ in range(uploaders):
            pool.submit(uploads.upload_until, started + seconds)
    span = time.monotonic() - started
    after = cpu_seconds(store, js_seen)
    cores = [round((a - b) / span, 2) for a, b in zip(after, before, strict=True)]
    latency = percentiles([1000 * t for t in uploads.latencies])  # the simulator's p50/p95
    return UploadRound(
        uploaders=uploaders,
        seconds=round(span, 1),
        uploads_per_s=round(len(uploads.latencies) / span, 1),
        docs_per_s=round(uploads.docs / span, 1),
        latency_p50_ms=round(latency["p50"] or 0.0),
        latency_p95_ms=round(latency["p95"] or 0.0),
        refused=uploads.refused,
        store_cores=cores[0],
        store_js_cores=cores[1],
        client_cores=cores[2],
    )


def print_table(engine: str, rounds: list[UploadRound]) -> None:
    table = Table(title=f"job uploads on {engine}, nothing else running")
    columns = ("uploaders", "uploads/s", "documents/s", "latency p50/p95 ms", "store cores",
               "of which JavaScript", "client cores", "refused")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for r in rounds:
        table.add_row(str(r.uploaders), f"{r.uploads_per_s:.1f}", f"{r.docs_per_s:.1f}",
                      f"{r.latency_p50_ms}/{r.latency_p95_ms}",
                      f"{r.store_cores + r.store_js_cores:.2f}", f"{r.store_js_cores:.2f}",
                      f"{r.client_cores:.2f}", str(r.refused))  # fmt: skip
    console.print(table)


def run(args: argparse.Namespace) -> list[UploadRound]:
    plan = Plan(scale=30, users=args.users, sites=args.sites, seed=args.seed)
    options = RunOptions(workdir=args.workdir, engine=args.engine, measure_ceiling=False)
    args.workdir.mkdir(parents=True, exist_ok=True)
    config = sim_config(plan, options)
    service = Service(config, options)
    service.start_store()
    try:
        pid = next(iter(service.store_pids().values()), None)
        store = psutil.Process(pid) if pid else None
        db = Server.from_config(config, account="admin").db(config.store.files_db)
        workload = Workload(plan, time.strftime("%y%m%d_%H%M%S", time.gmtime()))
        rounds = []
        for count in (int(n) for n in args.uploaders.split(",")):
            console.print(f"{count} uploaders for {args.seconds:g} s…")
            rounds.append(measure(db, workload, count, args.seconds, store))
    finally:
        service.stop()
    print_table(args.engine, rounds)
    out = args.workdir / "uploads.json"
    out.write_text(json.dumps({"engine": args.engine, "rounds": [asdict(r) for r in rounds]}))
    console.print(f"{out}")
    return rounds


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
