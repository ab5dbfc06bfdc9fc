"""The lifecycle simulator: its accounting (every injected file in exactly one final outcome)
on made-up documents, and a short real run of `aso sim`'s machinery: the real agents as
processes (`aso run --agents-only`) over fresh databases of the session's store, synthetic
jobs through the upload path, the sim transfer back end with failures and retries, a drain,
and the report computed from the documents."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections import Counter

import pytest

from aso import model
from aso.sim.chaos import ChaosPlan
from aso.sim.lifecycle import RunOptions, run_simulation
from aso.sim.report import (
    Analysis,
    account,
    check_catalog,
    check_copies,
    outcome,
    percentiles,
    recheck_catalog,
    recheck_twice,
    work_by_host,
)
from aso.sim.workload import Plan, Workload
from aso.store import admin as store_admin
from aso.upload import judged_request
from tests import storejs
from tests.conftest import ENGINE


def request(i: int, **fields) -> dict:
    doc = judged_request(
        user="alice",
        task="t:alice_sim",
        job_id=str(i),
        source="T2_SM_Site000",
        destination="T2_SM_Site001",
        source_lfn=f"/store/temp/user/alice/f{i}.root",
        destination_lfn=f"/store/user/alice/f{i}.root",
        size=10,
        adler32="00000001",
        publish=True,
        publish_info={"dataset": "/Sim/alice-sim/USER"},
        at=1000.0 + i,
    )
    doc.update(fields)
    return doc


def walk(doc: dict, *steps: tuple[str, str], at: float = 2000.0) -> dict:
    for axis, to in steps:
        doc = model.transition(doc, [model.Change(axis, to, "agent")], model.ADMIN, at=at)
        at += 1
    return doc


DONE = ((model.STATE, "submitted"), (model.STATE, "done"))
FINISHED = (*DONE, (model.CLEANUP, "cleaned"), (model.PUBLICATION, "published"))


def test_outcomes_of_finished_and_unfinished_files():
    assert outcome(walk(request(1), *FINISHED)) == "done"
    assert outcome(walk(request(2), *DONE)) == "unfinished"  # not cleaned nor published yet
    failed = walk(
        request(3),
        (model.STATE, "submitted"),
        (model.STATE, "failed_attempt"),
        (model.STATE, "failed"),
    )
    assert outcome(failed) == "failed"
    pub_failed = walk(
        request(4),
        *DONE,
        (model.CLEANUP, "cleaned"),
        (model.PUBLICATION, "publication_error"),
        (model.PUBLICATION, "publication_failed"),
    )
    assert outcome(pub_failed) == "publication_failed"


def test_accounting_is_exact_only_when_every_file_ends_once():
    docs = [walk(request(i), *FINISHED) for i in range(5)]
    ids = [d["_id"] for d in docs]
    good = account(ids, docs)
    assert good.exact and good.outcomes["done"] == 5 and not good.problems()

    lost = account([*ids, "f" * 64], docs)
    assert not lost.exact and lost.missing == ["f" * 64]

    stranger = walk(request(99), *FINISHED)
    extra = account(ids, [*docs, stranger])
    assert not extra.exact and extra.unexpected == [stranger["_id"]]

    unfinished = account(ids, [*docs[:4], walk(request(4), *DONE)])
    assert not unfinished.exact and unfinished.unfinished == [docs[4]["_id"]]

    # A file copied twice (a second `done` in its history) would be counted twice.
    again = walk(
        docs[0],
        (model.STATE, "new"),
        (model.STATE, "submitted"),
        (model.STATE, "done"),
    )
    twice = account(ids, [again, *docs[1:]])
    assert not twice.exact and twice.twice == [docs[0]["_id"]]


def test_an_attempt_whose_job_was_not_found_must_have_been_fenced():
    """The accounting counts the fences of jobs the service did not know (released after the
    lease, lost) by verdict, and is not exact when such an attempt went on unfenced."""
    docs = [walk(request(i), *FINISHED) for i in range(3)]
    ids = [d["_id"] for d in docs]
    job = {"service": "sim", "submitted": 1.0, "ended": 2.0}
    released = {**job, "job_id": "j1", "outcome": "canceled", "reason": "lease expired, no job"}
    lost = {**job, "job_id": "j2", "outcome": "failed", "error_class": "job_lost",
            "reason": "the transfer service does not know job j2"}  # fmt: skip
    done = {**job, "job_id": "j3", "outcome": "done"}
    docs[0]["attempts"] = [{**released, "fenced": "absent"}, done]
    docs[1]["attempts"] = [{**lost, "fenced": "ended"}, done]
    fenced = account(ids, docs)
    assert fenced.exact and fenced.fences == {"absent": 1, "ended": 1} and fenced.unfenced == []
    assert "2 jobs not found fenced first (1 absent, 1 ended), 0 not" in fenced.counts_line()
    docs[2]["attempts"] = [released, done]
    unfenced = account(ids, docs)
    assert not unfenced.exact and unfenced.unfenced == [ids[2]]
    assert any(line.startswith("1 unfenced") for line in unfenced.problems())


def test_backlog_and_latencies_rebuilt_from_history():
    analysis = Analysis(t0=1000.0, compression=2.0, bucket=60.0)
    doc = walk(request(0), *FINISHED, at=1011.0)  # created at 1000, done at 1012
    doc["attempts"] = [{"job_id": "j", "service": "sim", "submitted": 1011.0, "ended": 1011.5}]
    analysis.add(doc)
    assert analysis.counts["injected"][0] == 1 and analysis.counts["done"][0] == 1
    # injection → done: 12 wall s = 24 simulated s; without the 0.5 s at the service: 23.
    assert analysis.latency["done"][0] == [24.0]
    assert analysis.latency["overhead"][0] == [23.0]
    series = dict(analysis.backlog_series(2.0, 30.0))
    assert series[0.0] == 1 and series[22.0] == 1 and series[24.0] == 0
    assert percentiles([1, 2, 3, 4]) == {"p50": 2, "p95": 4, "p99": 4}


def test_workload_injects_the_planned_rate_with_logs_for_some_users():
    plan = Plan(scale=4, users=50, sites=10, interval=60, duration=600, seed=3)
    workload = Workload(plan, "run1")
    files = [d for _ in range(10) for job in workload.tick(1000.0) for d in job.docs]
    expected = plan.files_per_second * plan.duration
    assert abs(len(files) - expected) / expected < 0.05
    kinds = {d["file_type"] for d in files}
    assert kinds == {"output", "log"}
    assert len({d["_id"] for d in files}) == len(files)
    for doc in files:
        storejs.check_schema(doc)
        assert doc["destination"] == next(u.home for u in workload.users if u.name == doc["user"])


def test_a_short_run_accounts_for_every_file(tmp_path, store_config, admin):
    plan = Plan(
        scale=2,
        users=10,
        sites=4,
        interval=2.0,
        duration=20.0,
        mean_duration=2.0,
        failure_rate=0.2,
        retry_delay=1.0,
        block_timeout=3.0,
        jobs_per_task=(5, 20),
    )
    url = store_config.store.url.replace(
        "://", f"://{store_config.store.admin_user}:{store_config.store.admin_password}@"
    )
    options = RunOptions(
        workdir=tmp_path / "sim",
        store_url=url,
        sample_every=1.0,
        drain_timeout=120.0,
        bucket=5.0,
        measure_ceiling=False,
        progress=False,
        drop_databases=True,
    )
    report = run_simulation(plan, options)
    accounting = report.accounting
    assert accounting.exact, accounting.problems()
    assert accounting.injected == sum(accounting.outcomes.values()) > 30
    assert accounting.outcomes["done"] > 0
    # Failures happened and were retried; none of that lost or doubled a file.
    assert sum(report.analysis.counts["failed_attempt"].values()) > 0
    data = json.loads((options.workdir / "report" / "report.json").read_text())
    assert data["accounting"]["exact"] is True
    assert sum(r["injected"] for r in data["rows"]) == accounting.injected
    assert sum(r["done"] for r in data["rows"]) == accounting.outcomes["done"]
    assert (options.workdir / "report" / "completed.png").stat().st_size > 1000
    assert (options.workdir / "report" / "backlog.png").stat().st_size > 1000
    assert data["steady"]["ratio"] is not None and data["cpu_cores"]
    # What the run cost the store: each database's writes per file and the requests' own share
    # (a copied file is at least created, sent, copied and cleaned), who asked for what, and
    # the store's CPU (the session's store runs on this host), its JavaScript apart on CouchDB.
    writes = data["writes_per_file"]
    assert set(writes) == {
        "files_db",
        "transfers_db",
        "catalog_db",
        "stats_db",
        "total",
        "requests",
    }
    assert writes["total"] > writes["files_db"] > writes["requests"] >= 4, writes
    assert writes["transfers_db"] > 0 and writes["catalog_db"] > 0, writes
    assert {"submitter", "monitor", "cleaner", "simulator"} <= set(report.store_requests)
    assert report.store_requests["submitter"]["files _bulk_docs POST"][0] > 0
    assert report.store_requests["simulator"]["files _bulk_docs POST"][0] > 0  # the uploads
    assert data["store_requests_per_file"][0]["per_file"] > 0
    # The agents read the files database's changes through the host's feed relay, not from
    # the store (aso/feedrelay.py): none of theirs went to the store.
    for agent in ("submitter", "monitor", "retry-manager", "cleaner", "publisher"):
        assert report.store_requests[agent].get("files _changes POST", [0])[0] == 0, agent
    assert data["cpu_cores"].get("store", 0) > 0, data["cpu_cores"]
    # The uploads' lag behind the injection times is printed: a run whose job wrappers cannot
    # keep up says so (the yardstick counts from the injection times).
    [uploads] = [line for line in report.extra_lines() if line.startswith("uploads: lag")]
    assert f"p50/p95 {data['uploads']['lag']['p50']}/" in uploads, uploads
    if ENGINE == "couchdb":
        assert data["cpu_cores"].get("store-js", 0) > 0, data["cpu_cores"]
    # The run had databases (and an agent account) of its own, dropped at its end.
    assert not [name for name in store_admin.all_dbs(admin) if "_sim" in name]


def test_a_run_with_a_full_a_frozen_and_a_forbidding_destination_holds_and_loses_nothing(
    tmp_path,
):
    """`aso sim --quota/--frozen/--forbid`: a destination full, one frozen and one refusing a
    user for part of the run. Their files wait held (a user's holds for room and permission, a
    site's hold once the frozen one's breaker trips) and complete after the faults end; no file
    fails for room or permission; the accounting is exact; the report says what was held."""
    faults = [
        {"site": "T2_SM_Site001", "class": "quota", "start": 40.0, "end": 120.0},
        {"site": "T2_SM_Site002", "class": "timeout", "start": 40.0, "end": 120.0},
        *({"site": f"T2_SM_Site00{n}", "user": "simuser0003", "class": "permission",
           "start": 40.0, "end": 120.0} for n in range(4)),
    ]  # fmt: skip
    plan = Plan(
        scale=3, users=10, sites=4, interval=10.0, duration=200.0, compression=10.0,
        mean_duration=10.0, failure_rate=0.0, retry_delay=10.0, block_timeout=30.0,
        jobs_per_task=(5, 20), outages=faults,
    )  # fmt: skip
    options = RunOptions(
        workdir=tmp_path / "faults", sample_every=1.0, drain_timeout=300.0, bucket=20.0,
        measure_ceiling=False, progress=False,
    )  # fmt: skip
    report = run_simulation(plan, options)
    accounting = report.accounting
    assert accounting.exact, accounting.problems()
    held = report.analysis.held_attempts
    assert held["quota"] > 0 and held["permission"] > 0, held
    assert held["timeout"] > 0, (held, report.analysis.error_classes)  # the breaker tripped
    assert accounting.outcomes["failed"] == 0, accounting.outcomes
    data = json.loads((options.workdir / "report" / "report.json").read_text())
    assert data["holds"]["files"] == len(report.analysis.held_seconds) > 0
    assert data["holds"]["held_seconds"]["p50"] > 0
    [line] = [line for line in report.extra_lines() if line.startswith("holds: ")]
    assert "files held" in line


def test_a_destination_given_a_size_limit_holds_what_does_not_fit_and_loses_nothing(tmp_path):
    """`aso sim --quota SITE:SIZE@START-END`: the home of several users takes 20 GB of copies,
    then is full until its limit is lifted. The copies past the limit are refused (class
    quota) and the submitter's admission keeps back what the room it reports cannot take: the
    files wait held, none fails for room, and all complete once the limit is lifted; the
    accounting is exact and the report gives the quota's figures."""
    plan = Plan(
        scale=3, users=10, sites=4, interval=10.0, duration=200.0, compression=10.0,
        mean_duration=10.0, failure_rate=0.0, retry_delay=10.0, block_timeout=30.0,
        jobs_per_task=(5, 20),
    )  # fmt: skip
    homes = Counter(user.home for user in Workload(plan, "run").users)
    site = homes.most_common(1)[0][0]  # the home of the most users: their room is shared
    limit = 5_000_000_000
    quota = {"site": site, "class": "quota", "bytes": limit, "start": 0.0, "end": 120.0}
    plan = dataclasses.replace(plan, outages=[quota])
    options = RunOptions(
        workdir=tmp_path / "quota", engine=ENGINE, sample_every=1.0, drain_timeout=300.0,
        bucket=20.0, measure_ceiling=False, progress=False,
    )  # fmt: skip
    report = run_simulation(plan, options)
    accounting = report.accounting
    assert accounting.exact, accounting.problems()
    assert accounting.outcomes["failed"] == 0, accounting.outcomes
    assert report.analysis.held_attempts["quota"] > 0, report.analysis.held_attempts
    [figures] = report.quotas
    assert figures["within_limit"] and 0 < figures["landed_bytes"] <= limit, figures
    assert figures["ledger_agrees"], figures  # what landed is what the files record done
    assert figures["refused_copies"] > 0 and figures["failed_for_room"] == 0, figures
    assert figures["files_held"] > 0 and figures["held_done"] == figures["files_held"], figures
    assert figures["held_seconds"]["p50"] > 0, figures
    data = json.loads((options.workdir / "report" / "report.json").read_text())
    assert data["holds"]["byte_quotas"] == [figures]
    [line] = [line for line in report.extra_lines() if line.startswith(f"quota {site}")]
    assert "within the limit" in line and "0 files failed for room" in line, line


def test_a_size_limited_destination_takes_copies_until_full_and_every_reader_agrees(
    sim_config, admin
):
    """A byte quota's copies are decided through its ledger in the job table: they land in
    the order they end while their bytes fit, the others fail `quota`; another service (an
    agent in another process) sees the same; the site reports the limit less what landed,
    through the files back end too; past the quota's end the limit is lifted."""
    from aso.files import open_files
    from aso.transfer.base import DONE, FAILED, FileTransfer, JobRequest
    from aso.transfer.sim import SimService

    quota = {"site": "T2_DE_DESY", "class": "quota", "bytes": 25, "start": 0, "end": 3.0}
    sim = dataclasses.replace(sim_config.sim, outages=[quota], mean_duration=0.2)
    config = dataclasses.replace(sim_config, sim=sim)
    jobs = admin.db(config.store.transfers_db)
    service = SimService(jobs, sim)
    assert service.epoch > 0  # the run's epoch: the quota starts there

    def send(name: str, size: int) -> str:
        copy = FileTransfer(name, f"sim://T2_CH_CERN/{name}", f"sim://T2_DE_DESY/{name}", size,
                            "00000001")  # fmt: skip
        job = JobRequest(f"key-{name}", (copy,), "alice", "t", "T2_CH_CERN", "T2_DE_DESY")
        job_id = service.submit(job)
        time.sleep(0.05)  # each ends after the one before
        return job_id

    sent = {name: send(name, size) for name, size in [("a", 10), ("b", 10), ("c", 10), ("d", 3)]}
    time.sleep(0.3)
    ended = service.status(list(sent.values()))
    states = {name: ended[job_id].files[name] for name, job_id in sent.items()}
    assert [states[n].state for n in "abcd"] == [DONE, DONE, FAILED, DONE]  # d still fits
    assert states["c"].error_class == "quota" and "25 bytes" in (states["c"].reason or "")
    other = SimService(jobs, sim).status(list(sent.values()))
    assert {n: other[j].files[n].state for n, j in sent.items()} == {
        n: s.state for n, s in states.items()
    }
    url = "sim://T2_DE_DESY/store/user/alice/x.root"
    assert service.free_space("T2_DE_DESY") == 2
    assert open_files(config).free_space(url) == 2
    assert service.fault_at("T2_DE_DESY", "alice", time.time()) is None  # its room says it
    time.sleep(max(0.0, service.epoch + 3.0 - time.time()))
    late = send("e", 10)
    time.sleep(0.3)
    assert service.status([late])[late].files["e"].state == DONE  # the limit lifted
    assert service.free_space("T2_DE_DESY") is None


def test_the_ledger_lands_copies_in_the_order_they_end_while_they_fit():
    from aso.transfer.sim_quota import Landing, decide, new_ledger

    ledger = new_ledger({"site": "S", "bytes": 25, "start": 0, "end": 10})
    copies = [Landing("c", 10, 3.0), Landing("a", 10, 1.0), Landing("b", 10, 2.0)]
    after, refused = decide(ledger, copies)
    assert after is not None and after["used"] == 20 and refused == {"c"}
    assert set(after["copies"]) == {"a", "b"}
    again, refused_again = decide(after, [*copies, Landing("d", 5, 4.0)])
    assert again is not None and again["used"] == 25 and refused_again == {"c"}
    assert decide(again, copies) == (None, {"c"})  # decided once: nothing new to write


def test_a_file_is_held_after_a_held_attempt_and_while_a_hold_keeps_it_back():
    """The report's held time of a file (sim/held.py): while it waits to be sent and a hold of
    its destination is in force (kept back: the submitter's admission, or a hold another file
    started), and from a held attempt's end to its next attempt, each counted once."""
    from aso.sim.held import held_file, hold_spans

    hold = {"type": model.HOLD_TYPE, "site": "T2_SM_Site001", "user": "alice",
            "error_class": "quota", "history": [
                {"state": "active", "at": 1003.0, "reason": "admission: 1 files need 10 bytes"},
                {"state": "released", "at": 1008.0, "reason": "passed"},
                {"state": "active", "at": 1012.0, "reason": "simulated full"}]}  # fmt: skip
    holds = hold_spans([hold], end=1025.0)
    spans = holds["T2_SM_Site001", "alice"]
    assert spans.spans == ((1003.0, 1008.0), (1012.0, 1025.0))
    assert (spans.starts, spans.by_admission) == (2, 1)
    kept = walk(request(0), (model.STATE, "submitted"), *DONE[1:], at=1010.0)
    held = held_file(kept, holds)
    assert held is not None and (held.seconds, held.kept_back) == (5.0, 5.0)
    refused = walk(request(0), (model.STATE, "submitted"), at=1010.0)
    refused = walk(refused, (model.STATE, "failed_attempt"), (model.STATE, "retry"), at=1012.0)
    refused = walk(refused, (model.STATE, "submitted"), *DONE[1:], at=1030.0)
    refused["attempts"] = [
        {"submitted": 1010.0, "ended": 1012.0, "held": True, "error_class": "quota"},
        {"submitted": 1030.0, "ended": 1031.0},
    ]
    held = held_file(refused, holds)
    assert held is not None and held.classes == {"quota"}
    assert (held.seconds, held.kept_back) == (5.0 + 18.0, 5.0)  # the retry wait counted once
    assert held_file(request(1, destination="T2_SM_Site002"), holds) is None


@pytest.mark.parametrize(
    "value, expected",
    [
        ("T2_X:20GB@5m-10m", {"start": 300.0, "end": 600.0, "bytes": 20_000_000_000}),
        ("T2_X:500MB@0-2m", {"start": 0.0, "end": 120.0, "bytes": 500_000_000}),
        ("T2_X:1GiB", {"start": 0.0, "end": 900.0, "bytes": 2**30}),
        ("T2_X:5m-10m", {"start": 300.0, "end": 600.0}),
    ],
)
def test_a_quota_is_a_time_full_or_a_size_limit(value, expected):
    from aso.cli.sim import parse_quota

    assert parse_quota(value, 900.0) == {"site": "T2_X", "class": "quota", **expected}


def test_the_store_is_profiled_over_the_injection(tmp_path):
    """`--profile-store` on a store of the run's own: the embedded store's CPU profile by
    kind of work (its busy time shared out), or CouchDB's counters per file injected."""
    plan = Plan(scale=4, users=10, sites=4, interval=2.0, duration=16.0, mean_duration=2.0,
                retry_delay=1.0, block_timeout=3.0, jobs_per_task=(5, 20))  # fmt: skip
    options = RunOptions(workdir=tmp_path / "sim", engine=ENGINE, drain_timeout=120.0,
                         measure_ceiling=False, progress=False, profile_store=True)  # fmt: skip
    report = run_simulation(plan, options)
    profile = report.store_profile
    assert profile is not None and "error" not in profile, profile
    if ENGINE == "pouchdb":
        assert profile["busy_s"] > 0 and list((tmp_path / "sim" / "profile").glob("*.cpuprofile"))
        assert abs(sum(profile["kinds"].values()) - 1) < 0.01, profile["kinds"]
        assert profile["kinds"].get("validation (validate_doc_update)", 0) > 0, profile["kinds"]
    else:
        per_file = profile["per_file"]
        assert per_file["documents written"] >= 4 and per_file["JavaScript: validation (ms)"] > 0
    assert "store profile" in "\n".join(report.extra_lines())


def test_copies_twice_at_once_and_the_catalog_are_checked():
    docs = [walk(request(i), *FINISHED) for i in range(3)]
    result = account([d["_id"] for d in docs], docs)
    check_copies(result, [("a", 0.0, 5.0), ("a", 5.0, 9.0), ("b", 0.0, 5.0), ("b", 4.0, 6.0)])
    assert result.copied_twice_at_once == ["b"] and result.copies_checked == 4
    lfns = [d["destination_lfn"] for d in docs]
    check_catalog(result, [lfns[0], lfns[0], lfns[1], "/store/user/nobody/x.root"], docs)
    assert result.catalog_missing == [lfns[2]]
    assert result.catalog_twice == [lfns[0]]
    assert result.catalog_unexpected == ["/store/user/nobody/x.root"]
    assert not result.exact and len(result.problems()) == 4
    clean = account([d["_id"] for d in docs], docs)
    check_copies(clean, [("a", 0.0, 5.0), ("a", 5.0, 9.0)])
    check_catalog(clean, lfns, docs)
    assert clean.exact, clean.problems()
    assert "0 copied twice at once" in clean.counts_line()


def test_a_file_the_catalogs_feed_lacks_is_looked_for_in_its_block_at_the_quorum():
    """The catalog is read from its `_changes` (one copy of each shard): a block a cluster's
    copy did not have yet is read again by name from every copy before its files are called
    missing; a block that is gone, or lacks the file, leaves it missing."""
    docs = [walk(request(i), *FINISHED) for i in range(3)]
    for doc, block in zip(docs, ("late", "gone", "other"), strict=True):
        doc["publication_block"] = block
    lfns = [d["destination_lfn"] for d in docs]
    result = account([d["_id"] for d in docs], docs)
    check_catalog(result, [], docs)
    assert result.catalog_missing == sorted(lfns) and result.catalog_files == 0
    blocks = {"late": {"files": [{"lfn": lfns[0]}]}, "other": {"files": [{"lfn": "/x"}]}}
    assert recheck_catalog(result, docs, blocks.get) == [lfns[0]]
    assert result.catalog_missing == sorted(lfns[1:]) and result.catalog_files == 1


def test_a_file_the_catalogs_feed_shows_twice_is_counted_in_the_blocks_at_the_quorum():
    """A block withdrawn at the quorum (a racing publisher's) may still be live on the copy the
    catalog's `_changes` read: a file found in two blocks is counted in those of its blocks
    that hold it when read from every copy; two there is a double, none is missing."""
    docs = [walk(request(i), *FINISHED) for i in range(3)]
    lfns = [d["destination_lfn"] for d in docs]
    holders = {lfns[0]: ["kept", "withdrawn"], lfns[1]: ["a", "b"], lfns[2]: ["gone", "gone2"]}
    result = account([d["_id"] for d in docs], docs)
    check_catalog(result, [lfn for lfn, held in holders.items() for _ in held], docs)
    assert result.catalog_twice == sorted(lfns) and result.catalog_files == 6
    blocks = {name: {"files": [{"lfn": lfn}]} for lfn, (name, *_) in holders.items()}
    blocks.update(b={"files": [{"lfn": lfns[1]}]}, gone={"files": []})
    assert recheck_twice(result, holders, blocks.get) == sorted([lfns[0], lfns[2]])
    assert result.catalog_twice == [lfns[1]] and result.catalog_missing == [lfns[2]]
    assert result.catalog_files == 3


def test_work_by_host_and_the_wait_of_a_dead_hosts_files():
    finished = walk(request(1), ("state", "submitted"), at=2000.0)
    for h in finished["history"][1:]:
        h["by"] = "sim2-0"
    finished = walk(finished, ("state", "done"), at=2070.0)
    finished["history"][-1]["by"] = "sim-0"
    mine = walk(request(2), ("state", "submitted"), at=1990.0)
    mine["history"][-1]["by"] = "sim-0"
    split = work_by_host([finished, mine], ["sim", "sim2"], killed=("sim2", 2050.0))
    assert split["moves"] == {"sim2": 1, "sim": 2}
    assert split["shares_before_kill"] == {"sim": 0.5, "sim2": 0.5}
    # The file sim2 left unfinished at its death moved again 20 s later.
    assert split["killed"]["files"] == 1 and split["killed"]["max_wait"] == 20.0


@pytest.mark.timeout(600)
def test_a_chaos_run_loses_nothing(tmp_path):
    """A short run with every fault of `aso sim --chaos` and a second agent host killed
    midway: agents killed every 2 s, the embedded store killed and started twice, a storage
    outage, a failing link. Nothing lost, nothing left unfinished, nothing copied twice at
    once, the catalog exact."""
    plan = Plan(
        scale=3,
        users=10,
        sites=12,
        interval=2.0,
        duration=40.0,
        mean_duration=2.0,
        failure_rate=0.05,
        retry_delay=1.0,
        block_timeout=3.0,
        jobs_per_task=(5, 20),
    )
    options = RunOptions(
        workdir=tmp_path / "chaos",
        sample_every=1.0,
        drain_timeout=400.0,
        bucket=5.0,
        measure_ceiling=False,
        progress=False,
        hosts=2,
        chaos=ChaosPlan(kill_every=2.0, store_down=1.0, kill_host="sim2", kill_host_at=0.3),
        lease=20.0,
        heartbeat_expiry=10.0,
    )
    report = run_simulation(plan, options)
    accounting = report.accounting
    assert accounting.exact, accounting.problems()
    assert accounting.injected > 50 and accounting.copies_checked >= accounting.injected
    assert accounting.catalog_files
    chaos = report.chaos
    assert chaos is not None
    assert chaos["kills"] >= 5 and chaos["store_restarts"] == 2 and chaos["hosts_killed"] == 1
    # The outages were felt: the storage's (connection) and the link's (service).
    classes = report.analysis.error_classes
    assert classes["connection"] > 0 and classes["service"] > 0, classes
    assert report.hosts is not None and report.hosts["killed"]["files"] >= 0
    assert set(report.hosts["shares_before_kill"]) == {"sim", "sim2"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--scale", "0"], "scale must be positive"),
        (["--duration", "soon"], "not a duration"),
        (["--instances", "submitter=0"], "expected AGENT=N"),
        (["--outage", "T2_X:5m-1m"], "SITE:START-END"),
        (["--forbid", "T2_X:1m-5m"], "USER@SITE:START-END"),
        (["--quota", "alice@T2_X:1m-5m"], "expected SITE:START-END"),
        (["--quota", "T2_X:20XB@1m-5m"], "SITE:SIZE@START-END"),
        (["--quota", "T2_X:20GB@5m-1m"], "SITE:SIZE@START-END"),
        (["--frozen", "T2_X:1m"], "SITE:START-END"),
    ],
)
def test_bad_arguments_are_refused_with_a_message(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "aso", "sim", *args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert message in result.stderr


def test_a_simulated_transfer_longer_than_the_timeout_fails_as_a_timeout():
    from aso.config import SimConfig
    from aso.transfer.sim import SimService

    job = {"_id": "j1", "created": 100.0, "source_site": "A", "destination_site": "B"}
    slow = SimService(None, SimConfig(mean_duration=50.0, distribution="fixed", timeout=30.0))
    fate = slow.fate(job, "f1")
    assert (fate.error_class, fate.end) == ("timeout", 130.0)
    quick = SimService(None, SimConfig(mean_duration=20.0, distribution="fixed", timeout=30.0))
    assert quick.fate(job, "f1") == type(fate)(100.0, 120.0, None, None)


def test_one_seed_draws_the_same_fate_for_an_attempt_however_files_are_batched():
    """`sim.seed`'s promise (same seed, same durations and failures): a file's attempt meets
    the same fate in any job (job ids are new each run, batches differ with timing); another
    attempt of it, or another seed, draws again."""
    from aso.config import SimConfig
    from aso.transfer.sim import SimService

    def job(job_id: str, files: dict[str, int]) -> dict:
        entries = {f: {"attempt": n} for f, n in files.items()}
        return {"_id": job_id, "created": 0.0, "source_site": "A", "destination_site": "B",
                "files": entries}  # fmt: skip

    config = SimConfig(mean_duration=60.0, distribution="exponential", failure_rate=0.5,
                       timeout=10_000.0, seed=7)  # fmt: skip
    service = SimService(None, config)
    together = job("j-one", {f"f{i}": 0 for i in range(40)})
    alone = [job(f"j-{i}", {f"f{i}": 0}) for i in range(40)]
    fates = [service.fate(together, f"f{i}") for i in range(40)]
    assert fates == [service.fate(alone[i], f"f{i}") for i in range(40)]
    assert {f.error_class for f in fates} > {None}  # failures and successes both drawn
    again = [service.fate(job("j-two", {f"f{i}": 1}), f"f{i}") for i in range(40)]
    assert again != fates  # the next attempt draws anew
    other_seed = SimService(None, dataclasses.replace(config, seed=8))
    assert [other_seed.fate(together, f"f{i}") for i in range(40)] != fates


def test_the_yardstick_of_completed_over_expected_leaves_out_service_and_cool_off_time():
    from aso.sim.report import ideal_time, stages

    doc = walk(
        request(0),
        (model.STATE, "submitted"),
        (model.STATE, "failed_attempt"),
        (model.STATE, "retry"),
        (model.STATE, "new"),
        at=1000.0,
    )  # in retry from 1002 to 1003
    doc = walk(doc, *DONE, at=1010.0)
    doc["attempts"] = [
        {"job_id": "a", "service": "sim", "submitted": 1001.0, "ended": 1002.0},
        {"job_id": "b", "service": "sim", "submitted": 1011.0, "ended": 1011.5},
    ]
    assert ideal_time(doc) == 1.0 + 0.5 + 1.0
    # Since issue 22 the submitter takes the retry itself once its cool-off is over: the cool-off
    # is what the retry entry's `until` says (2 s), the 5 s the file then waited for the
    # submitter are queueing, and the last attempt's stages start at the cool-off's end.
    doc = walk(
        request(0),
        (model.STATE, "submitted"),
        (model.STATE, "failed_attempt"),
        (model.STATE, "retry"),
        at=1000.0,
    )  # in retry from 1002, cool-off until 1004
    doc["history"][-1]["until"] = 1004.0
    doc = walk(doc, (model.STATE, "submitted"), (model.STATE, "done"), at=1009.0)
    doc["attempts"] = [
        {"job_id": "a", "service": "sim", "submitted": 1000.0, "ended": 1001.0},
        {"job_id": "b", "service": "sim", "submitted": 1009.0, "ended": 1009.5},
    ]
    assert ideal_time(doc) == 1.0 + 0.5 + 2.0
    assert stages(doc, 1010.0) == {
        "queued": 5.0,
        "submitting": 0.0,
        "at_service": 0.5,
        "reporting": 0.5,
    }


def test_the_upload_benchmark_measures_job_uploads_on_a_store_of_its_own(tmp_path):
    """`make bench-uploads` (sim/bench_uploads.py): each count of uploaders uploads jobs of the
    workload, every file recorded, and prints uploads/s, latency and each party's CPU."""
    argv = [sys.executable, "-m", "aso.sim.bench_uploads", "--engine", ENGINE, "--uploaders",
            "1,3", "--seconds", "3", "--users", "5", "--sites", "3", "--workdir",
            str(tmp_path / "uploads")]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rounds = json.loads((tmp_path / "uploads" / "uploads.json").read_text())["rounds"]
    assert [r["uploaders"] for r in rounds] == [1, 3]
    for r in rounds:
        assert r["uploads_per_s"] > 0 and r["docs_per_s"] >= r["uploads_per_s"], r
        assert r["refused"] == 0 and r["store_cores"] > 0 and r["client_cores"] > 0, r
        assert 0 < r["latency_p50_ms"] <= r["latency_p95_ms"], r
    assert "job uploads on " + ENGINE in result.stdout
