"""Benchmark: the embedded store's view builds, with pouchdb-mapreduce's own evaluation of view
functions (a new V8 context and a compilation for every document) and with ASO's workaround
(EMBEDDED_VIEW_CONTEXT_PER_DOCUMENT, deploy/store/view-functions.js: compiled once per view
update), side by side in one run.

Two embedded stores, each filled with the same synthetic finished requests (sim/bench_pages.py's,
validation set aside for the fill), then every view of the files database and the statistics'
built on one store and then the other, the order turned at each view so that the machine's
noise falls on both. Printed per view: seconds and the store's CPU seconds on each, and the
ratio; then documents per second per view build on each.

    python -m aso.sim.bench_views [--requests 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.table import Table

from aso.local import embedded
from aso.provision.designdocs import init_databases
from aso.sim.bench_pages import all_views, build_views, fill
from aso.sim.bench_workqueue import cpu_seconds
from aso.sim.benchstore import bench_store
from aso.store import Server

console = Console()
SIDES = ("pouchdb's own", "compiled once")


@contextlib.contextmanager
def without_view_workaround() -> Iterator[None]:
    """Stores started inside start without deploy/store/view-functions.js."""
    saved = embedded.PRELOADS
    embedded.PRELOADS = tuple(m for m in saved if m != embedded.VIEW_FUNCTIONS_MODULE)
    try:
        yield
    finally:
        embedded.PRELOADS = saved


def build(config: Any, store: Any, ddoc: str, view: str) -> tuple[float, float]:
    """Wall and store CPU seconds to bring one view up to date (bench_pages.build_views)."""
    admin = Server.from_config(config, account="admin")
    pid = store.our_pid()
    cpu = cpu_seconds(pid)
    wall = build_views(admin, config, [(ddoc, view)])[view]
    return wall, cpu_seconds(pid) - cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        with without_view_workaround():
            own = stack.enter_context(bench_store(None))
        once = stack.enter_context(bench_store(None))
        stores = dict(zip(SIDES, (own, once), strict=True))
        for side, (config, _store) in stores.items():
            config.store.agent_password = "bench-agent"
            admin = Server.from_config(config, account="admin")
            init_databases(admin, config)
            console.print(f"{side}: filling {args.requests} requests")
            fill(admin, config, args.requests, 30.0, time.time())
        table = Table(title=f"view builds over {args.requests:,} requests (embedded store)")
        table.add_column("view")
        for side in SIDES:
            table.add_column(f"{side}: s (CPU s)", justify="right")
        table.add_column("ratio", justify="right")
        seconds: dict[str, list[float]] = {side: [] for side in SIDES}
        for i, (ddoc, view) in enumerate(all_views(own[0])):
            order = SIDES if i % 2 == 0 else SIDES[::-1]
            figures = {side: build(*stores[side], ddoc, view) for side in order}
            for side in SIDES:
                seconds[side].append(figures[side][0])
            ratio = figures[SIDES[0]][0] / max(figures[SIDES[1]][0], 1e-9)
            cells = [f"{wall:.1f} ({cpu:.1f})" for wall, cpu in (figures[s] for s in SIDES)]
            table.add_row(f"{ddoc}/{view}", *cells, f"{ratio:.1f}x")
        totals = [sum(seconds[side]) for side in SIDES]
        table.add_row(
            "all", *(f"{t:.0f}" for t in totals), f"{totals[0] / max(totals[1], 1e-9):.1f}x"
        )
        console.print(table)
        for side in SIDES:
            rate = args.requests / statistics.median(seconds[side])
            console.print(f"{side}: median view build {rate:,.0f} documents/s")


if __name__ == "__main__":
    main()
