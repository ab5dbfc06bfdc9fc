"""Benchmark: what the Prometheus metrics cost the agents' store calls, side by side in one run.

Every store request passes through aso.metrics' response hook (a counter, a histogram, a route
parsed from the URL) and every bulk write counts its conflicts. The same calls run with the
hook on and off, on one store, in alternating rounds so that the machine's noise falls on both:
single-document GETs, `_bulk_docs` writes of 100 documents, and the hook alone in a loop.
Printed: median and p95 per call for each mode, and the ratio of the medians.

    python -m aso.sim.bench_metrics [--rounds 10] [--gets 200] [--bulks 10]
    python -m aso.sim.bench_metrics --url http://admin:pw@couchdb:5984   # a real CouchDB
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
import uuid
from collections.abc import Callable

import requests
from rich.console import Console
from rich.progress import track
from rich.table import Table

from aso import metrics
from aso.sim.benchstore import bench_store
from aso.store import Database, Server
from aso.store import admin as store_admin

console = Console()
MODES = ("metrics on", "metrics off")


def set_metrics(server: Server, on: bool) -> None:
    """Put the metrics' response hook on the server's session, or take it off."""
    hooks = server.client.http_client.hooks["response"]
    hooks[:] = [metrics.observe_store_response] if on else []


def timed(call: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def one_round(db: Database, gets: int, bulks: int) -> dict[str, list[float]]:
    doc_id = "bench-doc"
    times = {"GET": timed(lambda: db.get(doc_id), gets)}
    times["_bulk_docs x100"] = timed(
        lambda: db.bulk_write([{"_id": uuid.uuid4().hex, "n": i} for i in range(100)]), bulks
    )
    return times


def hook_alone(n: int) -> list[float]:
    """The hook's own cost, on a made-up answer (no network)."""
    response = requests.Response()
    response.status_code = 200
    response.request = requests.Request("POST", "http://127.0.0.1:5984/files/_bulk_docs").prepare()
    response.elapsed = datetime.timedelta(milliseconds=3)
    return timed(lambda: metrics.observe_store_response(response), n)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds per mode (alternating)")
    parser.add_argument("--gets", type=int, default=200, help="single GETs per round")
    parser.add_argument("--bulks", type=int, default=10, help="bulk writes of 100 per round")
    parser.add_argument("--url", help="a store with admin credentials in the URL")
    args = parser.parse_args(argv)

    with bench_store(args.url) as (config, _):
        server = Server.from_config(config, account="admin")
        kind = server.kind
        name = f"bench_metrics_{uuid.uuid4().hex[:8]}"
        store_admin.create_db(server, name, {"admins": {"names": [], "roles": ["_admin"]}})
        db = server.db(name)
        db.put({"_id": "bench-doc", "payload": "x" * 2000})
        samples: dict[tuple[str, str], list[float]] = {}
        try:
            for i in track(range(2 * args.rounds), description="rounds", console=console):
                mode = MODES[(i + i // 2) % 2]  # on, off, off, on, ...: neither always first
                set_metrics(server, mode == MODES[0])
                for call, times in one_round(db, args.gets, args.bulks).items():
                    samples.setdefault((call, mode), []).extend(times)
        finally:
            set_metrics(server, True)
            store_admin.delete_db(server, name)
        alone = hook_alone(20000)

    table = Table(title=f"store calls with and without metrics ({kind})")
    for column in ("call", "metrics on p50 / p95 (ms)", "metrics off p50 / p95 (ms)", "on/off"):
        table.add_column(column, justify="right")
    for call in ("GET", "_bulk_docs x100"):
        on, off = samples[(call, MODES[0])], samples[(call, MODES[1])]
        table.add_row(
            call,
            f"{_ms(statistics.median(on))} / {_ms(_p95(on))}",
            f"{_ms(statistics.median(off))} / {_ms(_p95(off))}",
            f"{statistics.median(on) / statistics.median(off):.3f}",
        )
    console.print(table)
    console.print(
        f"the hook alone: {statistics.median(alone) * 1e6:.1f} µs per store answer (median of "
        f"{len(alone)})"
    )


def _p95(values: list[float]) -> float:
    return sorted(values)[int(0.95 * (len(values) - 1))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


if __name__ == "__main__":
    main()
