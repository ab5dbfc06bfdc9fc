"""Benchmark: the monitoring pages with many requests in the store (1M by default).

Fills a store (`--engines`: the embedded pouchdb-server, a local CouchDB node, or each in turn)
with synthetic requests whose histories spread over `--days` days (200
users, 60 sites, tasks of 1000 jobs; most done and cleaned, some failed after failed attempts,
half published, the last hour's still on their way), runs the monitoring summaries' first run
(aso.monitoring.summaries, as the analytics agent does), builds the view indexes the per-task,
per-link and publication pages read (unless --skip-views), then loads every page `--loads` times in
headless Chromium (Debian's, through Playwright) and prints, per page, the median and 95th
percentile of the time from navigation to the page's content on screen, the bytes it read and the
most requests one load made.

The filled store is kept in `--data-dir` (default var/bench-pages) and used again by the next run
with the same `--requests`: filling 1M requests and building the view indexes take long on the
embedded store (it builds each view index in a pass of its own, about 600 requests/s here).

    python -m aso.sim.bench_pages [--requests 1000000] [--days 30] [--loads 5] [--skip-views]
                              [--summaries-again] [--engines pouchdb,couchdb]
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import json
import random
import resource
import shutil
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from aso import model
from aso.config import Config, render
from aso.local.managed import local_store
from aso.local.stores import free_port
from aso.monitoring import summaries
from aso.provision.designdocs import design_documents, init_databases, pages_url
from aso.store import Database, Server, Settings, StoreError, WriteResult
from aso.store import admin as store_admin

console = Console()
USERS, SITES, JOBS_PER_TASK = 200, 60, 1000
PAGE_VIEWS = ("by_task", "links", "publication_blocks")  # what the pages' key-range reads use


def site(i: int) -> str:
    return f"T2_X{i:02d}_Site"


def synthetic(i: int, now: float, days: float, rng: random.Random) -> dict[str, Any]:
    """Request number i: a valid document, its life so far."""
    task_no = i // JOBS_PER_TASK
    user = f"user{task_no % USERS:03d}"
    task = f"261101_000000:{user}_task{task_no:06d}"
    src, dst = site(rng.randrange(SITES)), site((task_no * 7) % SITES)
    if src == dst:
        src = site((task_no * 7 + 1) % SITES)
    lfn = f"/store/temp/user/{user}/bench/{task_no:06d}/out_{i}.root"
    created = now - rng.random() * days * 86400
    size = rng.randrange(10**6, 4 * 10**9)
    publish = task_no % 2 == 0
    doc: dict[str, Any] = {
        "_id": model.request_id(lfn), "type": model.REQUEST_TYPE, "schema": model.SCHEMA_VERSION,
        "user": user, "task": task, "job_id": str(i % JOBS_PER_TASK), "job_retry": 0,
        "file_type": "output", "source": src, "destination": dst, "source_lfn": lfn,
        "destination_lfn": lfn.replace("/store/temp/user/", "/store/user/"), "size": size,
        "checksum": {"adler32": f"{i:08x}"[-8:]}, "publish": publish, "state": "new",
        "cleanup": "pending", "publication": "pending" if publish else "not_required",
        "created": created, "last_update": created,
        "history": [{"axis": "state", "from": None, "to": "new", "at": created, "by": user}],
    }  # fmt: skip
    if publish:
        doc["publish_info"] = {"dataset": f"/Bench/{user}-task{task_no}-v1/USER"}
    t = created
    fresh = now - created < 3600  # the last hour's requests are still on their way

    def move(axis: str, to: str, after: float, by: str = "bench-agent") -> None:
        nonlocal t
        t = min(t + after, now)
        doc["history"].append({"axis": axis, "from": doc[axis], "to": to, "at": t, "by": by})
        doc[axis], doc["last_update"] = to, t

    if fresh and rng.random() < 0.5:
        return doc
    attempts = []
    tries = 1 + (rng.random() < 0.08) + (rng.random() < 0.02)
    for n in range(tries):
        move("state", "submitted", 35)
        if fresh and rng.random() < 0.5:
            break
        job: dict[str, Any] = {
            "job_id": f"{i:08x}-{n}",
            "service": "https://fts3.example:8446",
            "submitted": t,
        }
        attempts.append(job)
        # The last try ends the request: copied (97 %) or given up (stores filled by earlier
        # versions left 3 % of the requests `new` after a failed only try).
        last = n == tries - 1
        if last and rng.random() < 0.97:
            job.update(ended=t + 20 + rng.expovariate(1 / 40), outcome="done")
            move("state", "done", job["ended"] - t)
            move("cleanup", "cleaned", 60)
            if publish:
                move("publication", "published", 600)
            break
        cls = rng.choice(["timeout", "io"])
        job.update(ended=t + 60, outcome="failed", error_class=cls)
        # As a transfer service words it: the file's URL varies, the cause does not.
        job["reason"] = f"TRANSFER ERROR: {cls} copying davs://{src.lower()}.example{lfn}"
        move("state", "failed_attempt", 60)
        if last:
            move("state", "failed", 1)
            break
        move("state", "retry", 1)
        move("state", "new", 300)
    doc["attempts"] = attempts
    return doc


VALIDATING_DDOC = "_design/asyncstageout"  # the files database's validate_doc_update


def validating_ddoc(db: Database) -> dict[str, Any]:
    """The files database's design document with validate_doc_update (init_databases wrote it)."""
    ddoc = db.get(VALIDATING_DDOC)
    assert ddoc is not None, VALIDATING_DDOC
    return ddoc


def fill(admin: Server, config: Config, n: int, days: float, now: float) -> float:
    """Write n synthetic requests; requests/s. The store's validation is set aside meanwhile
    (the fill is not what is measured; a test run of 20,000 passed it) and put back after."""
    db = admin.db(config.store.files_db)
    pages_ddoc = validating_ddoc(db)
    db.put({k: v for k, v in pages_ddoc.items() if k != "validate_doc_update"})
    rng = random.Random(42)
    started = time.monotonic()
    batch = 1000
    with (
        Progress(console=console) as progress,
        concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool,
    ):
        bar = progress.add_task("requests written", total=n)
        in_flight: list[concurrent.futures.Future[list[WriteResult]]] = []
        for first in range(0, n, batch):
            docs = [synthetic(i, now, days, rng) for i in range(first, min(n, first + batch))]
            in_flight.append(pool.submit(db.bulk_write, docs))
            if len(in_flight) >= 3:
                results = in_flight.pop(0).result()
                assert all(r.ok for r in results), [r for r in results if not r.ok][:3]
                progress.advance(bar, len(results))
        for future in in_flight:
            progress.advance(bar, len(future.result()))
    rate = n / (time.monotonic() - started)
    db.put(dict(pages_ddoc, _rev=validating_ddoc(db)["_rev"]))  # the validation back
    assert "validate_doc_update" in validating_ddoc(db)
    return rate


def first_summaries(admin: Server, config: Config) -> dict[str, Any]:
    """The monitoring summaries' first run over the whole store: seconds, hours, peak memory."""
    files, stats_db = admin.db(config.store.files_db), admin.db(config.store.stats_db)
    aggregator = summaries.Aggregator(files, stats_db)
    started = time.monotonic()
    report = aggregator.step()
    return {
        "summaries_first_run_s": time.monotonic() - started,
        "summaries_hours": len(report.closed),
        "summaries_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def view_design_documents(config: Config) -> list[dict[str, Any]]:
    """The files database's design documents with views, the statistics' included."""
    return [d for d in design_documents(config) if d.get("views")]


def all_views(config: Config) -> list[tuple[str, str]]:
    """(design document, view) of every view of the files database: what the agents, `aso
    status` and the pages read, and the statistics' (the analytics agent reads them: a store
    kept for days has them built; a prefilled run that built them from nothing during its
    window measured that build, not the store's size)."""
    return [
        (ddoc["_id"].split("/", 1)[1], name)
        for ddoc in view_design_documents(config)
        for name in ddoc["views"]
    ]


def patient_admin(admin: Server, config: Config) -> Server:
    """The admin's client for calls that answer when a long job is done (an index build, the
    embedded store's compaction: minutes at 1M requests): no read timeout to speak of, and no
    retry, which would start the job again behind the first."""
    return Server(
        admin.url,
        config.store.admin_user,
        config.store.admin_password,
        Settings(read_timeout=6 * 3600, retries=0),
    )


def build_views(
    admin: Server, config: Config, views: list[tuple[str, str]] | None = None
) -> dict[str, float]:
    """Seconds to bring each view index (default: those the pages read) up to date (the
    embedded store answers once the index is built: tens of minutes at 1M requests, so no
    read timeout to speak of). CouchDB builds a design document's views together: the first
    view of one pays for all of them."""
    db = patient_admin(admin, config).db(config.store.files_db)
    seconds = {}
    for ddoc, name in views or [("asyncstageout", view) for view in PAGE_VIEWS]:
        started = time.monotonic()
        while True:
            try:
                db.view(ddoc, name, limit=1, reduce=False)
                break
            except StoreError as exc:
                # CouchDB answers a read that waits for a long build `500 timeout` and goes on
                # building: ask again until the index is there.
                if exc.status != 500 or exc.error != "timeout":
                    raise
        seconds[name] = time.monotonic() - started
        console.print(f"view {name}: index built in {seconds[name]:.0f} s")
    return seconds


def pages(admin: Server, config: Config) -> dict[str, str]:
    """page name → hash of the page, for a busy task, link and file of the store."""
    stats_db = admin.db(config.store.stats_db)
    live_links = stats_db.get(summaries.LIVE_LINKS_ID)
    assert live_links is not None, summaries.LIVE_LINKS_ID  # the summaries' first run wrote it
    links = live_links["links"]
    busiest = max(links, key=lambda name: sum(links[name].values()))
    db = admin.db(config.store.files_db)
    first = db.changes("0", limit=20, include_docs=True).results
    one = next(c["doc"] for c in first if c["doc"].get("type") == model.REQUEST_TYPE)
    return {
        "overview (24 h)": "#overview",
        "overview (30 days)": "#overview?window=30d",
        "links": "#links",
        "errors (24 h)": "#errors",
        "errors (7 days)": "#errors?window=7d",
        "users": "#users",
        "user": f"#user/{one['user']}",
        "publication": "#publication",
        "agents": "#agents",
        "task (1000 files)": f"#task/{one['task']}",
        "file": f"#file/{one['_id']}",
        "link": f"#link/{busiest}",
    }


PAGE_DONE = {  # what is on screen once a page has loaded
    "#overview": "#hourly",
    "#links": "#worst",
    "#users": "#users",
    "#publication": "#publication-failed",
    "#agents": "#agents",
    "#task": "#files",
    "#file": "#attempts",
    "#link": "#link-tasks",
    "#errors": "#error-groups",
    "#user": "#user-states",
}


def load_pages(
    config: Config, password: str, targets: dict[str, str], loads: int
) -> dict[str, dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    base = pages_url(config)
    auth = base64.b64encode(f"benchuser:{password}".encode()).decode()
    figures: dict[str, dict[str, Any]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        context = browser.new_context(extra_http_headers={"Authorization": f"Basic {auth}"})
        page = context.new_page()
        received = {"bytes": 0, "requests": 0}

        def count(response: Any) -> None:
            received["requests"] += 1
            # A redirect or an aborted load has no body.
            with contextlib.suppress(Exception):
                received["bytes"] += len(response.body())

        page.on("response", count)
        for name, fragment in targets.items():
            done = PAGE_DONE[fragment.split("/")[0].split("?")[0]]
            times, sizes, requests = [], [], []
            for _ in range(loads + 1):  # the first load warms the browser's and store's caches
                received["bytes"] = received["requests"] = 0
                page.goto("about:blank")
                started = time.perf_counter()
                page.goto(base + fragment)
                page.wait_for_selector(done, timeout=600_000)
                times.append(time.perf_counter() - started)
                page.wait_for_load_state("networkidle")  # the page's last reads counted too
                sizes.append(received["bytes"])
                requests.append(received["requests"])
            times = times[1:]
            figures[name] = {
                "median_s": statistics.median(times),
                "p95_s": sorted(times)[max(0, round(0.95 * len(times)) - 1)],
                "bytes": statistics.median(sizes[1:]),
                "requests": max(requests[1:]),
            }
        browser.close()
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000, help="requests in the store")
    parser.add_argument("--days", type=float, default=30, help="days their histories span")
    parser.add_argument("--loads", type=int, default=5, help="loads of each page")
    parser.add_argument("--data-dir", default="var/bench-pages", help="kept between runs")
    parser.add_argument(
        "--engines",
        default="pouchdb",
        help="stores to measure, one after the other: pouchdb, couchdb or pouchdb,couchdb",
    )
    parser.add_argument("--skip-views", action="store_true", help="no task/link/publication pages")
    parser.add_argument(
        "--summaries-again", action="store_true", help="redo the summaries' first run"
    )
    args = parser.parse_args(argv)
    for engine in args.engines.split(","):
        report_figures(run(engine, args))


ADMIN_PASSWORD = "bench-admin"  # the filled stores' admin (sim/bench_long.py runs copies)


def store_root(data_dir: str | Path, engine: str, requests: int) -> Path:
    """Where the store filled with `requests` requests of `engine` is kept."""
    name = str(requests) if engine == "pouchdb" else f"{engine}-{requests}"
    return Path(data_dir).resolve() / name


@contextlib.contextmanager
def filled_store(
    engine: str,
    requests: int,
    days: float,
    data_dir: str | Path,
    *,
    summaries_again: bool = False,
) -> Iterator[tuple[Config, Server, dict[str, Any]]]:
    """A running store of `engine` filled with `requests` requests (filled now, or kept from an
    earlier run in `data_dir`) with their summaries' first run; its config, admin and the
    figures of the fill (kept in filled.json beside it). The store stops at the end."""
    root = store_root(data_dir, engine, requests)
    root.mkdir(parents=True, exist_ok=True)
    marker = root / "filled.json"
    source = root / "aso.toml"
    config = Config(source=source)
    config.store.engine = engine
    config.store.url = f"http://127.0.0.1:{free_port()}"
    config.store.admin_password = ADMIN_PASSWORD
    config.store.agent_password = "bench-agent"
    config.embedded.data_dir = str(root / "store")
    source.write_text(render(config, show_secrets=True))
    store = local_store(config)
    console.print(store.start())
    try:
        admin = Server.from_config(config, account="admin")
        init_databases(admin, config)
        store_admin.put_user(admin, "benchuser", "bench-user", [model.USER_ROLE])
        figures: dict[str, Any] = {"engine": engine, "requests": requests, "days": days}
        if marker.exists():
            figures.update(json.loads(marker.read_text()))
            console.print(f"using the {requests} requests filled before in {root}")
        else:
            figures["fill_per_s"] = fill(admin, config, requests, days, time.time())
            marker.write_text(json.dumps(figures))  # kept: a later step's failure refills nothing
        if summaries_again or "summaries_first_run_s" not in figures:
            store_admin.delete_db(admin, config.store.stats_db)
            init_databases(admin, config)
            figures.update(first_summaries(admin, config))
        marker.write_text(json.dumps(figures))
        yield config, admin, figures
        marker.write_text(json.dumps({k: v for k, v in figures.items() if k != "pages"}))
    finally:
        store.stop()


def run(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """Fill (or reuse) a store of `engine` with args.requests requests; the figures."""
    with filled_store(
        engine, args.requests, args.days, args.data_dir, summaries_again=args.summaries_again
    ) as (config, admin, figures):
        targets = pages(admin, config)
        if args.skip_views:
            targets = {k: v for k, v in targets.items() if not v.startswith(("#task/", "#link/"))}
            targets.pop("publication")
        else:
            # Every view the pages read (the users' design document too); nothing to do if
            # built before: that figure is kept.
            built = build_views(admin, config, all_views(config))
            figures["view_build_s"] = figures.get("view_build_s") or built
        figures["pages"] = load_pages(config, "bench-user", targets, args.loads)
    return figures


def fill_rate(figures: dict[str, Any]) -> str:
    """The fill's requests per second, or "?" for a store filled before the rate was kept."""
    rate = figures.get("fill_per_s")
    return f"{rate:.0f}" if rate else "?"


def report_figures(figures: dict[str, Any]) -> None:
    console.print(
        f"{figures.get('engine', 'pouchdb')}: "
        f"{figures['requests']} requests over {figures['days']:.0f} days; filled at "
        f"{fill_rate(figures)} requests/s; monitoring summaries' first run "
        f"{figures['summaries_first_run_s']:.0f} s ({figures['summaries_hours']} hours, peak "
        f"memory {figures.get('summaries_peak_rss_mb', 0):.0f} MB)"
    )
    for name, seconds in (figures.get("view_build_s") or {}).items():
        console.print(f"view index {name}: built in {seconds:.0f} s")
    table = Table(title="page loads (navigation → content on screen), headless Chromium")
    for column in ("page", "median (s)", "p95 (s)", "bytes read", "store requests"):
        table.add_column(column, justify="left" if column == "page" else "right")
    for name, f in figures["pages"].items():
        table.add_row(
            name,
            f"{f['median_s']:.3f}",
            f"{f['p95_s']:.3f}",
            f"{f['bytes']:.0f}",
            str(f.get("requests", "")),
        )
    console.print(table)


if __name__ == "__main__":
    main()
