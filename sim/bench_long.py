"""`make bench-long`: the goal scales over a long injection window, on a fresh store and on one
that already holds a million finished requests, on each store engine.

For each engine (`--engines pouchdb,couchdb`), at its goal scale (`--scale-pouchdb 20`,
`--scale-couchdb 30`: docs/performance.md) with a workload of its own (`--users 300 --sites 90
--seed 42`, cool-offs, block closure and transfer timeout short so that the drain stays short):

1. **fresh**: the lifecycle simulator (sim/lifecycle.py) on a new local store, `--duration`
   (30 min) of injection every `--interval`, then the drain;
2. **prefilled**: the same on a copy of a store filled with `--prefill` (1M) finished requests
   spread over 30 days, their monitoring summaries and every view index built (the store of
   `make bench-pages`, kept in `--pages-dir` and filled once), then what such a store costs:
   disk per million requests (database and view indexes), each design document's index build,
   a compaction of the database and its indexes, and the purge rate (the analytics purge of
   the prefilled requests, counted into the statistics exactly once, for `--purge-seconds`).

Printed: one line per run (the simulator's summary line), then a table per run (completed /
expected, backlog growth, overhead p95, done→published p95, writes per file, store writes/s of
its ceiling, store CPU, holds) and the prefilled store's costs; JSON in `--workdir`.

    python -m aso.sim.bench_long [--engines pouchdb,couchdb] [--duration 30m] [--prefill 1000000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from aso.config import Config
from aso.monitoring import purge, summaries
from aso.provision import storejs
from aso.sim import bench_pages
from aso.sim.lifecycle import RunOptions, run_simulation
from aso.sim.report import Report, cpu_shares, writes_text
from aso.sim.workload import Plan, parse_duration
from aso.store import Server

console = Console()
GOAL_SCALE = {"pouchdb": 20.0, "couchdb": 30.0}  # the goals on this 2-core machine


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="pouchdb,couchdb")
    parser.add_argument("--scale-pouchdb", type=float, default=GOAL_SCALE["pouchdb"])
    parser.add_argument("--scale-couchdb", type=float, default=GOAL_SCALE["couchdb"])
    parser.add_argument("--duration", default="30m", help="Simulated injection time per run.")
    parser.add_argument("--interval", default="10s")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--sites", type=int, default=90)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--retry-delay", type=float, default=10.0)
    parser.add_argument("--block-timeout", type=float, default=15.0)
    parser.add_argument("--transfer-timeout", type=float, default=60.0)
    parser.add_argument("--bucket", default="60s")
    parser.add_argument(
        "--uploaders",
        type=int,
        default=32,
        help="Job wrappers uploading at once (at 30x, 8 lagged behind the injection times).",
    )
    parser.add_argument("--drain-timeout", type=float, default=900.0, help="Wall seconds.")
    parser.add_argument(
        "--prefill", type=int, default=1_000_000, help="Finished requests already in the store "
        "for the second run of each engine (0: no such run)."
    )  # fmt: skip
    parser.add_argument("--pages-dir", default="var/bench-pages", help="Filled stores, kept.")
    parser.add_argument("--purge-seconds", type=float, default=120.0)
    parser.add_argument("--runs", default="fresh,prefilled", help="Which runs: fresh, prefilled.")
    parser.add_argument("--workdir", type=Path, default=Path("var/bench-long"))
    parser.add_argument(
        "--blocks-per-call", type=int, default=None, help="publisher.blocks_per_call of the "
        "runs (default: the configuration's; 1: a catalog call per block, as earlier versions did)."
    )  # fmt: skip
    parser.add_argument(
        "--profile-store", action="store_true", help="Profile the store over each run's "
        "injection (aso sim --profile-store): where its time goes, in the run's report."
    )  # fmt: skip
    return parser.parse_args(argv)


def plan_of(args: argparse.Namespace, scale: float) -> Plan:
    return Plan(
        scale=scale,
        users=args.users,
        sites=args.sites,
        seed=args.seed,
        duration=parse_duration(args.duration),
        interval=parse_duration(args.interval),
        retry_delay=args.retry_delay,
        block_timeout=args.block_timeout,
        transfer_timeout=args.transfer_timeout,
    )


def options_of(args: argparse.Namespace, engine: str, name: str) -> RunOptions:
    workdir = args.workdir / name
    shutil.rmtree(workdir, ignore_errors=True)
    return RunOptions(
        workdir=workdir,
        engine=engine,
        bucket=parse_duration(args.bucket),
        drain_timeout=args.drain_timeout,
        uploaders=args.uploaders,
        run_token=f"long_{engine}",
        profile_store=args.profile_store,
        blocks_per_call=args.blocks_per_call,
    )


# -- what a store of a million requests costs ------------------------------------------------------
def index_sizes(admin: Server, config: Config) -> dict[str, int]:
    """Bytes on disk: the files database and its view indexes (CouchDB: each design
    document's, the statistics' included, as it reports them; the embedded store reports
    none: its directories)."""
    db = config.store.files_db
    info = admin.raw("GET", f"/{db}")
    if "sizes" not in info:
        dbs = config.path(config.embedded.data_dir) / "dbs"
        return {
            "database": directory_bytes(dbs / db),
            "views": sum(directory_bytes(p) for p in dbs.glob(f"{db}-mrview-*")),
        }
    sizes = {"database": int(info["sizes"]["file"])}
    for ddoc in bench_pages.view_design_documents(config):
        view = admin.raw("GET", f"/{db}/{ddoc['_id']}/_info")["view_index"]
        sizes[ddoc["_id"].split("/", 1)[1]] = int(view["sizes"]["file"])
    return sizes


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def compact(admin: Server, config: Config) -> float:
    """Seconds a compaction of the files database and of each view index takes (started,
    then waited for: CouchDB compacts in the background; the embedded store answers when it
    is done, minutes at 1M requests, past the client's usual read timeout)."""
    admin = bench_pages.patient_admin(admin, config)
    db = config.store.files_db
    views = bench_pages.view_design_documents(config)
    if "sizes" not in admin.raw("GET", f"/{db}"):
        views = []  # the embedded store compacts a database only, and answers when done
    started = time.monotonic()
    admin.raw("POST", f"/{db}/_compact", body={})
    for ddoc in views:
        admin.raw("POST", f"/{db}/_compact/{ddoc['_id'].split('/', 1)[1]}", body={})
    while True:
        running = bool(admin.raw("GET", f"/{db}").get("compact_running"))
        for ddoc in views:
            info = admin.raw("GET", f"/{db}/{ddoc['_id']}/_info")["view_index"]
            running = running or bool(info.get("compact_running"))
        if not running:
            return time.monotonic() - started
        time.sleep(1.0)


def purge_rate(admin: Server, config: Config, seconds: float) -> dict[str, float]:
    """The analytics purge of the prefilled requests (finished before the run), batch by
    batch for about `seconds`: requests purged per second."""
    files = admin.db(config.store.files_db)
    stats = admin.db(config.store.stats_db)
    patient = bench_pages.patient_admin(admin, config)
    # The purgeable view over a million requests is brought up to date first (not the purge's
    # own cost; timed: the statistics' design document is none of the pages', so its index is
    # built here for the first time unless the analytics read it before).
    started = time.monotonic()
    patient.db(config.store.files_db).view("stats", "purgeable", limit=1)
    built = time.monotonic() - started
    older_than = time.time() - 3 * 3600  # the prefill's requests, not the run's
    purged, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        report = purge.purge(
            files, stats, older_than=older_than, batch_size=config.analytics.batch,
            by="bench-long", lease=600.0, counts=storejs.contribution, max_batches=5,
        )  # fmt: skip
        purged += report.purged
        if not report.batches:
            break
    elapsed = time.monotonic() - started
    return {
        "purged": purged,
        "seconds": round(elapsed, 1),
        "per_s": round(purged / elapsed, 1),
        "purgeable_view_build_s": round(built, 1),
    }


def drop_unfinished(admin: Server, config: Config) -> int:
    """Deletes the requests of the store that some agent would still act on (the queue view's
    rows): the prefilled run measures a store of *finished* requests, and the fill's others
    name sites the run does not know (its agents would spend the window setting them aside).
    Returns how many were deleted."""
    db = admin.db(config.store.files_db)
    ids = sorted({row["id"] for row in db.view("queue", "work", reduce=False).rows})
    for start in range(0, len(ids), 2000):
        docs = db.get_many(ids[start : start + 2000])
        gone = [{"_id": d["_id"], "_rev": d["_rev"], "_deleted": True} for d in docs.values() if d]
        db.bulk_write(gone)
    return len(ids)


def summaries_caught_up(admin: Server, config: Config) -> dict[str, Any]:
    """The monitoring summaries brought up to now, as a running analytics agent keeps them: the
    fill's hours closed and the resume position at the end of the feed, so that the run's
    analytics agent reads the run's writes only (a store kept from the fill resumes where the
    fill left it; the first 1M run on the embedded store had its analytics read all 1M requests
    again beside the run). Returns the seconds it took and the requests read."""
    files, stats_db = admin.db(config.store.files_db), admin.db(config.store.stats_db)
    settings = config.analytics
    aggregator = summaries.Aggregator(
        files, stats_db, close_after=settings.close_after, batch=settings.batch
    )
    started = time.monotonic()
    report = aggregator.step()
    took = time.monotonic() - started
    console.print(
        f"monitoring summaries brought up to now: {report.read:,} requests read in {took:.0f} s, "
        f"{len(report.closed)} hours closed, {report.pending} requests pending"
    )
    return {"summaries_catch_up_s": round(took, 1), "summaries_catch_up_read": report.read}


def prepared_store(args: argparse.Namespace, engine: str) -> tuple[Path, dict[str, Any]]:
    """The data directory of a store filled with args.prefill requests, every view index
    built, stopped; the fill's figures and its size."""
    with bench_pages.filled_store(engine, args.prefill, 30, args.pages_dir) as (
        config,
        admin,
        figures,
    ):
        removed = drop_unfinished(admin, config)
        if removed:
            figures["unfinished_deleted"] = figures.get("unfinished_deleted", 0) + removed
            console.print(f"deleted the fill's {removed} requests still on their way")
        # Every index the run reads, the statistics' included (kept once built: a store of
        # bench-pages has the pages' indexes only).
        views = bench_pages.all_views(config)
        if set(figures.get("all_views_build_s") or ()) != {name for _, name in views}:
            figures["all_views_build_s"] = bench_pages.build_views(admin, config, views)
        if "compaction_before_copy_s" not in figures:
            # A store that has held a million requests for days has been compacted by the
            # store's own daemon (CouchDB's smoosh) all along; a fill of a million in half an
            # hour leaves it several times its live size, over smoosh's thresholds, and the
            # first 1M run on CouchDB had its copy compacted inside the window (the store at
            # 1.62 cores against the fresh store's 1.05). The run measures the kept store.
            figures["disk_bytes_as_filled"] = index_sizes(admin, config)
            figures["compaction_before_copy_s"] = round(compact(admin, config), 1)
        figures |= summaries_caught_up(admin, config)
        figures["disk_bytes"] = index_sizes(admin, config)
    root = bench_pages.store_root(args.pages_dir, engine, args.prefill)
    return root / "store", figures


def store_costs(options: RunOptions, config: Config, args: argparse.Namespace) -> dict[str, Any]:
    """After a prefilled run (the store started again from its workspace): compaction and
    purge, measured on the run's copy."""
    from aso.local.managed import local_store

    store = local_store(config)
    console.print(store.start())
    try:
        admin = Server.from_config(config, account="admin")
        costs: dict[str, Any] = {"disk_bytes_after_run": index_sizes(admin, config)}
        costs["compaction_s"] = round(compact(admin, config), 1)
        costs["disk_bytes_compacted"] = index_sizes(admin, config)
        costs["purge"] = purge_rate(admin, config, args.purge_seconds)
    finally:
        store.stop()
    return costs


# -- the table -------------------------------------------------------------------------------------
def row(name: str, report: Report) -> dict[str, Any]:
    steady = report.steady
    cpu = cpu_shares(report.samples)
    shares = report.writes_per_file or {}
    return {
        "run": name,
        "scale": report.plan.scale,
        "completed/expected": steady["ratio"],
        "backlog growth": steady["backlog_growth"],
        "overhead p95 s": steady["overhead"]["p95"],
        "done→published p95 s": steady["publish"]["p95"],
        "writes/file": shares.get("total"),
        "writes by database": writes_text(shares) if shares else "",
        "store writes/s": steady["store_writes_per_s"],
        "ceiling writes/s": round(report.ceiling) if report.ceiling else None,
        "store CPU (cores)": round(cpu.get("store", 0) + cpu.get("store-js", 0), 2),
        "of which JavaScript": cpu.get("store-js"),
        "holds": steady["holds"],
        "accounting exact": report.accounting.exact,
    }


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = ["" if r[k] is None else (f"{r[k]:g}" if isinstance(r[k], float) else str(r[k]))
                 for k in head]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or any(e not in GOAL_SCALE for e in engines):
        raise SystemExit("--engines: pouchdb and/or couchdb")
    runs = {r.strip() for r in args.runs.split(",")}
    started = time.monotonic()
    rows, results = [], {}
    for engine in engines:
        scale = args.scale_pouchdb if engine == "pouchdb" else args.scale_couchdb
        plan = plan_of(args, scale)
        if "fresh" in runs:
            name = f"{engine}-{scale:g}x"
            console.rule(f"{name}: {plan.files_per_second * 3600:,.0f} files/hour, fresh store")
            report = run_simulation(plan, options_of(args, engine, name), console)
            console.print(report.summary_line(), markup=False, highlight=False)
            rows.append(row(name, report))
            results[name] = report.to_dict() | {"rows": None}
        if "prefilled" in runs and args.prefill:
            name = f"{engine}-{scale:g}x-prefilled-{args.prefill}"
            data, filled = prepared_store(args, engine)
            console.rule(f"{name}: a copy of {data}")
            options = options_of(args, engine, name)
            options.store_data = data
            options.store_admin_password = bench_pages.ADMIN_PASSWORD
            options.keep_store = True
            report = run_simulation(plan, options, console)
            console.print(report.summary_line(), markup=False, highlight=False)
            rows.append(row(name, report))
            from aso.config import load

            config = load(str(options.workdir / "aso.toml"))
            results[name] = report.to_dict() | {"rows": None, "store": filled}
            results[name]["store"] |= store_costs(options, config, args)
            print_costs(name, results[name]["store"])
    console.rule("results")
    for line in markdown(rows) if rows else []:
        console.print(line, markup=False, highlight=False)
    args.workdir.mkdir(parents=True, exist_ok=True)
    (args.workdir / "summary.json").write_text(json.dumps(results, indent=1, default=str))
    console.print(f"{args.workdir}/summary.json; wall time {time.monotonic() - started:.0f} s")


def print_costs(name: str, store: dict[str, Any]) -> None:
    millions = store["requests"] / 1e6
    disk = store["disk_bytes"]
    per_million = sum(disk.values()) / millions / 1e9
    lines = [
        f"{name}: {store['requests']:,} requests filled at {bench_pages.fill_rate(store)}/s; "
        f"on disk {per_million:.2f} GB per million ("
        + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in disk.items())
        + ")",
        f"as filled {sum(store['disk_bytes_as_filled'].values()) / 1e9:.2f} GB, "
        f"compacted before the run in {store['compaction_before_copy_s']:.0f} s; monitoring "
        f"summaries brought up to now in {store.get('summaries_catch_up_s', 0):.0f} s "
        f"({store.get('summaries_catch_up_read', 0):,} requests read)",
        "view index builds: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in store.get("all_views_build_s", {}).items()),
        f"compaction of the database and its indexes after the run: {store['compaction_s']:.0f} s"
        f" ({sum(store['disk_bytes_after_run'].values()) / 1e9:.2f} GB → "
        f"{sum(store['disk_bytes_compacted'].values()) / 1e9:.2f} GB)",
        f"purge: {store['purge']['purged']} requests in {store['purge']['seconds']:.0f} s "
        f"({store['purge']['per_s']:.0f}/s), after its view (stats/purgeable) was brought up "
        f"to date in {store['purge']['purgeable_view_build_s']:.0f} s",
    ]
    for line in lines:
        console.print(line, markup=False, highlight=False)


if __name__ == "__main__":
    main()
