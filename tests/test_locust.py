"""The Locust load test (sim/locustfile.py, run as sim/bench_locust.py runs it) against a real
front end process in front of the session's store: both kinds of users make their requests,
none fails, and every request a job wrapper was told was recorded is in the store, in the name
of the user its proxy maps to."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from aso.local.pki import Pki
from aso.sim import bench_locust
from aso.store import Server
from tests.test_frontend import frontend, pki  # noqa: F401  (the fixtures: a PKI, a front end)

USERS, SECONDS = 4, 8
ROOT = Path(__file__).resolve().parent.parent


def test_job_wrappers_and_crab_clients_through_the_front_end(
    frontend: str,  # noqa: F811
    pki: Pki,  # noqa: F811
    files_db: str,
    admin: Server,
    tmp_path: Path,
) -> None:
    proxies = bench_locust.write_proxies(pki, ["carol", "dave"], USERS, tmp_path / "proxies")
    env = bench_locust.locust_env(pki.ca_file, proxies, files_db, crab_share=0.5)
    code, rows = bench_locust.run_locust(
        frontend, env, users=USERS, spawn_rate=USERS, seconds=SECONDS, workdir=tmp_path
    )
    by_name = {r.name: r for r in rows}
    assert code == 0, rows
    # A client starts following a task at the store's sequence (`status seq`) and asks what
    # changed after it on its next polls (`status since`, once the task has files it knows).
    assert {"session", "upload job", "status counts", "status seq"} <= set(by_name)
    assert by_name["session"].requests == USERS  # each user asked who it is, once
    assert all(r.failures == 0 for r in rows), rows
    assert by_name["upload job"].requests > 0 and by_name["status counts"].requests > 0

    recorded = admin.db(files_db).view("asyncstageout", "by_task").rows
    assert len(recorded) == bench_locust.uploaded(rows)
    assert bench_locust.recorded_requests(admin.db(files_db)) == len(recorded)
    # One output and one log per job, each in its proxy's user's name and in one of its tasks.
    assert {r["key"][2] for r in recorded} == {"output", "log"}
    for row in recorded:
        user = row["value"]["user"]
        assert user in ("carol", "dave")
        assert row["key"][0].startswith(f"261121_120000:{user}_crab_locust")


def test_the_wrapper_starts_runs_reports_and_stops_everything() -> None:
    """`python -m aso.sim.bench_locust` end to end: its own store, front end and PKI, one line per
    request type, the store's count checked, and nothing of it left running."""
    command = [sys.executable, "-m", "aso.sim.bench_locust", "--users", "4", "--spawn-rate", "4",
               "--seconds", "5", "--grid-users", "2"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split()[0] for line in done.stdout.splitlines() if " req/s " in line}
    assert {"session", "upload", "status", "Aggregated"} <= lines, done.stdout
    stored = re.search(r"store: (\d+) requests recorded, (\d+) uploaded", done.stdout)
    assert stored and stored[1] == stored[2] and int(stored[1]) > 0, done.stdout
    url = re.search(r"against (https://\S+)", done.stdout)
    assert url, done.stdout
    with pytest.raises(requests.ConnectionError):  # the front end is gone
        requests.get(url[1], timeout=5, verify=False)
