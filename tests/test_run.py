"""`aso run` as an operator runs it: the embedded store, storage and every agent as supervised
processes; `aso demo` moves real files through it; a killed agent is started again; SIGTERM
stops everything it started and nothing else."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from aso.catalog.embedded import EmbeddedCatalog
from aso.config import Config, load, render
from aso.local import pki
from aso.local.managed import local_store
from aso.local.stores import free_port
from aso.local.xrootd import EmbeddedStorage, export_path
from aso.provision.designdocs import pages_url
from aso.store import EMBEDDED, NotFound, Server, Settings, StoreUnavailable
from aso.store import admin as store_admin
from aso.supervisor import STORE_CHECK, STORE_RESTARTS, hang_of
from tests.browser_helpers import see_the_overview
from tests.conftest import ENGINE, make_config, only_on, write_config
from tests.pipeline_helpers import wait_for
from tests.storage_helpers import (
    assert_never_copied_twice_at_once,
    reachable_tmp_dir,
    storage_config,
)

ASO = str(Path(sys.executable).parent / "aso")
REPO = Path(__file__).resolve().parent.parent  # `make stop` stops the `aso run` started here


# Lines every XRootD server logs all the time (the supervisor's health checks, clients closing
# after an answer): left out of a report so that what is unusual shows.
XROOTD_ROUTINE = (
    "connection reset by peer",
    "login as nobody",
    "disc 0:00:0",
    "Unable to locate",
    "event=PULL_START",
    "event=TRANSFER_SUCCESS",
)


def tail(path: Path, lines: int, skip: tuple[str, ...] = ()) -> str:
    kept = [
        line
        for line in path.read_text(errors="replace").splitlines()
        if not any(s in line for s in skip)
    ]
    return "\n".join(kept[-lines:])


def store_report(config_path: Path) -> list[str]:
    """How old each agent's heartbeat is, where the gfal jobs and the files stand."""
    config = load(str(config_path))
    settings = Settings(retries=0, read_timeout=20)  # a hung store must not hang the report
    admin = Server(config.store.url, "admin", config.store.admin_password, settings)
    now = time.time()
    files = admin.db(config.store.files_db).all_docs("", "\ufff0")
    out = ["--- heartbeats (agent instance: seconds since, stopped) ---"]
    for d in files:
        if d["_id"].startswith("heartbeat:"):
            age = now - d["last_seen"]
            out.append(f"{d['agent']} {d['instance']}: {age:.0f} s {d.get('stopped')}")
    out.append("--- gfal jobs (id state lease-owner lease-left files-by-state) ---")
    for job in admin.db(config.store.transfers_db).all_docs("", "\ufff0"):
        if "files" in job:
            lease = job.get("lease") or {}
            left = f"{lease['until'] - now:.0f} s" if lease else "-"
            per_state = Counter(e["state"] for e in job["files"].values())
            out.append(f"{job['_id']} {job['state']} {lease.get('owner')} {left} {dict(per_state)}")
    out.append("--- files by state ---")
    states = Counter(d["state"] for d in files if d.get("type") == "transfer_request")
    return out + [f"{state}: {n}" for state, n in sorted(states.items())]


def demo_failed(run: subprocess.CompletedProcess[str], base: Path, config_path: Path) -> str:
    output = (run.stdout + run.stderr).splitlines()
    return (
        service_logs(base, config_path)
        + "\n=== the command's last lines ===\n"
        + "\n".join(output[-8:])
    )


STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
OURS = ("/aso/", "/agents/", "/sim/")


def one_line(frames: list[str], keep: int = 4) -> str:
    """A thread's stack on one line: the innermost frame (what it waits in), then the
    innermost frames of ours (why); frames of libraries are marked `~`."""
    ours = [f for f in frames[1:] if not f.startswith("~")]
    return " < ".join(frames[:1] + ours[: keep - 1])


def condensed_stacks(text: str) -> tuple[list[str], list[str]]:
    """A log split into its own lines and its last faulthandler dump, one line a thread
    (the main thread's prefixed `main:`), so that sixteen threads' stacks fit a CI report."""
    lines: list[str] = []
    threads: list[tuple[bool, list[str]]] = []
    current: list[str] | None = None
    in_dump = False
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            if not in_dump:
                threads = []  # a new dump: keep the last one only
            in_dump, current = True, []
            # The thread that ran the signal handler is the main one: the agent's loop.
            threads.append((line.startswith("Current"), current))
        elif in_dump and (frame := STACK_FRAME.search(line)):
            if current is not None:
                path, number, function = frame.groups()
                # The store client's plumbing says less than who called it.
                ours = any(part in path for part in OURS) and "aso/store/" not in path
                current.append(f"{'' if ours else '~'}{function}@{Path(path).name}:{number}")
        elif in_dump and not line.strip():
            current = None  # the blank line between two threads
        else:
            in_dump, current = False, None
            lines.append(line)
    return lines, [("main: " if main else "") + one_line(frames) for main, frames in threads]


def hang_dumps(base: Path) -> list[str]:
    """Each agent that its hang watchdog ended: the first such dump's threads, one a line."""
    found = []
    for log in sorted(base.rglob("var/log/*.log")):
        text = log.read_text(errors="replace")
        if (at := text.find("Timeout (")) >= 0:
            end = text.find(" starting (store ", at)
            _, threads = condensed_stacks(text[at : end if end > 0 else len(text)])
            found += [f"{log.name}: {text[at : text.find(chr(10), at)]} stuck; threads:", *threads]
    return found


def service_logs(base: Path, config_path: Path) -> str:
    """Why a step did not happen, in about a hundred lines, the most telling last (a CI report
    shows the end of the output, not all of it): the storage servers' unusual lines, each
    agent's threads (SIGUSR1 makes it write its stacks into its log), one line a thread, and
    the end of its log, then the store's picture."""
    for line in our_processes(str(base)):
        if " agent " in line:
            os.kill(int(line.split()[0]), signal.SIGUSR1)
    time.sleep(2)
    parts = ["", "=== why: storage, agents' threads and logs, the store ==="]
    for log in sorted(base.rglob("storage/*/log/xrootd.log")):
        parts.append(f"--- {log.relative_to(base)} ---\n{tail(log, 3, XROOTD_ROUTINE)}")
    parts.append(f"--- run.log ---\n{tail(base / 'run.log', 4)}")
    logs = sorted(base.rglob("var/log/*.log"), key=lambda p: "gfal-worker" in p.name)
    for log in logs:
        lines, threads = condensed_stacks(log.read_text(errors="replace"))
        keep = 10 if "gfal-worker" in log.name else 3
        if "gfal-worker" not in log.name:
            threads = [t for t in threads if t.startswith("main:")]
        parts.append(f"--- {log.name}: threads ({len(threads)}), then its last lines ---")
        parts += [*threads, *lines[-keep:]]
    parts += hang_dumps(base)
    try:
        parts += store_report(config_path)
    except Exception as exc:  # the report must not hide the failure it explains
        parts.append(f"(no store report: {exc!r})")
    return "\n".join(parts)


def our_processes(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eww" not in line]


@pytest.fixture()
def service() -> Iterator[tuple[Path, subprocess.Popen[str], Path]]:
    """`aso run` on a config of its own: store, three storage sites, agents (gfal back end)."""
    with reachable_tmp_dir("aso-run-test-") as base:
        # As `aso config init` leaves it: the front end on, with a throw-away PKI, which the
        # sites use too (`aso run` is processes of its own: no other PKI is met in them).
        certs = base / "certs"
        pki.demo(certs, ["alice", "bob"])
        sites = ["T2_CH_CERN", "T2_IT_Pisa", "T2_DE_DESY"]
        config = storage_config(base, sites, "https", certs)
        config.store.url = f"http://127.0.0.1:{free_port()}"
        config.store.engine = ENGINE  # the store of this leg, which `aso run` starts itself
        config.store.admin_password = "run-test-admin"
        config.store.agent_password = "run-test-agent"
        config.embedded.data_dir = str(base / "store")
        config.agents.poll_interval = 0.5
        config.agents.heartbeat_interval = 1.0
        config.gfal.poll_interval = 0.5
        # A stuck agent is ended (its stacks in its log) and started again well within a demo.
        config.agents.hang_timeout = 90.0
        config.embedded.compact_interval = 5.0  # an embedded store compacted under the demo's load
        # A frozen site started again within the test, after the demo's 20 s freeze has ended
        # (a loaded machine's gfal worker may take most of those 20 s to find the site silent).
        config.storage.hang_timeout = 25.0
        config.gfal.stall_after = 5.0  # and found silent (and held) before that
        config.frontend.enabled = True
        config.frontend.listen = f"127.0.0.1:{free_port()}"
        config.frontend.secret = "run-test-frontend"
        path = base / "aso.toml"
        path.write_text(render(config, show_secrets=True))
        log = base / "run.log"
        with open(log, "w") as out:
            process = subprocess.Popen(
                [ASO, "--config", str(path), "run"], stdout=out, stderr=subprocess.STDOUT,
                text=True, cwd=REPO,
            )  # fmt: skip
        try:
            try:
                wait_for(lambda: "ASO running" in log.read_text(), 90, "aso run to start")
            except AssertionError as timeout:
                raise AssertionError(f"{timeout}; its log:\n{log.read_text()[-4000:]}") from None
            yield path, process, base
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
            for line in our_processes(str(base)):  # nothing of ours may survive the test
                os.kill(int(line.split()[0]), signal.SIGKILL)


@pytest.mark.timeout(600)  # a 200-file demo, then a restart, a store killed, a site frozen:
# each step bounded by its own timeout, their sum past the suite's 300 s on a loaded machine
def test_run_demo_restart_and_clean_stop(service):
    path, process, base = service
    # The README's demonstration: 200 real files of mixed sizes at two sources, two users.
    demo = subprocess.run(
        [ASO, "--config", str(path), "demo", "--files", "200", "--timeout", "240"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo_failed(demo, base, path)
    assert "200 of 200 done" in demo.stdout
    assert "through the front end at https://" in demo.stdout
    config = load(str(path))
    # Both say where the monitoring pages are; a browser logs in there with the store account
    # they name and sees the 200 files done (once the analytics agent has summed them up).
    [address] = re.findall(r"monitoring pages: (\S+)", (base / "run.log").read_text())
    assert address == pages_url(config) and f"monitoring pages: {address}" in demo.stdout
    see_the_overview(address, "admin", "run-test-admin", done=200)
    admin = Server(config.store.url, "admin", "run-test-admin")
    done = (
        admin.db("asynctransfer")
        .view(
            "asyncstageout",
            "by_state",
            start_key=["done"],
            end_key=["done", {}],
            reduce=False,
            include_docs=True,
        )
        .docs()
    )
    assert len(done) == 200 and {d["user"] for d in done} == {"alice", "bob"}
    assert {d["source"] for d in done} == {"T2_CH_CERN", "T2_IT_Pisa"}
    for doc in done:  # at the destination, byte for byte what the request announced
        copied = export_path(config, "T2_DE_DESY", doc["destination_lfn"]).read_bytes()
        assert len(copied) == doc["size"]
        assert f"{zlib.adler32(copied):08x}" == doc["checksum"]["adler32"]
        assert [h["to"] for h in doc["history"] if h["axis"] == "state"] == [
            "new",
            "submitted",
            "done",
        ]

    # The gfal worker's log says what each cycle did, in a line with its counts; a copied
    # file's story is in its documents (and in the log at DEBUG), and gfal2's protocol traces
    # stay out of it unless --verbose.
    [worker_log] = base.rglob("gfal-worker-*.log")
    lines = worker_log.read_text().splitlines()
    assert any("cycle of" in line and "started" in line for line in lines), lines[-5:]
    assert not [line for line in lines if any(f"file {d['_id']}: done" in line for d in done)]
    assert not [line for line in lines if "Davix" in line]
    assert len(lines) < 2 * len(done)

    # The cleaner then removes every temporary copy, the destination being confirmed.
    def all_cleaned() -> bool:
        docs = admin.db("asynctransfer").get_many(d["_id"] for d in done).values()
        return all(d["cleanup"] == "cleaned" for d in docs)

    wait_for(all_cleaned, 120, "the cleaner to remove the temporary copies")

    # The publisher puts them in the catalog, each user's task in blocks of at most 100.
    def all_published() -> bool:
        docs = admin.db("asynctransfer").get_many(d["_id"] for d in done).values()
        return all(d["publication"] == "published" for d in docs)

    wait_for(all_published, 120, "the publisher to publish the files")
    catalog = EmbeddedCatalog(admin.db(config.store.catalog_db))
    for user in ("alice", "bob"):
        mine = [d for d in done if d["user"] == user]
        blocks = catalog.dataset_files(mine[0]["publish_info"]["dataset"])
        assert sorted(lfn for lfns in blocks.values() for lfn in lfns) == sorted(
            d["destination_lfn"] for d in mine
        )
        assert sorted(len(lfns) for lfns in blocks.values()) == [100]
    for doc in done:
        assert not export_path(config, doc["source"], doc["source_lfn"]).exists()
        assert export_path(config, "T2_DE_DESY", doc["destination_lfn"]).exists()

    # Old revisions' bodies are dropped: the embedded store's by `aso run` (it never compacts
    # by itself: EMBEDDED_NEVER_COMPACTS), a CouchDB node's by its own daemon (smoosh).
    sample = done[0]["_id"]
    revisions = admin.raw("GET", f"/asynctransfer/{sample}", params={"revs": "true"})["_revisions"]
    first = f"1-{revisions['ids'][-1]}"
    if admin.kind == EMBEDDED:

        def first_revision_dropped() -> bool:
            try:
                admin.raw("GET", f"/asynctransfer/{sample}", params={"rev": first})
            except NotFound:
                return True
            return False

        wait_for(first_revision_dropped, 60, "aso run to compact the embedded store")
        assert "compacted" in (base / "run.log").read_text()
    else:
        assert "ratio_dbs" in store_admin.node_config(admin)["smoosh"]["db_channels"]
        assert "compacted" not in (base / "run.log").read_text()

    # kill -9 one agent: the supervisor starts it again under the same instance name.
    def monitors() -> list[str]:
        return [line for line in our_processes("agent monitor") if str(path) in line]

    [monitor] = monitors()
    os.kill(int(monitor.split()[0]), signal.SIGKILL)
    wait_for(
        lambda: (now := monitors()) and len(now) == 1 and now[0] != monitor,
        30,
        "the monitor to be started again",
    )
    # kill -9 the store it started (one request had killed the embedded store for good, issue
    # 18): it is started again, the end of its log in run.log, and the service goes on.
    store = local_store(config)
    dead = store.status().pid
    assert dead is not None
    os.kill(dead, signal.SIGKILL)
    wait_for(
        lambda: (now := store.status()).pid not in (None, dead) and now.answering,
        90,
        "the store to be started again",
    )
    # SIGSTOP the destination's XRootD: it takes connections and answers none. Once it has not
    # answered for storage.hang_timeout, it is killed and started again (Keeper).
    [frozen] = [s.pid for s in EmbeddedStorage(config).status() if s.site == "T2_DE_DESY"]
    assert frozen is not None
    os.kill(frozen, signal.SIGSTOP)
    killed = f"T2_DE_DESY: killed (pid {frozen}), it did not answer"
    wait_for(lambda: killed in (base / "run.log").read_text(), 90, "the frozen site killed")
    again = subprocess.run(
        [ASO, "--config", str(path), "demo", "--files", "6", "--timeout", "120"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert again.returncode == 0 and "6 of 6 done" in again.stdout, demo_failed(again, base, path)

    # Heartbeats name every instance.
    url = config.store.url
    rows = admin.raw(
        "GET",
        "/asynctransfer/_all_docs",
        params={
            "startkey": json.dumps("heartbeat:"),
            "endkey": json.dumps("heartbeat:\ufff0"),
            "include_docs": "true",
        },
    )
    agents = {row["doc"]["agent"] for row in rows["rows"]}
    assert agents == {
        "submitter",
        "monitor",
        "gfal-worker",
        "retry-manager",
        "cleaner",
        "analytics",
        "reconciler",
        "hold-checker",
        "notifier",
        "publisher",
    }

    if dumps := hang_dumps(base):
        # The service healed itself (that is what the watchdog is for), but a stuck agent is
        # a defect to find: say where it was stuck in the run's warnings.
        warnings.warn("agents stuck, ended by their watchdog:\n" + "\n".join(dumps), stacklevel=1)
    # `make stop` (make help) ends the `aso run` of its checkout and config, which stops its
    # agents, storage and store, and then whatever it left.
    stop = subprocess.run(["make", "-C", str(REPO), "--no-print-directory", "stop",
                           f"ASO={ASO}", f"CONFIG={path}"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert f"stopping aso run (pid {process.pid})" in stop.stdout, stop.stdout
    assert process.wait(60) == 0
    log = (base / "run.log").read_text()
    assert "exited with code -9; restart" in log
    assert f"the {config.store.engine} store died; the end of its log" in log
    assert "agents stopped" in log and "stopping embedded storage" in log
    assert our_processes(str(base)) == []  # store, storage and agents all gone
    with pytest.raises(StoreUnavailable):  # the store it started is stopped too
        Server(url, "admin", "run-test-admin", Settings(retries=0)).info()


def test_the_documented_example_client_writes_records_kills_resubmits_and_follows_a_task(
    service,
):
    """docs/client-example.py, as a user runs it against `aso run`: it writes each job's output
    at the source site with alice's proxy (the site's HTTPS endpoint, the grid CA), records the
    task, records it again (every answer `same_file`), kills a file and resubmits it if the kill
    took (or is told it came too late), and follows the task until every file is final; the
    agents copy what she wrote, byte for byte."""
    path, _, base = service
    config = load(str(path))
    certs = base / "certs"
    source, destination = "T2_CH_CERN", "T2_DE_DESY"
    host, port = config.frontend.listen.rsplit(":", 1)

    def front_end_up() -> bool:
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
            return True
        return False

    wait_for(front_end_up, 60, "the front end to listen")
    run = subprocess.run(
        [sys.executable, str(REPO / "docs" / "client-example.py"),
         "--url", f"https://{config.frontend.listen}", "--ca", str(certs / "ca.pem"),
         "--proxy", str(certs / "x509up_alice"), "--source", source, "--destination", destination,
         "--files", "12", "--timeout", "240", "--write-to", config.sites[source].http_url],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["written"] == 12
    assert report["recorded"] == {"recorded": 12} and report["again"] == {"same_file": 12}
    assert report["kill"] in ("killed", "kill_requested")
    assert report.get("resubmit") == "new" or "too late" in report.get("kill_too_late", "")
    assert report["finished"] and report["final"] == 12 and report["states"] == {"done": 12}
    admin = Server(config.store.url, "admin", "run-test-admin")
    task = admin.db("asynctransfer").view(
        "asyncstageout", "by_task", start_key=[report["task"]], end_key=[report["task"], {}],
        reduce=False, include_docs=True,
    ).docs()  # fmt: skip
    assert len(task) == 12 and {d["user"] for d in task} == {"alice"}
    for doc in task:  # what she wrote, at the destination
        copied = export_path(config, destination, doc["destination_lfn"]).read_bytes()
        assert len(copied) == doc["size"] > 1000
        assert f"{zlib.adler32(copied):08x}" == doc["checksum"]["adler32"]


def test_a_demo_with_a_source_frozen_completes_and_says_how_long_each_waited(service):
    """`aso demo --freeze SITE`: one of its sources' XRootD frozen (SIGSTOP) at once for 20 s
    (`aso run` would kill and start again a site silent for `storage.hang_timeout`, 25 s here);
    every file is done, the run says how long the files from or to it and the others waited
    (figures, not asserted: the machine is shared) and how the site was held meanwhile."""
    path, _process, base = service
    demo = subprocess.run(
        [ASO, "--config", str(path), "demo", "--files", "40", "--timeout", "240",
         "--freeze", "T2_IT_Pisa", "--freeze-at", "0", "--freeze-for", "20"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert demo.returncode == 0, demo_failed(demo, base, path)
    assert "40 of 40 done" in demo.stdout
    assert re.search(r"froze T2_IT_Pisa \(pid \d+\) for 20 s", demo.stdout), demo.stdout
    assert "# Seconds from request to copy done, T2_IT_Pisa frozen for 20 s" in demo.stdout
    rows = [line.split("\t") for line in demo.stdout.splitlines() if "\t" in line]
    waited = {row[0]: row[1:3] for row in rows if row[0] in ("from or to T2_IT_Pisa", "the others")}
    assert waited == {"from or to T2_IT_Pisa": ["20", "20"], "the others": ["20", "20"]}
    # The gfal worker found it silent and held every user's files for it (instead of sending
    # more to hang), then released them when it answered again.
    assert "# Holds during the run" in demo.stdout
    held = [row[3] for row in rows if row[1:3] == ["T2_IT_Pisa", "every user's"]]
    assert held[:1] == ["active"] and held[-1] == "released", demo.stdout
    # Not an embedded site, or no time to freeze it: refused before anything is written.
    for args, says in (
        (["--freeze", "T2_NOWHERE"], "--freeze: T2_NOWHERE is not an embedded site"),
        (["--freeze", "T2_IT_Pisa", "--freeze-for", "0"], "--freeze-for above 0"),
    ):
        refused = subprocess.run([ASO, "--config", str(path), "demo", "--files", "2", *args],
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr


def test_every_agent_killed_mid_work_loses_and_duplicates_nothing(service):
    """kill -9 of each agent in turn while 120 files move; `aso run` starts each again. In the
    end every file is done, cleaned and published once: checked from the documents, from the
    storage (temp areas emptied, every destination file right, no two copies of a file at once
    in the destination server's own log) and from the catalog (each file in exactly one
    block)."""
    path, _process, base = service
    config = load(str(path))
    demo = subprocess.Popen(
        [ASO, "--config", str(path), "demo", "--files", "120", "--timeout", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    victims = ["submitter", "gfal-worker", "monitor", "retry-manager", "cleaner", "publisher"]
    for victim in victims:
        time.sleep(1.5)
        running = [ln for ln in our_processes(f"agent {victim}") if str(path) in ln]
        if running:
            os.kill(int(running[0].split()[0]), signal.SIGKILL)
    out, _ = demo.communicate(timeout=360)
    assert demo.returncode == 0, out
    assert "120 of 120 done" in out
    admin = Server(config.store.url, "admin", "run-test-admin")
    # Every request, from the primary index (a view read while the agents write may lag).
    rows = admin.raw("GET", "/asynctransfer/_all_docs", params={"include_docs": "true"})["rows"]
    done = [r["doc"] for r in rows if r["doc"].get("type") == "transfer_request"]
    assert sorted(d["state"] for d in done) == ["done"] * 120
    ids = [d["_id"] for d in done]

    def settled() -> bool:
        docs = admin.db("asynctransfer").get_many(ids).values()
        return all(d["cleanup"] == "cleaned" and d["publication"] == "published" for d in docs)

    wait_for(settled, 180, "cleanup and publication after the kills")
    log = (base / "run.log").read_text()
    assert sum(
        f"{victim} " in line and "exited with code -9" in line
        for victim in victims
        for line in log.splitlines()
    ) == len(victims)
    for doc in done:
        assert not export_path(config, doc["source"], doc["source_lfn"]).exists()
        copied = export_path(config, "T2_DE_DESY", doc["destination_lfn"]).read_bytes()
        assert f"{zlib.adler32(copied):08x}" == doc["checksum"]["adler32"]
    assert_never_copied_twice_at_once(config, done)
    catalog = EmbeddedCatalog(admin.db(config.store.catalog_db))
    in_blocks = Counter(
        lfn
        for user in ("alice", "bob")
        for lfns in catalog.dataset_files(
            next(d["publish_info"]["dataset"] for d in done if d["user"] == user)
        ).values()
        for lfn in lfns
    )
    assert set(in_blocks) == {d["destination_lfn"] for d in done}
    assert set(in_blocks.values()) == {1}  # each file in exactly one block


def test_run_does_not_replace_a_real_store_that_is_down(tmp_path):
    """With embedded.enabled = false (a CouchDB host), a store that does not answer is a
    one-line retryable error: no empty embedded store is started in its place."""
    from tests.conftest import make_config, write_config

    config = make_config(tmp_path, free_port())
    config.embedded.enabled = False
    config.store.retries = 0
    write_config(config)
    result = subprocess.run(
        [ASO, "--config", str(config.source), "run"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 75, result.stderr
    assert "retryable" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "store").exists()  # no embedded store's data directory
    assert not our_processes(str(tmp_path))


def test_supervisor_says_which_agent_its_watchdog_ended(tmp_path):
    log = tmp_path / "monitor-vm-0.log"
    dump = 'Timeout (0:01:30)!\nThread 0x01 (most recent call first):\n  File "x.py", line 1 in f\n'
    log.write_text(f"2026 INFO aso.agent: monitor vm-0 starting (store http://s)\n{dump}")
    assert hang_of(log) == "0:01:30"
    # A dump of an earlier run, then a clean start and an ordinary exit: not a hang.
    log.write_text(log.read_text() + "2026 INFO aso.agent: monitor vm-0 starting (store x)\n")
    assert hang_of(log) is None
    assert hang_of(tmp_path / "missing.log") is None
    # A timeout with a fraction of a second, as faulthandler writes it.
    log.write_text(log.read_text() + dump.replace("0:01:30", "0:00:01.500000"))
    assert hang_of(log) == "0:00:01.500000"


def test_run_starts_again_an_agent_stuck_past_its_hang_timeout(tmp_path):
    """`aso run --agents-only` against a store that accepts connections and never answers:
    each agent waits on its first request, ends itself after `agents.hang_timeout` with its
    threads' stacks, and `aso run` says so and starts it again."""
    from tests.conftest import make_config, write_config

    black_hole = socket.socket()
    black_hole.bind(("127.0.0.1", 0))
    black_hole.listen(64)  # connections complete in the kernel; nobody ever answers
    config = make_config(tmp_path, black_hole.getsockname()[1], read_timeout=600.0, retries=0)
    config.agents.hang_timeout = 2.0
    config.agents.instances = {**dict.fromkeys(config.agents.instances, 0), "retry-manager": 1}
    config.agents.log_dir = str(tmp_path / "log")
    write_config(config)
    run = subprocess.Popen(
        [ASO, "--config", str(config.source), "run", "--agents-only", "--host-id", "hang"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        agent_log = tmp_path / "log" / "retry-manager-hang-0.log"
        wait_for(
            lambda: agent_log.exists() and agent_log.read_text().count("Timeout (") >= 2,
            60,
            "the agent to be stuck twice",
        )
    finally:
        run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=60)[0]
        black_hole.close()
    text = agent_log.read_text()
    assert "Timeout (0:00:02)!" in text and "aso/runtime.py" in text, text[-3000:]
    assert "retry-manager hang-0 exited with code 1; restart" in output, output
    assert "retry-manager hang-0 was stuck for 0:00:02 (agents.hang_timeout)" in output, output
    assert run.returncode == 0
    assert not our_processes(str(tmp_path))


@contextlib.contextmanager
def running_service(config: Config, base: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """`aso run` of `config` (its own store, no agent, no front end) with its output in
    base/run.log, once it says it runs; whatever of it is left is killed at the end."""
    config.agents.instances = {name: 0 for name in config.agents.instances}
    config.transfer.backend = "sim"
    config.frontend.enabled = False
    config.agents.log_dir = str(base / "log")
    write_config(config)
    log = base / "run.log"
    with open(log, "w") as out:
        process = subprocess.Popen([ASO, "--config", str(config.source), "run"], stdout=out,
                                   stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_for(lambda: "ASO running" in log.read_text(), 90, "aso run to start")
        yield process, log
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
        for line in our_processes(str(base)):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def assert_given_up(process: subprocess.Popen[str], log: Path) -> str:
    """`aso run` ended by itself, 1, with the message that says why and what to look at, and
    started the store again no more than STORE_RESTARTS times. Its output."""
    assert process.wait(STORE_RESTARTS * STORE_CHECK * 4 + 120) == 1, log.read_text()[-3000:]
    text = log.read_text()
    [message] = [line for line in text.splitlines() if line.startswith("aso: error: ")]
    assert f"died again after {STORE_RESTARTS} restarts within 60 s: not starting it again" in (
        message
    )
    assert "Look at " in message and "then start `aso run` again" in message
    restarts = text.count("store started (pid") - 1 + text.count("could not start the")
    assert restarts == STORE_RESTARTS, text[-3000:]
    return text


@only_on("pouchdb", "the replication document that kills the store at every start is the "
         "embedded store's (CouchDB retries a failing replication); the supervision is the same "
         "for both stores (the next test)")  # fmt: skip
def test_run_ends_the_crash_loop_of_a_store_that_dies_at_every_start(tmp_path):
    """EMBEDDED_REPLICATION_CRASH_AT_START: the store's admin writes a replication document
    with `"retry": false` and a target that refuses it; pouchdb-server dies at once, and at
    every start. `aso run` starts it again a bounded number of times, then stops everything
    and exits 1 with the store's last error, its log's last lines in its own output."""
    config = make_config(tmp_path, free_port())
    with running_service(config, tmp_path) as (process, log):
        admin = Server.from_config(config, account="admin")
        admin.db("_replicator").put({"_id": "kills-the-store", "source": config.store.files_db,
                                     "target": "http://127.0.0.1:1/x", "retry": False})  # fmt: skip
        text = assert_given_up(process, log)
    [message] = [line for line in text.splitlines() if line.startswith("aso: error: ")]
    assert "Its last error: FetchError: request to http://127.0.0.1:1/x/ failed" in message
    assert "pouchdb-server.log: Node.js v" in text  # the end of its log, line by line
    assert not our_processes(str(tmp_path))


def take_port_of(config: Config) -> http.server.ThreadingHTTPServer:
    """Kill the store and take its port with another HTTP server, serving in a thread. If
    `aso run` started the store again in between, that one is killed too."""
    port = int(config.store.url.rsplit(":", 1)[1])
    deadline = time.monotonic() + 60
    while True:
        local_store(config).kill()
        try:
            return http.server.ThreadingHTTPServer(
                ("127.0.0.1", port), http.server.BaseHTTPRequestHandler
            )
        except OSError:
            assert time.monotonic() < deadline, f"port {port} stays taken"
            time.sleep(0.1)


def test_run_ends_when_its_store_cannot_be_started_again(tmp_path):
    """The store dies (kill -9) and another server takes its port: each start is refused at
    once. `aso run` tries STORE_RESTARTS times, then stops and exits 1 saying so."""
    config = make_config(tmp_path, free_port())
    with running_service(config, tmp_path) as (process, log):
        squatter = take_port_of(config)
        threading.Thread(target=squatter.serve_forever, daemon=True).start()
        try:
            text = assert_given_up(process, log)
        finally:
            squatter.shutdown()
            squatter.server_close()
    assert "another server already answers" in text
    assert not our_processes(str(tmp_path))
