"""How agents find work: the queue view, its Python twin, and the `_changes`-driven work set."""

from __future__ import annotations

import itertools

from aso import model
from aso.model import AGENT, CLEANUP, PUBLICATION, STATE, Change
from aso.workqueue import (
    ACTIVE,
    CLEAN,
    ON_ITS_WAY_KINDS,
    PUBLISH,
    SUBMIT,
    ChangesWorkSet,
    QueueView,
    work_kinds,
)
from tests.conftest import db_as, sample_request


def _every_state_combination():
    docs = []
    for state in model.STATES[STATE]:
        for cleanup, publication in itertools.product(
            model.STATES[CLEANUP], model.STATES[PUBLICATION]
        ):
            moves = state == "done" or (state in model.NEVER_COPIED and publication == "pending")
            if not moves and (cleanup, publication) != ("pending", "pending"):
                continue  # the other axes move once the copy is done (cleanup: or given up)
            doc = sample_request(
                "alice", publish=True, publish_info={"dataset": "/prim/alice-proc-v1/USER"}
            )
            doc.update({STATE: state, CLEANUP: cleanup, PUBLICATION: publication})
            if state in ("submitted", "kill_requested"):
                doc["transfer"] = {"job_id": "job-1", "service": "gfal"}
            if state == "retry":
                doc["retry_after"] = 99.0
            docs.append(doc)
    return docs


def test_the_python_twin_agrees_with_the_queue_view(files_db, accounts):
    admin = db_as(accounts, "admin", files_db)
    docs = _every_state_combination()
    assert all(r.ok for r in admin.bulk_write(docs))
    wanted = {d["_id"] for d in docs}
    from_view = sorted(
        (row["id"], tuple(row["key"]))
        for row in admin.view("queue", "work", reduce=False).rows
        if row["id"] in wanted
    )
    from_python = sorted((d["_id"], tuple(key)) for d in docs for key in work_kinds(d))
    assert from_view == from_python
    assert {key[0] for _, key in from_python} == {
        "submit",
        "active",
        "decide",
        "clean",
        "publish",
        "discard",
    }
    finished = [d for d in docs if model.is_final(d)]
    assert finished and all(work_kinds(d) == [] for d in finished)


def test_the_kinds_on_their_way_cover_the_states_on_their_way_and_nothing_else():
    """A request is on its way exactly when the queue view holds it under one of
    ON_ITS_WAY_KINDS: what the publisher learns of a task before it started rests on it."""
    for doc in _every_state_combination():
        kinds = {key[0] for key in work_kinds(doc)}
        assert bool(kinds & set(ON_ITS_WAY_KINDS)) == (doc[STATE] in model.ON_ITS_WAY), doc[STATE]


def test_queue_view_reads_a_kind_and_counts_the_backlog(files_db, accounts):
    owner = db_as(accounts, "bob", files_db)
    docs = [sample_request("bob") for _ in range(3)]
    owner.bulk_write(docs)
    queue = QueueView(db_as(accounts, "agent", files_db))
    mine = [d for d in queue.docs(SUBMIT, "bob")]
    assert {d["_id"] for d in mine} == {d["_id"] for d in docs}
    assert queue.backlog(freshness="fresh")[SUBMIT] >= 3


def test_changes_work_set_follows_documents_in_and_out(files_db, accounts):
    owner = db_as(accounts, "alice", files_db)
    agent = db_as(accounts, "agent", files_db)
    first = sample_request("alice", task="261121_140000:alice_ws")
    owner.create(first)
    mine = lambda d: d.get("task") == "261121_140000:alice_ws"  # noqa: E731
    submitter = ChangesWorkSet(agent, (SUBMIT,), accept=mine)
    monitor = ChangesWorkSet(agent, (ACTIVE,), accept=mine)
    assert submitter.start() == 1 and monitor.start() == 0
    assert set(submitter.docs) == {first["_id"]}

    later = [sample_request("alice", task="261121_140000:alice_ws") for _ in range(4)]
    other_task = sample_request("alice")
    owner.bulk_write([*later, other_task])
    assert submitter.refresh() >= 5
    assert set(submitter.docs) == {first["_id"], *(d["_id"] for d in later)}

    # The submitter moves two files on: they leave its set and enter the monitor's.
    moved = []
    for doc in [agent.get(first["_id"]), agent.get(later[0]["_id"])]:
        doc = model.transition(
            doc,
            [Change(STATE, "submitted", "s1")],
            AGENT,
            lease={"owner": "s1", "until": 1e10, "job_key": "k"},
            transfer={"job_id": "j1", "service": "sim"},
        )
        doc["_rev"] = agent.put(doc)
        moved.append(doc)
    submitter.refresh()
    monitor.refresh()
    assert set(submitter.docs) == {d["_id"] for d in later[1:]}
    assert set(monitor.docs) == {d["_id"] for d in moved}
    assert monitor.docs[first["_id"]]["_rev"] == moved[0]["_rev"]  # current revision kept
    assert [d["_id"] for d in monitor.of_kind(ACTIVE)] and monitor.of_kind(CLEAN) == []

    # Killed by the owner: gone from the submitter's set.
    doc = agent.get(later[1]["_id"])
    owner.put(model.transition(doc, [Change(STATE, "killed", "alice")], model.OWNER))
    submitter.refresh()
    assert later[1]["_id"] not in submitter.docs

    # A restart rebuilds the same set from the view or from the whole feed.
    for source in ("view", "feed"):
        again = ChangesWorkSet(agent, (SUBMIT,), accept=mine)
        again.start(source)
        assert set(again.docs) == set(submitter.docs), source


def test_work_set_drops_deleted_documents(files_db, accounts):
    admin = db_as(accounts, "admin", files_db)
    doc = sample_request("alice", task="261121_150000:alice_del")
    rev = admin.create(doc)
    workset = ChangesWorkSet(
        admin, (SUBMIT, PUBLISH), accept=lambda d: d.get("task") == "261121_150000:alice_del"
    )
    workset.start()
    assert doc["_id"] in workset.docs
    admin.delete(doc["_id"], rev)
    workset.refresh()
    assert doc["_id"] not in workset.docs


def test_long_poll_refresh_wakes_on_a_change(files_db, accounts):
    import threading

    admin = db_as(accounts, "admin", files_db)
    workset = ChangesWorkSet(
        admin, (SUBMIT,), accept=lambda d: d.get("task") == "261121_160000:alice_lp"
    )
    workset.start()
    doc = sample_request("alice", task="261121_160000:alice_lp")
    timer = threading.Timer(0.3, lambda: admin.create(doc))
    timer.start()
    for _ in range(5):  # each poll ends at a change or after its wait
        workset.refresh(wait=2.0)
        if doc["_id"] in workset.docs:
            break
    timer.join()
    assert doc["_id"] in workset.docs
