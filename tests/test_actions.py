"""Users' kill and resubmit, by task and job, through the owner's rules the store enforces."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

from aso import model
from aso.actions import kill, resubmit
from aso.model import AGENT, PUBLICATION, STATE, Change
from tests.conftest import db_as, sample_request, write_config
from tests.test_cli import aso


def put_in_states(accounts, files_db, task: str, wanted: list[str]) -> list[str]:
    """Requests of alice's task, one per state in `wanted`, moved there by the agent."""
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    path = {
        "new": [],
        "submitted": ["submitted"],
        "failed_attempt": ["submitted", "failed_attempt"],
        "retry": ["submitted", "failed_attempt", "retry"],
        "failed": ["submitted", "failed_attempt", "failed"],
        "done": ["submitted", "done"],
    }
    ids = []
    for i, state in enumerate(wanted):
        doc = sample_request("alice", task=task, job_id=str(i))
        doc["_rev"] = owner.create(doc)
        for to in path[state]:
            doc = model.transition(doc, [Change(STATE, to, "agent-1")], AGENT)
            doc["_rev"] = agent.put(doc)
        ids.append(doc["_id"])
    return ids


def test_kill_then_resubmit_a_task(files_db, accounts):
    task = "261121_180000:alice_kill"
    wanted = ["new", "submitted", "submitted", "failed_attempt", "retry", "failed", "done"]
    ids = put_in_states(accounts, files_db, task, wanted)
    owner = db_as(accounts, "alice", files_db)
    report = kill(owner, task, None, "alice")
    assert report.ok
    assert [report.changed.get(i) for i in ids] == [
        "killed",
        "kill_requested",
        "kill_requested",
        "killed",
        "killed",
        None,
        None,
    ]
    assert sorted(report.unchanged.values()) == ["done", "failed"]
    stored = owner.get_many(ids)
    assert stored[ids[0]]["history"][-1] == {
        "axis": "state",
        "from": "new",
        "to": "killed",
        "at": stored[ids[0]]["last_update"],
        "by": "alice",
        "reason": "killed by the user",
    }
    again = resubmit(owner, task, None, "alice")
    assert sorted(again.changed) == sorted([ids[0], ids[3], ids[4], ids[5]])
    assert Counter(d[STATE] for d in owner.get_many(ids).values()) == {
        "new": 4,
        "kill_requested": 2,
        "done": 1,
    }


def test_kill_one_job_only(files_db, accounts):
    task = "261121_180001:alice_job"
    ids = put_in_states(accounts, files_db, task, ["new", "new", "new"])
    report = kill(db_as(accounts, "alice", files_db), task, "1", "alice")
    assert list(report.changed) == [ids[1]]
    assert db_as(accounts, "alice", files_db).get(ids[0])[STATE] == "new"


def test_a_kill_racing_the_submitter_still_lands(files_db, accounts):
    """The owner read `new`; the submitter submitted it meanwhile: the write conflicts, the
    request is read again and becomes kill_requested."""
    task = "261121_180002:alice_race"
    [doc_id] = put_in_states(accounts, files_db, task, ["new"])
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    seen = owner.get(doc_id)
    moved = model.transition(
        seen,
        [Change(STATE, "submitted", "s1")],
        AGENT,
        lease={"owner": "s1", "until": 1e10, "job_key": "k"},
    )
    agent.put(moved)
    from aso.actions import KILL, _transition_all

    report = _transition_all(owner, [seen], KILL, "alice", "killed by the user")
    assert report.changed == {doc_id: "kill_requested"}


def test_another_user_cannot_kill_or_resubmit(files_db, accounts):
    task = "261121_180003:alice_mine"
    ids = put_in_states(accounts, files_db, task, ["new", "failed"])
    bob = db_as(accounts, "bob", files_db)
    report = kill(bob, task, None, "bob")
    assert not report.ok and set(report.refused) == {ids[0]}
    assert report.refused[ids[0]].startswith('forbidden: [owner] user "bob" may not write')
    assert resubmit(bob, task, None, "bob").refused.keys() == {ids[1]}
    assert db_as(accounts, "alice", files_db).get(ids[0])[STATE] == "new"


def alice_config(store_config, files_db, accounts, tmp_path) -> Path:
    """The config file of alice's `aso` commands on `files_db`."""
    config = dataclasses.replace(
        store_config,
        source=tmp_path / "aso.toml",
        store=dataclasses.replace(
            store_config.store,
            files_db=files_db,
            user="alice",
            password=accounts["alice"]._password,
        ),
    )
    return write_config(config)


def test_kill_and_resubmit_commands(files_db, accounts, store_config, tmp_path):
    task = "261121_180004:alice_cli"
    ids = put_in_states(accounts, files_db, task, ["new", "failed"])
    path = alice_config(store_config, files_db, accounts, tmp_path)
    killed = aso("kill", "--task", task, "--json", config=path)
    assert killed.returncode == 0, killed.stderr
    assert json.loads(killed.stdout)["changed"] == {ids[0]: "killed"}
    text = aso("resubmit", "--task", task, config=path)
    assert text.returncode == 0
    assert "resubmit: 2 new; 0 left as they were" in text.stdout
    nothing = aso("kill", "--task", "261121_0:nobody_task", config=path)
    assert nothing.returncode == 0 and "no requests for task 261121_0:nobody_task" in nothing.stdout


def test_publish_retry_command(files_db, accounts, store_config, tmp_path):
    """`aso publish --retry TASK` had always crashed (the action was never registered): the
    command itself gives a failed publication back to the publisher."""
    task = "261121_180005:alice_pubretry"
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    doc = sample_request(
        "alice", task=task, publish=True, publish_info={"dataset": "/P/alice-q-v1/USER"}
    )
    doc["_rev"] = owner.create(doc)
    moves = [(STATE, "submitted"), (STATE, "done"),
             (PUBLICATION, "publication_error"),
             (PUBLICATION, "publication_failed")]  # fmt: skip
    for axis, to in moves:
        doc = model.transition(doc, [Change(axis, to, "t")], AGENT, publication_block="/P#b")
        doc["_rev"] = agent.put(doc)
    path = alice_config(store_config, files_db, accounts, tmp_path)
    retried = aso("publish", "--retry", task, "--json", config=path)
    assert retried.returncode == 0, retried.stderr
    assert json.loads(retried.stdout)["changed"] == {doc["_id"]: "pending"}
    assert owner.get(doc["_id"])[PUBLICATION] == "pending"
    again = aso("publish", "--retry", task, config=path)
    assert again.returncode == 0, again.stderr
    assert "none changed; 1 left as they were (nothing to publish --retry)" in again.stdout


def test_a_kill_through_the_front_end_reaches_every_file_of_a_large_task(front_door):
    """Round 39: the front end gives at most 1,000 documents a read, and `aso kill --task`
    read the task once: a kill of 1,050 files changed 1,000 and a second one said "nothing to
    kill" with 23 still in transfer. The requests are read in pages."""
    from aso.store import Server, Settings

    server = Server(front_door.url, settings=Settings(retries=1), verify=front_door.ca_file,
                    cert=front_door.proxy)  # fmt: skip
    db = server.db(front_door.db)
    task = f"261207_190000:{front_door.user}_large"
    docs = [sample_request(front_door.user, task=task, job_id=str(n)) for n in range(1050)]
    for start in range(0, len(docs), 500):
        assert all(r.ok for r in db.bulk_write(docs[start : start + 500]))
    report = kill(db, task, None, front_door.user)
    assert report.ok and len(report.changed) == 1050, (len(report.changed), report.refused)
    assert set(report.changed.values()) == {"killed"}
