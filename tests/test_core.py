"""What the agents decide, tested as the plain functions of aso/core/ it is: no store, no
storage, no service (`make test-fast`). The pipeline tests (tests/test_pipeline.py and the
agents' own) run the same decisions end to end on both real stores."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from aso import model
from aso.config import CleanerConfig
from aso.core import admission, cleanup, destination, publication, request, submission, turns
from aso.core.outcome import outcome
from aso.model import CLEANUP, PUBLICATION, STATE
from aso.transfer import errors
from aso.transfer.base import DONE, FAILED, FileStatus
from tests import storejs
from tests.conftest import sample_request

NOW = 1_800_000_000.0


def submitted(**overrides: Any) -> dict[str, Any]:
    """A request whose first attempt is at the transfer service."""
    doc = sample_request(**overrides)
    lease = {"owner": "s1", "until": NOW + 600, "key": "k1"}
    return {**doc, **request.submitted(doc, "job-1", "gfal", "s1", NOW, lease)}


def done(doc: dict[str, Any], at: float = NOW) -> dict[str, Any]:
    return {**doc, **outcome(doc, FileStatus(doc["_id"], DONE, "FINISHED", verified=True), "m", at)}


# --- the submitter ------------------------------------------------------------------------------
def test_plan_jobs_fair_share_priority_and_site_caps():
    def doc(user: str, n: int, priority: int = 0, link=("T2_A_a", "T2_B_b")) -> dict[str, Any]:
        return {
            "_id": f"{user}{n}",
            "user": user,
            "source": link[0],
            "destination": link[1],
            "created": float(n),
            "priority": priority,
        }

    heavy = [doc("alice", i) for i in range(100)]
    light = [doc("bob", i) for i in range(5)]
    urgent = [doc("alice", 1000, priority=10)]
    caps = submission.Caps(per_link=10, per_site={}, default_site=100)
    jobs = submission.plan_jobs(heavy + light + urgent, [], caps, max_files=100)
    chosen = [d for job in jobs for d in job]
    assert len(chosen) == 10
    assert Counter(d["user"] for d in chosen) == {"alice": 5, "bob": 5}  # turns, not arrival
    assert urgent[0] in chosen  # alice's urgent file goes first among hers
    # A site cap shared by two links, and files already in flight, count too.
    other_link = [doc("carol", i, link=("T2_C_c", "T2_B_b")) for i in range(10)]
    in_flight = [dict(doc("dave", i), state="submitted") for i in range(3)]
    caps = submission.Caps(per_link=100, per_site={"T2_B_b": 8}, default_site=100)
    chosen = [
        d for job in submission.plan_jobs(heavy + other_link, in_flight, caps, 4) for d in job
    ]
    assert len(chosen) == 5  # 8 at T2_B_b minus the 3 in flight
    assert all(len(job) <= 4 for job in submission.plan_jobs(heavy, [], caps, 4))


def test_a_job_holds_one_user_s_files_of_one_link():
    """Files of two users, or of two groups of one user, never share a job (a job runs with
    one credential)."""
    docs = [sample_request("alice") for _ in range(3)] + [sample_request("bob") for _ in range(2)]
    docs.append(sample_request("alice", group="higgs"))
    caps = submission.Caps(per_link=100, per_site={}, default_site=100)
    jobs = submission.plan_jobs(docs, [], caps, max_files=100)
    assert sorted(len(job) for job in jobs) == [1, 2, 3]
    assert all(len({submission.group_of(d) for d in job}) == 1 for job in jobs)


def test_a_retry_waits_for_its_cool_off():
    doc = sample_request()
    assert submission.ready_to_submit(doc, NOW)
    retry = {**doc, STATE: "retry", "retry_after": NOW + 60}
    assert not submission.ready_to_submit(retry, NOW)
    assert submission.ready_to_submit(retry, NOW + 60)
    assert not submission.ready_to_submit({**doc, STATE: "submitted"}, NOW + 600)


def test_batches_never_split_a_job():
    plans = [[{"_id": f"{j}-{i}"} for i in range(n)] for j, n in enumerate((400, 700, 10, 5))]
    batches = list(submission.batches_of(plans, 1000))
    assert [sum(map(len, b)) for b in batches] == [1100, 15]
    assert [p for b in batches for p in b] == plans


# --- the monitor --------------------------------------------------------------------------------
def test_a_verified_copy_is_done_and_a_running_one_is_nothing_yet():
    doc = submitted()
    assert outcome(doc, FileStatus(doc["_id"], "active", "ACTIVE"), "m", NOW) is None
    ended = done(doc)
    assert ended[STATE] == "done" and ended["attempts"][-1]["outcome"] == "done"


def test_a_kill_that_came_after_the_copy_ends_done_and_says_so():
    """A file whose owner killed it while its copy finished ends done, its history and its
    status row saying the kill came too late (the store's view runs the same document)."""
    doc = {**submitted(), STATE: "kill_requested"}
    ended = done(doc)
    assert ended[STATE] == "done" and ended["history"][-1]["reason"] == model.KILL_CAME_LATE
    [(_, row)] = storejs.files_design().map("by_task", ended)
    assert row["note"] == model.KILL_CAME_LATE
    [(_, plain)] = storejs.files_design().map("by_task", done(submitted()))
    assert plain["note"] is None and done(submitted())["history"][-1].get("reason") is None


def test_an_unverified_copy_waits_for_its_look_and_a_wrong_one_fails():
    doc = submitted()
    status = FileStatus(doc["_id"], DONE, "FINISHED", verified=False)
    assert outcome(doc, status, "m", NOW) is None  # no look yet
    assert outcome(doc, status, "m", NOW, destination.unchecked("storage down")) is None
    there = outcome(doc, status, "m", NOW, destination.found(None))
    assert there is not None and there[STATE] == "done"
    wrong = outcome(doc, status, "m", NOW, destination.found("size 12, expected 1000"))
    assert wrong is not None and wrong[STATE] == "failed_attempt"
    assert wrong["attempts"][-1]["error_class"] == destination.NOT_DONE_CLASS
    mismatch = FileStatus(doc["_id"], DONE, "FINISHED", checksum="ffffffff", verified=True)
    failed = outcome(doc, mismatch, "m", NOW)
    assert failed is not None and "checksum mismatch" in failed["attempts"][-1]["reason"]


@pytest.mark.parametrize("killing", [False, True])
def test_a_failure_is_classified_and_a_kill_ends_killed(killing):
    doc = submitted()
    if killing:
        doc = {**doc, STATE: "kill_requested"}
    status = FileStatus(doc["_id"], FAILED, "FAILED", reason="No space left on device")
    ended = outcome(doc, status, "m", NOW)
    assert ended is not None
    assert ended[STATE] == ("killed" if killing else "failed_attempt")
    last = ended["attempts"][-1]
    assert last["outcome"] == "failed" and last["reason"] == "No space left on device"
    assert last["error_class"] == errors.classify(message="No space left on device")


# --- the cleanup ------------------------------------------------------------------------------
def test_a_cleanup_is_due_once_the_copy_is_done_and_its_backoff_over():
    copied = done(submitted())
    assert copied[CLEANUP] in model.CLEANUP_DUE and cleanup.due(copied, NOW)
    waiting = {**copied, "cleanup_retry_after": NOW + 30}
    assert not cleanup.due(waiting, NOW) and cleanup.due(waiting, NOW + 30)
    # A file waiting for its block is the publisher's to clean; one that needs none, at once.
    assert cleanup.cleanable_at_done(copied, NOW) is (
        copied[PUBLICATION] in model.FINAL[PUBLICATION]
    )
    settings = CleanerConfig()
    failed = cleanup.cleanup_recorded(
        copied, cleanup.Outcome(False, "gfal: timeout"), "c", NOW, settings
    )
    assert failed[CLEANUP] == "cleanup_error" and failed["cleanup_retry_after"] > NOW
    cleaned = cleanup.cleanup_recorded(copied, cleanup.Outcome(True, "deleted"), "c", NOW, settings)
    assert cleaned[CLEANUP] == "cleaned"


# --- the publisher ----------------------------------------------------------------------------
def test_blocks_close_when_full_by_files_or_bytes_and_the_rest_waits():
    files = [
        done(submitted(publish_info={"dataset": "/P/alice-x-v1/USER"}), NOW - i) for i in range(7)
    ]
    blocks = publication.close_blocks(files, NOW, 3, 3600, lambda task: False)
    assert [len(b) for b in blocks] == [3, 3]  # full ones; the 7th waits
    oldest_first = sorted(files, key=lambda d: (publication.done_at(d), d["_id"]))
    assert [d["_id"] for b in blocks for d in b] == [d["_id"] for d in oldest_first[:6]]
    one_entry = publication.entry_chars(files[0])
    by_bytes = publication.close_blocks(files, NOW, 100, 3600, lambda task: False, 2 * one_entry)
    assert [len(b) for b in by_bytes] == [2, 2, 2]
    over = publication.close_blocks(files, NOW, 3, 3600, lambda task: True)
    assert [len(b) for b in over] == [3, 3, 1]  # the task is over: the rest goes too
    aged = publication.close_blocks(files, NOW + 7200, 3, 3600, lambda task: False)
    assert [len(b) for b in aged] == [3, 3, 1]


def test_a_block_names_its_files_and_its_dataset():
    files = [done(submitted(publish_info={"dataset": "/P/alice-x-v1/USER"})) for _ in range(2)]
    block = publication.make_block(files)
    assert block.dataset == "/P/alice-x-v1/USER" and block.user == "alice"
    assert [f.lfn for f in block.files] == [d["destination_lfn"] for d in files]
    assert publication.make_block(files).name == block.name  # the same files, the same block


@pytest.mark.parametrize(
    ("code", "message", "error_class"),
    [
        # gfal2's HTTP plugin, a destination that accepts connections and never answers
        (13, "DESTINATION OVERWRITE   Result (Neon): SSL handshake failed: Connection timed out "
         "during SSL handshake after 1 attempts", errors.TIMEOUT),
        (13, "Result (Neon): Could not connect to server: Connection refused", errors.CONNECTION),
        (13, "HTTP 403 : Permission refused", errors.PERMISSION),
        (13, "SSL handshake failed: tlsv1 alert unknown ca", errors.PERMISSION),
        (110, "[FATAL] Socket timeout:  (destination)", errors.TIMEOUT),
        (2, "No such file or directory", errors.SOURCE_MISSING),
    ],
)  # fmt: skip
def test_a_server_that_does_not_answer_is_no_permission_error(code, message, error_class):
    """A timeout gfal2 reports under EACCES failed the file for good (permission is permanent):
    the text's timeout or refused connection wins over that code."""
    assert errors.classify(code, message) == error_class


def test_admission_sends_what_fits_and_holds_the_rest_with_the_figures():
    """What a destination reports free for a user, less the bytes on their way there and those
    sent since it was asked, admits files in order; once one does not fit, none after it of
    that destination and user goes; a destination that reports nothing admits everything."""

    def files(user: str, destination: str, *sizes: int) -> list[dict[str, Any]]:
        return [sample_request(user, destination=destination, size=s) for s in sizes]

    rooms = admission.Rooms(refresh=300.0)
    rooms.learn(("T2_A", "alice"), 1000, on_its_way=200, now=10.0)
    rooms.learn(("T2_A", "bob"), None, on_its_way=0, now=10.0)  # not reported
    alice = files("alice", "T2_A", 300, 400, 200, 50)
    bob = files("bob", "T2_A", 10**9)
    elsewhere = files("alice", "T2_B", 10**9)  # never asked
    fits, refused = admission.admit([*alice, *bob, *elsewhere], rooms.known)
    assert fits == [*alice[:2], *bob, *elsewhere]  # 300 + 400 of 800; 200 no more; 50 waits too
    [held] = refused
    assert (held.site, held.user, held.files, held.free, held.left) == (
        "T2_A", "alice", alice[2:], 1000, 100)  # fmt: skip
    assert held.needs == 200
    assert held.reason() == (
        "admission: 2 files need 250 bytes, the largest 200; the destination reports 1000"
        " bytes free, 100 after the copies on their way"
    )
    # Sent: counted against the room until it is asked again.
    rooms.commit(fits[:1])
    assert rooms.known["T2_A", "alice"].left == 500
    assert rooms.stale([("T2_A", "alice"), ("T2_B", "alice")], now=20.0) == [("T2_B", "alice")]
    assert rooms.stale([("T2_A", "alice")], now=310.0) == [("T2_A", "alice")]
    rooms.forget([("T2_A", "alice")])
    assert rooms.stale([("T2_A", "alice")], now=20.0) == [("T2_A", "alice")]
    assert admission.on_its_way([*alice[:2], *bob]) == {
        ("T2_A", "alice"): 700,
        ("T2_A", "bob"): 10**9,
    }


def test_users_take_turns_the_one_with_fewest_copies_running_first():
    """Round 37: the worker took queued jobs oldest first, so one user's jobs ahead in the
    queue were tried (and passed over) before anyone else's. Each user's jobs keep their order;
    a user with copies running waits for the others' turns."""
    queued = [("a1", "alice"), ("a2", "alice"), ("a3", "alice"), ("b1", "bob"), ("c1", "carol"),
              ("b2", "bob")]  # fmt: skip
    assert turns.fair_order(queued, {}) == ["a1", "b1", "c1", "a2", "b2", "a3"]
    assert turns.fair_order(queued, {"alice": 6, "bob": 1}) == ["c1", "b1", "b2", "a1", "a2", "a3"]
    assert turns.fair_order([], {"alice": 1}) == []


def test_one_user_s_files_take_at_most_their_share_of_a_link_and_a_site():
    """Round 38: the submitter's caps counted every user's files together, so alice's 100
    files in transfer on a link (which the worker could not start: her share of the site was
    used by her long copies) took the link's whole cap, and bob's waited until hers left. A
    user's files take at most `transfer.user_share` of a link's and of a site's cap; the rest
    stays for the others'."""

    def doc(user: str, n: int, link: tuple[str, str] = ("T2_A_a", "T2_B_b")) -> dict[str, Any]:
        return {"_id": f"{user}{n}", "user": user, "source": link[0], "destination": link[1],
                "created": float(n)}  # fmt: skip

    caps = submission.Caps(per_link=100, per_site={}, default_site=200, user_share=0.75)
    hers = [dict(doc("alice", i), state="submitted") for i in range(75)]
    more = [doc("alice", i) for i in range(75, 200)]
    his = [doc("bob", i) for i in range(5)]
    chosen = [d for job in submission.plan_jobs(more + his, hers, caps, 100) for d in job]
    assert chosen and {d["user"] for d in chosen} == {"bob"}  # hers: her share is used up
    # A site's share too: her files on two links to one site.
    caps = submission.Caps(per_link=100, per_site={"T2_B_b": 40}, default_site=200,
                           user_share=0.5)  # fmt: skip
    two_links = [doc("alice", i, (f"T2_S_{i % 2}", "T2_B_b")) for i in range(60)]
    chosen = [d for job in submission.plan_jobs(two_links + his, [], caps, 100) for d in job]
    assert Counter(d["user"] for d in chosen) == {"alice": 20, "bob": 5}
    # Alone on a link, a user still has at least one file in transfer.
    caps = submission.Caps(per_link=1, per_site={}, default_site=1, user_share=0.01)
    assert len(submission.plan_jobs(his, [], caps, 100)) == 1
