"""Benchmark: many concurrent TLS clients against the X.509 front end, and the same load
straight to the store, side by side in one run.

Starts an embedded store and `aso frontend` (session identity) on loopback with a throw-away
PKI, then runs rounds of `--clients` concurrent clients (spread over `--procs` processes, each
client a thread with its own keep-alive connection and its own user's proxy) for
`--seconds` each, alternating the two targets so that the machine's noise falls on both.
Each client loops: read a request document, read a page of the by_state view, and every
`--write-every` operations record a request of its own. Printed per target: operations/s,
latency percentiles, errors, and the front end's cost as a ratio of the direct figures;
then whether the front end still answers after the load.

    python -m aso.sim.bench_frontend [--clients 200] [--procs 4] [--seconds 15] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import multiprocessing
import multiprocessing.queues
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests
from rich.console import Console
from rich.table import Table

from aso import model
from aso.config import Config, render
from aso.local import pki
from aso.local.embedded import EmbeddedStore
from aso.local.stores import free_port
from aso.provision.designdocs import init_databases
from aso.store import Server
from aso.store import admin as store_admin

console = Console()
USERS = 20  # distinct users (store accounts the front end makes) among the clients
ClientResult = tuple[list[float], int]  # one client's latencies (s) and errors


@dataclasses.dataclass
class Target:
    name: str
    url: str
    files_db: str
    users: dict[str, str]  # user → proxy file (front end) or password (direct)
    verify: Any = True
    x509: bool = False


def _client(
    target: Target, index: int, deadline: float, write_every: int, out: list[ClientResult]
) -> None:
    user = sorted(target.users)[index % len(target.users)]
    session = requests.Session()
    session.trust_env = False  # $REQUESTS_CA_BUNDLE would replace session.verify
    if target.x509:
        session.cert, session.verify = target.users[user], target.verify
    else:
        session.auth = (user, target.users[user])
    base = f"{target.url}/{target.files_db}"
    latencies: list[float] = []
    errors = 0
    seed = model.request_of(
        user=user, task=f"261121_000000:{user}_bench", job_id="0", source="T2_CH_CERN",
        destination="T2_DE_DESY", source_lfn=f"/store/temp/user/{user}/b/{index}_{os.getpid()}_0",
        destination_lfn=f"/store/user/{user}/b/{index}_{os.getpid()}_0", size=1, adler32="00000001",
    )  # fmt: skip
    n = 0
    answer: requests.Response | requests.RequestException
    while time.monotonic() < deadline:
        n += 1
        started = time.perf_counter()
        try:
            if n % write_every == 1:
                doc = model.request_of(**{**_request_args(seed), "source_lfn":
                                           f"{seed['source_lfn']}_{n}", "destination_lfn":
                                           f"{seed['destination_lfn']}_{n}"})  # fmt: skip
                answer = session.post(base, json=doc, timeout=60)
                ok = answer.status_code == 201
            elif n % 2:
                view = f"{base}/_design/asyncstageout/_view/by_state"
                answer = session.get(view, params={"limit": "20", "reduce": "false"}, timeout=60)
                ok = answer.status_code == 200
            else:
                answer = session.get(f"{base}/{seed['_id']}", timeout=60)
                ok = answer.status_code in (200, 404)
        except requests.RequestException as exc:
            ok, answer = False, exc
        if ok:
            latencies.append(time.perf_counter() - started)
        else:
            if not errors:  # the first of each client, to say what went wrong
                what = getattr(answer, "text", str(answer))[:200].strip()
                print(
                    f"client {index}: {getattr(answer, 'status_code', '')} {what}", file=sys.stderr
                )
            errors += 1
    out.append((latencies, errors))


def _request_args(doc: dict[str, Any]) -> dict[str, Any]:
    keys = ("user", "task", "job_id", "source", "destination", "source_lfn", "destination_lfn",
            "size")  # fmt: skip
    return {k: doc[k] for k in keys} | {"adler32": doc["checksum"]["adler32"]}


def _process(
    target: Target,
    first: int,
    count: int,
    seconds: float,
    write_every: int,
    queue: multiprocessing.queues.Queue[list[ClientResult]],
) -> None:
    deadline = time.monotonic() + seconds
    out: list[ClientResult] = []
    threads = [
        threading.Thread(target=_client, args=(target, first + i, deadline, write_every, out))
        for i in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queue.put(out)


def run_round(
    target: Target, clients: int, procs: int, seconds: float, write_every: int
) -> tuple[float, list[float], int, int]:
    """(operations/s, latencies, errors, clients that reported) of one round."""
    queue: multiprocessing.queues.Queue[list[ClientResult]] = multiprocessing.Queue()
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    starts = [sum(per[:i]) for i in range(procs)]
    workers = [
        multiprocessing.Process(
            target=_process, args=(target, starts[i], per[i], seconds, write_every, queue)
        )
        for i in range(procs)
    ]
    began = time.monotonic()
    for worker in workers:
        worker.start()
    results = [item for _ in workers for item in queue.get()]
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - began
    latencies = [x for lat, _ in results for x in lat]
    errors = sum(e for _, e in results)
    return len(latencies) / elapsed, latencies, errors, len(results)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def start_frontend(config: Config, log: Path) -> subprocess.Popen[bytes]:
    aso = str(Path(sys.executable).parent / "aso")
    with open(log, "w") as out:
        process = subprocess.Popen([aso, "--config", str(config.source), "frontend"],
                                   stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 30
    while "listening" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the front end did not start: {log.read_text()}")
        time.sleep(0.1)
    return process


@dataclasses.dataclass
class Stack:
    """What `frontend_stack` started."""

    config: Config  # the store's (admin credentials included) and the front end's
    admin: Server
    authority: pki.Pki  # CA file, host credential, users' certificates
    url: str  # the front end
    frontend: subprocess.Popen[bytes]


@contextlib.contextmanager
def frontend_stack(root: Path, users: list[str]) -> Iterator[Stack]:
    """A throw-away embedded store with ASO's databases and `aso frontend` (session identity)
    on free loopback ports, under `root`, with a demo PKI in root/certs whose grid-mapfile maps
    each of `users` (aso-user); both stopped on leaving, whatever happened inside."""
    source = root / "aso.toml"
    config = Config(source=source)
    config.store.url = f"http://127.0.0.1:{free_port()}"
    config.store.admin_password = "bench-admin"
    config.store.agent_password = "bench-agent"
    config.embedded.data_dir = str(root / "store")
    authority = pki.Pki.create(root / "certs")
    (root / "certs" / "grid-mapfile").write_text(
        "".join(f'"{authority.user(u).dn}" {u}\n' for u in users)
    )
    port = free_port()
    config.frontend = dataclasses.replace(
        config.frontend, listen=f"127.0.0.1:{port}", secret="bench-frontend",
        host_cert=str(authority.host_cert), host_key=str(authority.host_key),
        capath=str(authority.capath), mapfile=str(root / "certs" / "grid-mapfile"),
    )  # fmt: skip
    source.write_text(render(config, show_secrets=True))
    embedded = EmbeddedStore(config)
    embedded.start()
    frontend = None
    try:
        admin = Server.from_config(config, account="admin")
        init_databases(admin, config)
        frontend = start_frontend(config, root / "frontend.log")
        yield Stack(config, admin, authority, f"https://127.0.0.1:{port}", frontend)
    finally:
        if frontend is not None:
            frontend.terminate()
            frontend.wait(30)
        embedded.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200, help="concurrent clients")
    parser.add_argument("--procs", type=int, default=4, help="client processes")
    parser.add_argument("--seconds", type=float, default=15, help="length of a round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per target")
    parser.add_argument("--write-every", type=int, default=10, help="one write per N operations")
    args = parser.parse_args(argv)

    users = [f"bench{i}" for i in range(USERS)]
    with (
        tempfile.TemporaryDirectory(prefix="aso-bench-fe-") as tmp,
        frontend_stack(Path(tmp), users) as stack,
    ):
        config, admin, authority = stack.config, stack.admin, stack.authority
        direct_users = {f"direct{i}": f"pw-direct{i}" for i in range(USERS)}
        for user, password in direct_users.items():
            store_admin.put_user(admin, user, password, [model.USER_ROLE])
        proxies = {u: str(authority.proxy_file(authority.user(u))) for u in users}
        files_db, ca = config.store.files_db, str(authority.ca_file)
        via = Target("front end (TLS, X.509)", stack.url, files_db, proxies, ca, x509=True)
        direct = Target("store direct (HTTP, basic)", config.store.url, files_db, direct_users)
        console.print(
            f"{args.clients} clients in {args.procs} processes, {args.rounds} rounds of "
            f"{args.seconds:.0f} s per target, one write per {args.write_every} operations"
        )
        figures: dict[str, list[tuple[float, list[float], int]]] = {via.name: [], direct.name: []}
        for n in range(args.rounds):
            for target in (via, direct) if n % 2 == 0 else (direct, via):
                rate, latencies, errors, ran = run_round(
                    target, args.clients, args.procs, args.seconds, args.write_every
                )
                figures[target.name].append((rate, latencies, errors))
                console.print(
                    f"round {n + 1} {target.name}: {ran} clients, {rate:.0f} ops/s, "
                    f"p50 {percentile(latencies, 50) * 1000:.0f} ms, {errors} errors"
                )
        report(figures, via.name, direct.name)
        probe = requests.get(f"{via.url}/_session", cert=proxies[users[0]],
                             verify=str(authority.ca_file), timeout=30)  # fmt: skip
        console.print(
            f"front end after the load: HTTP {probe.status_code}, "
            f"user {probe.json().get('userCtx', {}).get('name')}; "
            f"front end process {'running' if stack.frontend.poll() is None else 'DEAD'}"
        )


def report(figures: dict[str, list[tuple[float, list[float], int]]], via: str, direct: str) -> None:
    table = Table("target", "ops/s (median)", "p50 ms", "p95 ms", "p99 ms", "errors")
    medians = {}
    for name, rounds in figures.items():
        rate = statistics.median(r for r, _, _ in rounds)
        latencies = [x for _, lat, _ in rounds for x in lat]
        errors = sum(e for _, _, e in rounds)
        p = [percentile(latencies, q) * 1000 for q in (50, 95, 99)]
        medians[name] = (rate, p[0])
        table.add_row(name, f"{rate:.0f}", f"{p[0]:.0f}", f"{p[1]:.0f}", f"{p[2]:.0f}", str(errors))
    console.print(table)
    console.print(
        f"front end / direct: throughput {medians[via][0] / medians[direct][0]:.2f}x, "
        f"median latency {medians[via][1] / medians[direct][1]:.2f}x"
    )


if __name__ == "__main__":
    main()
