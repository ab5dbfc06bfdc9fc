"""Submitter and monitor over the `sim` transfer service and the real store: the flow of files,
caps and fair share, failures, kills, crashes at the worst moments, and two submitters at once.
(The same agents over real storage with the gfal service: tests/test_gfal_pipeline.py.)"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from aso import model
from aso.agents.monitor import Monitor
from aso.agents.submitter import Submitter
from aso.core import request as core_request
from aso.model import OWNER, STATE, Change
from aso.runtime import Runner
from aso.store import Conflict
from aso.transfer.base import FileTransfer, JobRequest, job_id_for
from aso.transfer.jobstore import is_fence, new_job_document
from aso.transfer.sim import SimService
from tests.conftest import only_on, write_config
from tests.pipeline_helpers import (
    LINKS,
    assert_each_file_in_one_job,
    job_table,
    jobs_of,
    owner_db,
    run_until,
    states,
    upload,
)
from tests.test_store import branch

ASO = str(Path(sys.executable).parent / "aso")


def test_files_flow_to_done_with_their_history(sim_config, accounts, admin):
    ids = upload(accounts, sim_config, 25)
    db = admin.db(sim_config.store.files_db)
    runners = [Runner(Submitter(sim_config, "s1")), Runner(Monitor(sim_config, "m1"))]
    run_until(lambda: states(db, ids) == Counter(done=50), runners)
    for doc in db.get_many(ids).values():
        # No publication: the monitor deletes the temporary copy and records it in the write
        # of the `done` (three writes in the file's life: upload, submission, outcome).
        assert [h["to"] for h in doc["history"]] == ["new", "submitted", "done", "cleaned"]
        assert [h["by"] for h in doc["history"][1:]] == ["s1", "m1", "m1"]
        assert doc["_rev"].startswith("3-") and doc["cleanup"] == "cleaned"
        [attempt] = doc["attempts"]
        assert attempt["outcome"] == "done" and attempt["service"] == "sim"
        assert attempt["job_id"] == doc["transfer"]["job_id"] and doc["lease"] is None
    deleted = runners[1].agent.deleter.files.sim.deleted
    temp_copies = [f"sim://{d['source']}{d['source_lfn']}" for d in db.get_many(ids).values()]
    assert sorted(deleted) == sorted(temp_copies)
    jobs = jobs_of(admin, sim_config)
    assert all(len(job["files"]) <= 10 for job in jobs)
    for job in jobs:  # one user and one link per job, tagged for the service's dashboards
        files = db.get_many(list(job["files"])).values()
        assert len({(d["user"], d["source"], d["destination"]) for d in files}) == 1
        assert job["metadata"]["issuer"] == "ASO" and job["metadata"]["aso_key"] == job["key"]
    assert_each_file_in_one_job(admin, sim_config, ids)


def test_link_cap_holds_while_files_flow(sim_config, accounts, admin):
    config = dataclasses.replace(
        sim_config, transfer=dataclasses.replace(sim_config.transfer, max_active_per_link=4)
    )
    ids = upload(accounts, config, 12, users=("alice",), links=LINKS[:1])
    db = admin.db(config.store.files_db)
    submitter, monitor = Runner(Submitter(config, "s1")), Runner(Monitor(config, "m1"))
    peak = 0

    def finished() -> bool:
        nonlocal peak
        counts = states(db, ids)
        peak = max(peak, counts["submitted"])
        return counts["done"] == 12

    run_until(finished, [submitter, monitor])
    assert 0 < peak <= 4


def test_failed_attempts_carry_reason_and_class(sim_config, accounts, admin):
    config = dataclasses.replace(
        sim_config,
        sim=dataclasses.replace(
            sim_config.sim,
            link_failure_rates={"T2_IT_Pisa>T2_DE_DESY": 1.0},
            failure_classes={"source_missing": 1.0},
        ),
    )
    ids = upload(accounts, config, 6, users=("alice",))
    db = admin.db(config.store.files_db)
    runners = [Runner(Submitter(config, "s1")), Runner(Monitor(config, "m1"))]
    run_until(
        lambda: (
            sum(states(db, ids).values()) == 6
            and states(db, ids)["submitted"] + states(db, ids)["new"] == 0
        ),
        runners,
    )
    docs = db.get_many(ids).values()
    failed = [d for d in docs if d[STATE] == "failed_attempt"]
    assert {d["source"] for d in failed} == {"T2_IT_Pisa"} and len(failed) == 3
    for doc in failed:
        assert doc["error_class"] == "source_missing"
        assert (
            "simulated failure (source_missing) on T2_IT_Pisa>T2_DE_DESY" in (doc["failure_reason"])
        )
        assert doc["attempts"][-1]["outcome"] == "failed"
        assert doc["history"][-1]["reason"] == doc["failure_reason"]
    assert Counter(d[STATE] for d in docs)["done"] == 3


def test_kills_of_waiting_and_active_files(sim_config, accounts, admin):
    config = dataclasses.replace(
        sim_config, sim=dataclasses.replace(sim_config.sim, mean_duration=30.0)
    )
    ids = upload(accounts, config, 3, users=("alice",))
    owner = owner_db(accounts, config)
    db = admin.db(config.store.files_db)
    waiting = owner.get(ids[0])
    owner.put(model.transition(waiting, [Change(STATE, "killed", "alice")], OWNER))
    submitter, monitor = Runner(Submitter(config, "s1")), Runner(Monitor(config, "m1"))
    run_until(lambda: states(db, ids)["submitted"] == 2, [submitter])
    for doc_id in ids[1:]:
        doc = owner.get(doc_id)
        owner.put(model.transition(doc, [Change(STATE, "kill_requested", "alice")], OWNER))
    run_until(lambda: states(db, ids) == Counter(killed=3), [monitor], timeout=20)
    for doc in db.get_many(ids[1:]).values():
        assert doc["attempts"][-1]["outcome"] == "canceled"
        assert doc["history"][-1]["by"] == "m1"
    cancelled = {fid for job in jobs_of(admin, config) for fid in job["cancel"]}
    assert cancelled == set(ids[1:])  # the cancels reached the service


def _aso_agent(config_path: Path, agent: str, fault: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ASO_FAULTS=fault)
    return subprocess.run(
        [
            ASO,
            "--config",
            str(config_path),
            "agent",
            agent,
            "--once",
            "--instance",
            f"{agent}-crashing",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_submitter_killed_between_intent_and_submission(sim_config, accounts, admin):
    """kill -9 after the intent (`submitted`, with the job's id and a lease) was written and
    before the job exists: the monitor finds no job, waits out the lease, then puts the files
    back; they are submitted again and end done, each in one job."""
    ids = upload(accounts, sim_config, 5, users=("alice",), links=LINKS[:1])
    path = write_config(sim_config)
    died = _aso_agent(path, "submitter", "submitter.after_intent")
    assert died.returncode == -9, died.stderr
    db = admin.db(sim_config.store.files_db)
    assert states(db, ids) == Counter(submitted=5)
    assert jobs_of(admin, sim_config) == []  # the job was never created
    intent = db.get(ids[0])
    monitor = Runner(Monitor(sim_config, "m1"))
    run_until(lambda: True, [monitor])  # a poll within the lease: nothing to do yet
    assert states(db, ids) == Counter(submitted=5)
    time.sleep(sim_config.transfer.lease)
    runners = [monitor, Runner(Submitter(sim_config, "s1"))]
    run_until(lambda: states(db, ids) == Counter(done=5), runners)
    for doc in db.get_many(ids).values():
        assert [h["to"] for h in doc["history"]] == [
            "new", "submitted", "new", "submitted", "done", "cleaned"
        ]  # fmt: skip
        assert doc["history"][2]["reason"] == "lease expired, no job"
        first, last = doc["attempts"]
        assert first["outcome"] == "canceled" and last["outcome"] == "done"
        assert first["fenced"] == "absent" and first["job_id"] == intent["transfer"]["job_id"]
    assert_each_file_in_one_job(admin, sim_config, ids)
    # The dead submitter's call, had it only been late, finds the fence: no job is made.
    jobs = admin.db(sim_config.store.transfers_db)
    late = new_job_document(
        JobRequest(
            key=intent["lease"]["job_key"],
            files=(FileTransfer(ids[0], "root://a/x", "root://b/x", 1, "00000001"),),
            user="alice",
            task=intent["task"],
            source_site=intent["source"],
            destination_site=intent["destination"],
        ),
        "sim",
        time.time(),
    )
    assert late["_id"] == intent["transfer"]["job_id"]
    with pytest.raises(Conflict):
        jobs.create(late)
    assert is_fence(jobs.get(late["_id"]))


def test_a_restarted_submitter_ends_its_predecessors_leases_early(sim_config, accounts, admin):
    """kill -9 after the intent (`submitted`); the same instance started again (as `aso run`
    does) ends the leases its dead predecessor took at SUBMIT_MARGIN after its own start
    instead of their full length; another instance leaves them alone. The files then end done."""
    config = dataclasses.replace(
        sim_config, transfer=dataclasses.replace(sim_config.transfer, lease=20.0)
    )
    ids = upload(accounts, config, 4, users=("alice",), links=LINKS[:1])
    died = _aso_agent(write_config(config), "submitter", "submitter.after_intent")
    assert died.returncode == -9, died.stderr
    db = admin.db(config.store.files_db)
    taken = {i: d["lease"]["until"] for i, d in db.get_many(ids).items()}
    other = Submitter(config, "someone-else")
    intended = list(db.get_many(ids).values())
    assert other.shorten_predecessors_leases(Runner(other).context(intended, {})) == 0
    assert {i: d["lease"]["until"] for i, d in db.get_many(ids).items()} == taken
    again = Runner(Submitter(config, "submitter-crashing"))
    again.workset.start()
    report = again.step(wait=False)
    assert report["leases_shortened"] == 4
    shortened = {d["lease"]["until"] for d in db.get_many(ids).values()}
    assert shortened == {again.agent.started + 10.0}  # min(SUBMIT_MARGIN, lease / 2)
    assert max(shortened) < min(taken.values())
    run_until(
        lambda: states(db, ids) == Counter(done=4),
        [Runner(Monitor(config, "m1")), again],
        timeout=60,
    )
    for doc in db.get_many(ids).values():
        assert doc["history"][2]["reason"] == "lease expired, no job"
    assert_each_file_in_one_job(admin, config, ids)


def test_submitter_killed_after_the_job_was_created(sim_config, accounts, admin):
    """kill -9 right after the job was made: nothing was left to write (the documents named
    the job before it was made), so the monitor follows it as any other; no second job is
    ever made."""
    ids = upload(accounts, sim_config, 5, users=("alice",), links=LINKS[:1])
    died = _aso_agent(write_config(sim_config), "submitter", "submitter.after_submit")
    assert died.returncode == -9, died.stderr
    db = admin.db(sim_config.store.files_db)
    assert states(db, ids) == Counter(submitted=5)
    [job] = jobs_of(admin, sim_config)
    runners = [Runner(Monitor(sim_config, "m1")), Runner(Submitter(sim_config, "s1"))]
    run_until(lambda: states(db, ids) == Counter(done=5), runners)
    for doc in db.get_many(ids).values():
        assert doc["transfer"]["job_id"] == job["_id"]
        assert [h["to"] for h in doc["history"]] == ["new", "submitted", "done", "cleaned"]
    assert_each_file_in_one_job(admin, sim_config, ids)


def test_monitor_killed_mid_poll(sim_config, accounts, admin):
    ids = upload(accounts, sim_config, 5, users=("alice",), links=LINKS[:1])
    db = admin.db(sim_config.store.files_db)
    run_until(
        lambda: states(db, ids) == Counter(submitted=5), [Runner(Submitter(sim_config, "s1"))]
    )
    time.sleep(0.5)  # the simulated copies end
    died = _aso_agent(write_config(sim_config), "monitor", "monitor.after_status")
    assert died.returncode == -9, died.stderr
    assert states(db, ids) == Counter(submitted=5)  # it died before writing anything
    run_until(lambda: states(db, ids) == Counter(done=5), [Runner(Monitor(sim_config, "m2"))])
    assert_each_file_in_one_job(admin, sim_config, ids)


def test_two_submitters_split_the_work_and_never_share_a_file(sim_config, accounts, admin):
    ids = upload(accounts, sim_config, 30, links=LINKS)
    db = admin.db(sim_config.store.files_db)
    submitters = [Runner(Submitter(sim_config, name)) for name in ("s1", "s2")]
    for runner in submitters:  # both alive before either works
        runner._beat(force=True)
    for runner in submitters:
        runner._beat(force=True)
    assert submitters[0].membership.live == ["s1", "s2"] == submitters[1].membership.live
    errors: list[BaseException] = []

    def work(runner: Runner) -> None:
        try:
            runner.workset.start()
            deadline = time.monotonic() + 30
            while states(db, ids)["new"] and time.monotonic() < deadline:
                runner.step(wait=False)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in submitters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert states(db, ids) == Counter(submitted=60)
    by_instance = Counter(d["history"][1]["by"] for d in db.get_many(ids).values())
    assert set(by_instance) == {"s1", "s2"}  # the work was split
    assert_each_file_in_one_job(admin, sim_config, ids)
    # Links are whole: no link was served by both instances.
    links = {}
    for doc in db.get_many(ids).values():
        links.setdefault((doc["source"], doc["destination"]), set()).add(doc["history"][1]["by"])
    assert all(len(who) == 1 for who in links.values())


def test_kill_of_a_file_whose_submitter_died_before_submitting(sim_config, accounts, admin):
    """The owner kills files a dead submitter left `submitted` before it made their job: the
    monitor finds no job for their key once their lease is over and kills them; a file whose
    job did reach the service is cancelled there first."""
    ids = upload(accounts, sim_config, 3, users=("alice",), links=LINKS[:1])
    died = _aso_agent(write_config(sim_config), "submitter", "submitter.after_intent")
    assert died.returncode == -9, died.stderr
    owner = owner_db(accounts, sim_config)
    for doc_id in ids:
        owner.put(
            model.transition(owner.get(doc_id), [Change(STATE, "kill_requested", "alice")], OWNER)
        )
    db = admin.db(sim_config.store.files_db)
    run_until(
        lambda: states(db, ids) == Counter(killed=3),
        [Runner(Monitor(sim_config, "m1"))],
        timeout=20,
    )
    job_ids = set()
    for doc in db.get_many(ids).values():
        assert doc["history"][-1]["reason"] == "killed before its job reached the service"
        assert doc["attempts"][-1]["fenced"] == "absent"
        job_ids.add(doc["transfer"]["job_id"])
    # No job was ever made for them, and none can be now: a fence stands at the job's id.
    assert jobs_of(admin, sim_config) == []
    assert {d["_id"] for d in job_table(admin, sim_config) if is_fence(d)} == job_ids

    # Killed after its job was made: cancelled there.
    slow = dataclasses.replace(
        sim_config, sim=dataclasses.replace(sim_config.sim, mean_duration=60.0)
    )
    more = upload(accounts, slow, 2, users=("alice",), links=LINKS[1:2])
    died = _aso_agent(write_config(slow), "submitter", "submitter.after_submit")
    assert died.returncode == -9, died.stderr
    for doc_id in more:
        owner.put(
            model.transition(owner.get(doc_id), [Change(STATE, "kill_requested", "alice")], OWNER)
        )
    run_until(
        lambda: states(db, more) == Counter(killed=2), [Runner(Monitor(slow, "m2"))], timeout=20
    )
    [job] = jobs_of(admin, slow)
    assert set(job["cancel"]) == set(more)  # the service was told
    for doc in db.get_many(more).values():
        assert doc["transfer"]["job_id"] == job["_id"]
        assert doc["attempts"][-1]["outcome"] == "canceled"


@only_on("couchdb", "conflicting branches are a cluster's (made with new_edits=false, which "
         "pouchdb-server answers with [] and does not apply)")  # fmt: skip
def test_a_file_is_not_released_while_another_branch_s_job_may_run(sim_config, accounts, admin):
    """CLUSTER_CONFLICTING_BRANCHES, as a 3-node run found it: two submitters stored their
    intents for one file on different nodes; the cluster shows the branch whose job was never
    made (its writer was told it may not have won and dropped the file) while the other
    writer's job runs. When the lease ends, the monitor follows the job that runs instead of
    releasing the file; a branch whose job was never made is fenced and withdrawn, and only
    then does the file go back to `new`."""
    slow = dataclasses.replace(
        sim_config, sim=dataclasses.replace(sim_config.sim, mean_duration=60.0)
    )
    running, idle, dropped = upload(accounts, slow, 3, users=("alice",), links=LINKS[:1])
    db = admin.db(slow.store.files_db)
    service = SimService(admin.db(slow.store.transfers_db), slow.sim)
    other_jobs = {}
    for doc_id in (running, idle, dropped):
        doc, now = db.get(doc_id), time.time()
        shown_key, other_key = f"s2:{uuid.uuid4()}", f"s3:{uuid.uuid4()}"
        for key, digest in ((shown_key, "f" * 32), (other_key, "0" * 32)):
            lease = {"owner": key[:2], "until": now - 1, "job_key": key}
            intent = core_request.submitted(doc, job_id_for(key), "sim", key[:2], now, lease)
            branch(db, intent, doc["_rev"], digest)
        other_jobs[doc_id] = job_id_for(other_key)
        assert len(db.leaves(doc_id)) == 2 and db.get(doc_id)["lease"]["job_key"] == shown_key
        sites = (doc["source"], doc["destination"])
        if doc_id != idle:
            files = (FileTransfer(doc_id, "sim://a/x", "sim://b/x", doc["size"], "00000001"),)
            service.submit(JobRequest(other_key, files, "alice", doc["task"], *sites))
        if doc_id == dropped:  # the shown branch's job was made, without this file
            files = (FileTransfer("another", "sim://a/y", "sim://b/y", 1, "00000001"),)
            service.submit(JobRequest(shown_key, files, "alice", doc["task"], *sites))
    run_until(
        lambda: (
            states(db, [idle]) == Counter(new=1)
            and all(db.get(i)["transfer"]["job_id"] == other_jobs[i] for i in (running, dropped))
        ),
        [Runner(Monitor(slow, "m1"))],
        timeout=30,
    )
    for doc_id in (running, dropped):
        followed = db.get(doc_id)
        assert followed[STATE] == "submitted" and followed["lease"] is None
    assert len(db.leaves(idle)) == 1  # the other branch withdrawn once its job was fenced
    assert is_fence(admin.db(slow.store.transfers_db).get(other_jobs[idle]))
    assert db.get(idle)["attempts"][-1]["fenced"] == "absent"


@only_on("couchdb", "conflicting branches are a cluster's (made with new_edits=false, which "
         "pouchdb-server answers with [] and does not apply)")  # fmt: skip
def test_an_intent_on_a_branch_beside_another_s_job_is_not_submitted(
    sim_config, accounts, admin, monkeypatch
):
    """CLUSTER_CONFLICTING_BRANCHES, as a 3-node run with two nodes killed found it: a retry
    manager's edit stored below the quorum was the document on its node; that node's submitter
    took it and its intent was stored at the quorum (an edit of a conflicting leaf is), beside
    the branch whose submitter's job ran: the file was copied twice at once. The submitter reads
    its intents back: a file with another branch at the service stays out of its job (its
    intent kept while it is the cluster's winner, withdrawn once another branch beats it), and
    the monitor follows the other branch's job when the lease ends."""
    ids = upload(accounts, sim_config, 4, users=("alice",), links=LINKS[:1])
    kept, beaten, alone, followed = ids
    db = admin.db(sim_config.store.files_db)
    service = SimService(admin.db(sim_config.store.transfers_db), sim_config.sim)
    other_jobs, other_branch = {}, {}
    # A branch whose job the winner followed already and whose copy ended there (its outcome
    # an attempt of the winner's) copies nothing more: the file goes on to its next attempt.
    doc, now = db.get(followed), time.time()
    key = f"s2:{uuid.uuid4()}"
    lease = {"owner": "s2", "until": now - 1, "job_key": key}
    branch(db, core_request.submitted(doc, job_id_for(key), "sim", "s2", now, lease), doc["_rev"],
           "0" * 32)  # fmt: skip
    own = f"s3:{uuid.uuid4()}"
    won = core_request.submitted(doc, job_id_for(own), "sim", "s3", now, {**lease, "job_key": own})
    won["_rev"] = branch(db, won, doc["_rev"], "f" * 32)
    for step, digest in zip((
        lambda d: core_request.job_recorded(d, job_id_for(key), "sim", now),
        lambda d: core_request.attempt_ended(d, "failed_attempt", "m1", now, outcome="failed",
                                             reason="lost", error_class="connection"),
        lambda d: core_request.retry_scheduled(d, "r1", now, 0.0, "retry 1"),
    ), ("e" * 32, "d" * 32, "c" * 32), strict=True):  # fmt: skip
        moved = step(won)
        moved["_rev"] = branch(db, moved, won["_rev"], digest)
        won = moved
    assert db.get(followed)[STATE] == "retry" and len(db.leaves(followed)) == 2
    for doc_id in (kept, beaten):
        doc, now = db.get(doc_id), time.time()
        # The branch the submitter sees (the winner): an edit of the same revision ...
        branch(db, {**doc, "last_update": now}, doc["_rev"], "f" * 32)
        # ... beside another submitter's intent, whose job runs.
        key = f"s2:{uuid.uuid4()}"
        lease = {"owner": "s2", "until": now + 60, "job_key": key}
        intent = core_request.submitted(doc, job_id_for(key), "sim", "s2", now, lease)
        other_branch[doc_id] = (intent, branch(db, intent, doc["_rev"], "0" * 32))
        adler32 = doc["checksum"]["adler32"]
        files = (FileTransfer(doc_id, "sim://a/x", "sim://b/x", doc["size"], adler32),)
        sites = (doc["source"], doc["destination"])
        service.submit(JobRequest(key, files, "alice", doc["task"], *sites))
        other_jobs[doc_id] = job_id_for(key)
        assert db.get(doc_id)[STATE] == "new" and len(db.leaves(doc_id)) == 2
    intend = Submitter.intend

    def intend_while_the_other_branch_moves_on(self, *args, **kwargs):
        intended = intend(self, *args, **kwargs)
        intent, rev = other_branch[beaten]  # the other branch writes on: it beats the intent
        branch(db, {**intent, "last_update": time.time()}, rev, "f" * 32)
        return intended

    monkeypatch.setattr(Submitter, "intend", intend_while_the_other_branch_moves_on)
    run_until(
        lambda: states(db, [alone, followed]) == Counter(submitted=2),
        [Runner(Submitter(sim_config, "s1"))],
    )
    assert_each_file_in_one_job(admin, sim_config, ids)
    assert db.get(followed)["history"][-1]["by"] == "s1"
    assert db.get(kept)["history"][-1]["by"] == "s1"  # the intent is kept: the winner
    assert [leaf["history"][-1]["by"] for leaf in db.leaves(beaten)] == ["s2"]  # withdrawn
    run_until(
        lambda: states(db, ids) == Counter(done=4),
        [Runner(Monitor(sim_config, "m1"))],
        timeout=30,
    )
    assert db.get(kept)["transfer"]["job_id"] == other_jobs[kept]  # followed at lease end
    assert_each_file_in_one_job(admin, sim_config, ids)
