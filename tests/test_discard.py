"""Temporary-area hygiene against real storage: the temporary copy of a file that failed for
good (or was killed) is deleted by the cleaner once `cleaner.failed_grace` has passed, and
nothing else is touched; such a request is then purgeable (before, it was purged with its
copy left behind, named by nothing). A file whose copy is gone is not resubmitted (the store
refuses it, `aso resubmit` says why); a job retry's new file renews it."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import pytest

from aso import model
from aso.actions import DISCARDED
from aso.agents.cleaner import Cleaner
from aso.core import request
from aso.local.xrootd import export_path, write_file
from aso.model import AGENT, CLEANUP, OWNER, STATE, Change
from aso.monitoring import purge
from aso.runtime import Runner
from aso.store import Forbidden
from aso.upload import judged_request, upload
from tests import storejs
from tests.conftest import DESTINATION, SOURCES, sample_request
from tests.test_actions import alice_config
from tests.test_cli import aso

GRACE = 1.5


@pytest.fixture()
def config(gfal_config):
    return dataclasses.replace(
        gfal_config,
        cleaner=dataclasses.replace(gfal_config.cleaner, failed_grace=GRACE, discard_interval=0),
    )


def never_copied(config, accounts, end: str, task: str) -> dict[str, Any]:
    """A request of alice's whose temporary copy is a real file, that failed for good or that
    she killed."""
    doc = sample_request("alice", task=task, source=SOURCES[0], destination=DESTINATION)
    stored = write_file(config, SOURCES[0], doc["source_lfn"], os.urandom(2000))
    doc = judged_request(
        user="alice", task=task, job_id=doc["job_id"], source=SOURCES[0],
        destination=DESTINATION, source_lfn=doc["source_lfn"],
        destination_lfn=doc["destination_lfn"], size=stored.size, adler32=stored.adler32,
    )  # fmt: skip
    owner = accounts["alice"].db(config.store.files_db)
    agent = accounts["agent"].db(config.store.files_db)
    doc["_rev"] = owner.create(doc)
    moves = [(OWNER, owner, "killed")] if end == "killed" else [
        (AGENT, agent, to) for to in ("submitted", "failed_attempt", "failed")]  # fmt: skip
    for role, db, to in moves:
        doc = model.transition(doc, [Change(STATE, to, "alice" if role == OWNER else "a-1")], role)
        doc["_rev"] = db.put(doc)
    return doc


def clean(config, ids: list[str]) -> tuple[int, dict[str, dict[str, Any]]]:
    """One cleaner cycle: (temporary copies it discarded, the documents after it)."""
    cleaner = Cleaner(config, "c1")
    runner = Runner(cleaner)
    runner.workset.start()
    try:
        report = runner.step(wait=False)
    finally:
        cleaner.close()
    return report["discarded"], cleaner.db.get_many(ids)


def temp_exists(config, doc: dict[str, Any]) -> bool:
    return export_path(config, doc["source"], doc["source_lfn"]).exists()


def test_a_failed_file_s_temporary_copy_goes_after_its_grace_and_nothing_else(
    config, accounts, admin
):
    task = "261207_100000:alice_discard"
    failed = never_copied(config, accounts, "failed", task)
    killed = never_copied(config, accounts, "killed", task)
    # Someone's file where the failed request would have written: never ours to delete.
    write_file(config, DESTINATION, failed["destination_lfn"], b"someone else's file")
    time.sleep(GRACE + 0.2)
    recent = never_copied(config, accounts, "failed", task)
    ids = [failed["_id"], killed["_id"], recent["_id"]]
    before = {i: d["_rev"] for i, d in admin.db(config.store.files_db).get_many(ids).items()}

    discarded, stored = clean(config, ids)
    assert discarded == 2

    for doc in (failed, killed):
        after = stored[doc["_id"]]
        assert (after[STATE], after[CLEANUP]) == (doc[STATE], "cleaned")
        assert after["history"][-1]["reason"] == (
            f"temporary copy deleted ({doc[STATE]} and not resubmitted: discarded)"
        )
        assert not temp_exists(config, doc)
        assert model.is_final(after)
    assert stored[recent["_id"]]["_rev"] == before[recent["_id"]]  # within its grace: untouched
    assert temp_exists(config, recent) and not model.is_final(stored[recent["_id"]])
    assert export_path(config, DESTINATION, failed["destination_lfn"]).read_bytes() == (
        b"someone else's file"
    )
    # The purge takes the discarded ones, not the one whose copy is still there.
    db = admin.db(config.store.files_db)
    purgeable = {d["_id"] for d in purge.select(db, time.time() + 60, 1000)}
    assert {failed["_id"], killed["_id"]} <= purgeable and recent["_id"] not in purgeable
    # A second look finds nothing more to discard.
    assert clean(config, ids) == (0, db.get_many(ids))


def test_a_discarded_file_is_renewed_only_by_a_job_retry(
    config, accounts, admin, store_config, tmp_path
):
    task = "261207_100001:alice_discarded"
    failed = never_copied(config, accounts, "failed", task)
    time.sleep(GRACE + 0.2)
    discarded = clean(config, [failed["_id"]])[1][failed["_id"]]
    assert discarded[CLEANUP] == "cleaned"
    owner = accounts["alice"].db(config.store.files_db)

    # Resubmitted as it is: refused by the store (and its in-memory twin), and by the command.
    resubmitted = model.transition(discarded, [Change(STATE, "new", "alice")], OWNER)
    reason = f"[transition] {DISCARDED}"
    with pytest.raises(Forbidden) as refused:
        owner.put(resubmitted)
    assert refused.value.reason == reason
    with pytest.raises(model.Refusal) as judged:
        storejs.validate_doc_update(
            resubmitted, discarded, {"name": "alice", "roles": ["aso-user"]}
        )
    assert judged.value.reason == reason
    path = alice_config(store_config, config.store.files_db, accounts, tmp_path)
    said = aso("resubmit", "--task", task, "--json", config=path)
    assert said.returncode == 1, said.stderr
    assert json.loads(said.stdout)["refused"] == {failed["_id"]: DISCARDED}
    # Its cleanup set back alone: refused.
    reset = model.transition(discarded, [Change(CLEANUP, "pending", "alice")], model.ADMIN)
    with pytest.raises(Forbidden, match="cleanup cannot go from cleaned to pending"):
        owner.put(reset)
    assert owner.get(failed["_id"]) == discarded

    # A renewal that leaves its cleanup `cleaned`: its new file would never be deleted (round 31).
    kept = request.renewed(discarded, {"job_retry": 1}, "alice", time.time())
    kept = {**kept, CLEANUP: "cleaned", "history": kept["history"][:-1]}
    with pytest.raises(Forbidden, match="its renewal sets cleanup back to pending"):
        owner.put(kept)
    # A job retry wrote a new file under the same LFN: its upload renews the request.
    stored = write_file(config, SOURCES[0], failed["source_lfn"], os.urandom(3000))
    retry = judged_request(
        user="alice", task=task, job_id=failed["job_id"], source=SOURCES[0],
        destination=DESTINATION, source_lfn=failed["source_lfn"],
        destination_lfn=failed["destination_lfn"], size=stored.size, adler32=stored.adler32,
        job_retry=1,
    )  # fmt: skip
    report = upload(owner, [retry])
    assert report.renewed == [failed["_id"]], report
    renewed = owner.get(failed["_id"])
    assert (renewed[STATE], renewed[CLEANUP], renewed["job_retry"]) == ("new", "pending", 1)
    assert [(h["axis"], h["to"]) for h in renewed["history"][-2:]] == [
        (STATE, "new"), (CLEANUP, "pending")]  # fmt: skip


def test_no_resubmission_or_renewal_while_its_copy_is_being_deleted(config, accounts):
    """The cleaner records a discard as under way (`discarding`) before it deletes anything:
    a resubmission or a job retry's renewal in between is refused (round 31: 150 of 150
    resubmissions sent during a discard were taken, and their files deleted under them); the
    outcome clears it."""
    task = "261207_100002:alice_racing"
    failed = never_copied(config, accounts, "failed", task)
    owner = accounts["alice"].db(config.store.files_db)
    agent = accounts["agent"].db(config.store.files_db)
    started = request.discarding(agent.get(failed["_id"]), time.time())
    started["_rev"] = agent.put(started)
    resubmitted = model.transition(started, [Change(STATE, "new", "alice")], OWNER)
    renewal = request.renewed(started, {"job_retry": 1}, "alice", time.time())
    for doc in (resubmitted, renewal):
        with pytest.raises(Forbidden, match="its temporary copy is being deleted"):
            owner.put(doc)
    time.sleep(GRACE + 0.2)
    discarded, stored = clean(config, [failed["_id"]])  # a discard left under way is finished
    assert discarded == 1 and stored[failed["_id"]]["discarding"] is None
    assert stored[failed["_id"]][CLEANUP] == "cleaned" and not temp_exists(config, failed)


def test_deletions_that_keep_failing_keep_no_other_file_waiting(config, accounts):
    """Round 31: a user's 210 failed files whose temporary path could not be deleted filled
    the cleaner's every batch with retries not yet due, and nobody else's copy was discarded.
    A retry is read only once its backoff is over, apart from the first tries."""
    config = dataclasses.replace(config, cleaner=dataclasses.replace(config.cleaner, batch=1))
    task = "261207_100003:alice_blocking"
    stuck = never_copied(config, accounts, "killed", task)
    path = export_path(config, stuck["source"], stuck["source_lfn"])
    path.unlink()
    path.mkdir()  # a non-empty directory where the file was: its deletion fails
    (path / "inside").write_bytes(b"x")
    time.sleep(GRACE + 0.2)
    later = never_copied(config, accounts, "failed", "261207_100004:alice_later")
    time.sleep(GRACE + 0.2)
    assert clean(config, [stuck["_id"]])[1][stuck["_id"]][CLEANUP] == "cleanup_error"
    discarded, stored = clean(config, [stuck["_id"], later["_id"]])
    assert discarded == 1 and stored[later["_id"]][CLEANUP] == "cleaned"
    assert stored[stuck["_id"]][CLEANUP] == "cleanup_error"
