"""Load test of the X.509 front end with Locust (sim/locustfile.py), bounded in users and time.

Starts a throw-away embedded store and `aso frontend` on free loopback ports with a demo PKI
for `--grid-users` users (aso.sim.bench_frontend.frontend_stack), writes one proxy per simulated
user, and runs locust headless against the front end: job wrappers uploading transfer
requests and CRAB-style clients polling task status. Printed: one line per request type with
requests/s, failures and latency p50/p95/p99 (from locust's `_stats.csv`), then whether the
store holds every request the job wrappers were told was recorded. Everything it started is
stopped at the end, on Ctrl-C and on errors. Exit code 1 when locust saw failures or the
store's count disagrees.

    python -m aso.sim.bench_locust [--users 50] [--spawn-rate 10] [--seconds 60] [--crab-share 0.5]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from aso.local import pki
from aso.sim.bench_frontend import frontend_stack
from aso.store import Database

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
LOCUST = str(Path(sys.executable).parent / "locust")
UPLOAD = "upload job"  # the locustfile's name for a job's _bulk_docs
STOP_TIMEOUT = 10  # seconds the users get at the end to finish their request in flight


@dataclasses.dataclass
class Row:
    """One line of locust's _stats.csv (latencies in ms)."""

    method: str
    name: str
    requests: int
    failures: int
    rps: float
    p50: float
    p95: float
    p99: float


def write_proxies(authority: pki.Pki, users: list[str], count: int, directory: Path) -> Path:
    """`count` proxy files, of the grid users in turn: each simulated user gets a TLS identity
    of its own, as each grid job has its own proxy, while many share a grid user."""
    directory.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        user = users[n % len(users)]
        proxy = pki.make_proxy(authority.user(user))
        pki.write_proxy(directory / f"x509up_{n:04d}_{user}", proxy)
    return directory


def locust_env(ca: Path, proxies: Path, files_db: str, crab_share: float) -> dict[str, str]:
    """The locustfile's configuration (sim/locustfile.py's docstring)."""
    return os.environ | {
        "ASO_LOCUST_CA": str(ca),
        "ASO_LOCUST_PROXIES": str(proxies),
        "ASO_LOCUST_FILES_DB": files_db,
        "ASO_LOCUST_CRAB_SHARE": str(crab_share),
    }


def locust_command(url: str, users: int, rate: float, seconds: int, prefix: Path) -> list[str]:
    return [
        LOCUST, "-f", str(LOCUSTFILE), "--headless", "-u", str(users), "-r", str(rate),
        "-t", f"{seconds}s", "--host", url, "--csv", str(prefix), "--only-summary",
        # Without it a request in flight at the end is cut and never counted, so the store
        # could hold more requests than the stats say were uploaded.
        "--stop-timeout", str(STOP_TIMEOUT),
    ]  # fmt: skip


def run_locust(
    url: str,
    env: dict[str, str],
    *,
    users: int,
    spawn_rate: float,
    seconds: int,
    workdir: Path,
) -> tuple[int, list[Row]]:
    """Run locust headless to its end; (its exit code, its stats per request type)."""
    prefix = workdir / "locust"
    command = locust_command(url, users, spawn_rate, seconds, prefix)
    # A hard bound as well: start-up, the run, the stop timeout, and room to spare.
    done = subprocess.run(command, env=env, timeout=seconds + STOP_TIMEOUT + 120)
    return done.returncode, parse_stats(prefix.with_name(prefix.name + "_stats.csv"))


def parse_stats(path: Path) -> list[Row]:
    """The rows of locust's _stats.csv, the Aggregated one last."""
    with open(path, newline="") as handle:
        return [
            Row(
                method=line["Type"],
                name=line["Name"],
                requests=int(line["Request Count"]),
                failures=int(line["Failure Count"]),
                rps=float(line["Requests/s"]),
                p50=_ms(line["50%"]),
                p95=_ms(line["95%"]),
                p99=_ms(line["99%"]),
            )
            for line in csv.DictReader(handle)
        ]


def _ms(value: str) -> float:
    return float("nan") if value in ("", "N/A") else float(value)


def format_row(row: Row) -> str:
    return (
        f"{row.name:<14} {row.method:<5} {row.requests:>7} requests {row.rps:>8.1f} req/s "
        f"{row.failures:>5} failures   p50 {row.p50:>6.0f} ms  p95 {row.p95:>6.0f} ms  "
        f"p99 {row.p99:>6.0f} ms"
    )


def recorded_requests(db: Database) -> int:
    """Transfer requests in the files database (one by_task row each)."""
    return db.view("asyncstageout", "by_task", limit=0).total_rows or 0


def uploaded(rows: list[Row]) -> int:
    """Requests the job wrappers were told were recorded: two per successful upload."""
    return sum(2 * (r.requests - r.failures) for r in rows if r.name == UPLOAD)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=50, help="simulated users")
    parser.add_argument("--spawn-rate", type=float, default=10, help="users started per second")
    parser.add_argument("--seconds", type=int, default=60, help="length of the run")
    parser.add_argument("--crab-share", type=float, default=0.5,
                        help="share of the users that are CRAB clients")  # fmt: skip
    parser.add_argument("--grid-users", type=int, default=20, help="distinct grid users")
    args = parser.parse_args(argv)
    # `kill` as well as Ctrl-C: unwind, so that the front end and the store are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    users = [f"grid{i:02d}" for i in range(args.grid_users)]
    with (
        tempfile.TemporaryDirectory(prefix="aso-bench-locust-") as tmp,
        frontend_stack(Path(tmp), users) as stack,
    ):
        root = Path(tmp)
        proxies = write_proxies(stack.authority, users, args.users, root / "proxies")
        env = locust_env(stack.authority.ca_file, proxies, stack.config.store.files_db,
                         args.crab_share)  # fmt: skip
        print(
            f"locust: {args.users} users ({args.crab_share:.0%} CRAB clients, "
            f"{args.grid_users} grid users), {args.spawn_rate:g}/s, {args.seconds} s "
            f"against {stack.url}",
            flush=True,
        )
        code, rows = run_locust(stack.url, env, users=args.users, spawn_rate=args.spawn_rate,
                                seconds=args.seconds, workdir=root)  # fmt: skip
        for row in rows:
            print(format_row(row))
        stored = recorded_requests(stack.admin.db(stack.config.store.files_db))
        print(f"store: {stored} requests recorded, {uploaded(rows)} uploaded by the job wrappers")
    failures = sum(r.failures for r in rows if r.name != "Aggregated")
    if code or failures or stored != uploaded(rows):
        raise SystemExit(1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # locust, the front end and the store are stopped by then
        print("interrupted", file=sys.stderr)
        sys.exit(130)
