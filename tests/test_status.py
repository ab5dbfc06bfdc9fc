"""Status queries (aso.status, `aso status`) against the real store: a task of 1000 jobs whose
files are in every state, counted directly from the documents; the polling form; the estimated
completion from the links' recent throughput; a file's timeline; a task that does not exist."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections import Counter
from typing import Any

import pytest

from aso import model, status
from aso.model import AGENT, CLEANUP, PUBLICATION, STATE, Change
from tests.conftest import db_as, sample_request, write_config
from tests.test_cli import aso

# Each file's path through the states (by the agent), cut at a random point.
PATH = [
    [(STATE, "acquired")],
    [(STATE, "submitted")],
    [(STATE, "done")],
    [(CLEANUP, "cleaned")],
    [(PUBLICATION, "publishing")],
    [(PUBLICATION, "published")],
]


def step(doc: dict[str, Any], k: int, at: float) -> dict[str, Any]:
    """The document after step `k` of PATH (the store judges one step per write)."""
    reasons = {"done": "copied", "cleaned": "temporary copy removed"}
    changes = [Change(axis, to, "agent-x", reasons.get(to)) for axis, to in PATH[k]]
    return model.transition(doc, changes, AGENT, at=at + k)


def advance(db, doc: dict[str, Any], steps: int, at: float) -> dict[str, Any]:
    """Write the first `steps` steps of PATH, one write each."""
    for k in range(steps):
        doc = step(doc, k, at)
        doc["_rev"] = db.put(doc)
    return doc


@pytest.fixture()
def config(store_config, files_db, accounts, tmp_path):
    config = dataclasses.replace(
        store_config,
        source=tmp_path / "aso.toml",
        store=dataclasses.replace(
            store_config.store, files_db=files_db, user="bob", password=accounts["bob"]._password
        ),
    )
    write_config(config)
    return config


def test_a_task_of_a_thousand_jobs_agrees_with_its_documents(config, files_db, accounts, admin):
    rng = random.Random(7)
    task = "261121_200000:alice_big"
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    publish = {"publish": True, "publish_info": {"dataset": "/Prim/alice-big-v1/USER"}}
    docs = [sample_request("alice", task=task, job_id=str(j), **publish) for j in range(1, 1001)]
    for start in range(0, len(docs), 500):
        owner.bulk_write(docs[start : start + 500])
    now = time.time()
    current = admin.db(files_db).get_many(d["_id"] for d in docs)
    steps = {d["_id"]: rng.randrange(len(PATH) + 1) for d in docs}
    for k in range(len(PATH)):  # the store judges one step per write
        moved = [step(current[i], k, now - 100) for i, n in steps.items() if n > k]
        for start in range(0, len(moved), 500):
            results = agent.bulk_write(moved[start : start + 500])
            assert all(r.ok for r in results), [r for r in results if not r.ok][:2]
            for doc, result in zip(moved[start : start + 500], results, strict=True):
                current[doc["_id"]] = dict(doc, _rev=result.rev)
    truth = [d for d in admin.db(files_db).get_many(d["_id"] for d in docs).values() if d]
    assert len(truth) == 1000

    answer = status.task_status(db_as(accounts, "bob", files_db), task)  # any member may ask
    for axis in model.AXES:
        assert answer.counts[axis] == dict(Counter(d[axis] for d in truth))
    assert {f.id: (f.job_id, f.state, f.cleanup, f.publication) for f in answer.files} == {
        d["_id"]: (d["job_id"], d["state"], d["cleanup"], d["publication"]) for d in truth
    }
    on_their_way = sum(d["state"] in status.ON_ITS_WAY for d in truth)
    assert answer.on_its_way == on_their_way > 0

    cli = aso("status", task, "--json", config=config.source)
    assert cli.returncode == 0, cli.stderr
    printed = json.loads(cli.stdout)
    assert printed["counts"] == answer.counts and len(printed["files"]) == 1000
    one_job = aso("status", task, "--job", "17", "--json", config=config.source)
    [only] = json.loads(one_job.stdout)["files"]
    assert only["id"] == next(d["_id"] for d in truth if d["job_id"] == "17")
    table = aso("status", task, "--summary", config=config.source)
    assert table.returncode == 0 and f"{on_their_way} files on their way" in table.stdout


def test_a_task_that_does_not_exist_is_an_empty_answer(config):
    text = aso("status", "261121_0:nobody_here", config=config.source)
    assert text.returncode == 0 and "no requests for task 261121_0:nobody_here" in text.stdout
    data = json.loads(aso("status", "261121_0:nobody_here", "--json", config=config.source).stdout)
    assert data["files"] == [] and data["counts"] == {} and "no requests" in data["message"]
    missing = aso("status", "--file", "f" * 64, config=config.source)
    assert missing.returncode == 1 and "no request" in missing.stdout


def test_polling_with_since_returns_what_changed(config, files_db, accounts):
    task = "261121_200001:alice_poll"
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    docs = [sample_request("alice", task=task, job_id=str(j)) for j in range(6)]
    for doc in docs:
        doc["_rev"] = owner.create(doc)
    mark = max(d["last_update"] for d in docs)
    time.sleep(0.01)
    for doc in docs[:2]:
        agent.put(model.transition(doc, [Change(STATE, "acquired", "agent-x")], AGENT))
    changed = status.changed_since(db_as(accounts, "bob", files_db), task, mark)
    assert sorted(c["id"] for c in changed) == sorted(d["_id"] for d in docs[:2])
    assert {c["state"] for c in changed} == {"acquired"}
    cli = json.loads(
        aso("status", task, "--since", str(mark), "--json", config=config.source).stdout
    )
    assert sorted(f["id"] for f in cli["files"]) == sorted(d["_id"] for d in docs[:2])


def test_the_estimate_follows_the_links_recent_throughput(files_db, accounts, admin):
    task = "261121_200002:alice_eta"
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    now = time.time()
    # Links no other test of the module uses (they share the database).
    fast = dict(source="T2_FR_GRIF", destination="T2_ES_PIC")
    slow = dict(source="T2_UK_London", destination="T2_ES_PIC")
    # In the last hour: 36 copies done on the fast link, 9 on the slow one (one older copy on
    # the slow link falls out of the window).
    history = [(fast, 36, now - 1800), (slow, 9, now - 600), (slow, 1, now - 7200)]
    for link, n, at in history:
        for _ in range(n):
            doc = sample_request("alice", task="261121_1:alice_other", **link)
            doc["_rev"] = owner.create(doc)
            advance(agent, doc, 3, at)
    for link, n in ((fast, 10), (slow, 3)):  # the task's files still to go
        for _ in range(n):
            owner.create(sample_request("alice", task=task, **link))
    answer = status.task_status(db_as(accounts, "bob", files_db), task, now=now)
    assert answer.rates == {"T2_FR_GRIF>T2_ES_PIC": 36 / 3600, "T2_UK_London>T2_ES_PIC": 9 / 3600}
    # fast: 10 files at 36/h = 1000 s; slow: 3 files at 9/h = 1200 s: the slow link decides.
    assert answer.eta == pytest.approx(1200)
    # A link that copied nothing lately: no estimate rather than a made-up one.
    owner.create(sample_request("alice", task=task, source="T2_FR_GRIF", destination="T2_UK_ICL"))
    assert status.task_status(db_as(accounts, "bob", files_db), task, now=now).eta is None


def test_a_file_timeline_tells_its_whole_story(config, files_db, accounts):
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    doc = sample_request("alice", task="261121_200003:alice_story")
    doc["_rev"] = owner.create(doc)
    t = time.time()
    doc = model.transition(doc, [Change(STATE, "acquired", "sub-1")], AGENT, at=t + 1)
    doc["_rev"] = agent.put(doc)
    doc = model.transition(doc, [Change(STATE, "submitted", "sub-1")], AGENT, at=t + 2)
    doc["_rev"] = agent.put(doc)
    doc["attempts"] = [{"job_id": "fts-job-1", "service": "fts3", "submitted": t + 2,
                        "ended": t + 3, "outcome": "failed", "reason": "no space left",
                        "error_class": "destination_full"}]  # fmt: skip
    failed = Change(STATE, "failed_attempt", "mon-1", "no space")
    doc = model.transition(doc, [failed], AGENT, at=t + 3)
    doc["_rev"] = agent.put(doc)
    events = status.timeline(agent.get(doc["_id"]))
    whats = [e.what for e in events]
    assert whats[0].startswith("recorded as new by alice")
    assert "attempt 1 submitted to fts3 as job fts-job-1" in whats
    ended = next(e for e in events if e.what == "attempt 1 failed")
    assert ended.detail == "[destination_full] no space left"
    assert [e.at for e in events] == sorted(e.at for e in events)
    # With the FTS web monitor's link template, each attempt's job links there.
    linked = status.timeline(agent.get(doc["_id"]), "https://fts.example/ftsmon/#/job/{job_id}")
    submitted = next(e for e in linked if e.what.startswith("attempt 1 submitted"))
    assert submitted.detail == "https://fts.example/ftsmon/#/job/fts-job-1"
    cli = json.loads(aso("status", "--file", doc["_id"], "--json", config=config.source).stdout)
    assert [e["what"] for e in cli["events"]] == whats
