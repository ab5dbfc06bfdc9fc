"""Why is my file not there yet: every file on its way has a reason in its status row
(`waiting`: queued, cooling off until T, being decided, at the transfer service in job J since
T, being cancelled), and `aso status` tells a queued file an operator holds back apart; the
rows are what docs/openapi.yaml describes. On both stores, with the real agents over the `sim`
transfer service."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter

from aso import model
from aso.actions import set_control
from aso.agents.monitor import Monitor
from aso.agents.retry_manager import RetryManager
from aso.agents.submitter import Submitter
from aso.model import AGENT, CLEANUP, OWNER, PUBLICATION, STATE, Change
from aso.monitoring import queries
from aso.runtime import Runner
from tests.conftest import sample_request, write_config
from tests.pipeline_helpers import LINKS, owner_db, run_until, states, upload
from tests.test_cli import aso
from tests.test_status_client import rows_schema

TASK = "261130_110000:alice_waiting"


def expected_why(doc: dict) -> tuple[str, str]:
    """The axis and reason a file waits for, as docs/status-api.md says it."""
    if doc[STATE] != "done":
        return STATE, model.WAITING_WHY[STATE][doc[STATE]]
    for axis in (PUBLICATION, CLEANUP):
        if doc[axis] in model.WAITING_WHY[axis]:
            return axis, model.WAITING_WHY[axis][doc[axis]]
    raise AssertionError(f"{doc['_id']} is finished")


def done_files(accounts, config) -> list[str]:
    """Four of alice's files copied: one waits for its block, one for a publication retry, one
    for its cleanup, one for a cleanup retry."""
    owner, agent = owner_db(accounts, config), accounts["agent"].db(config.store.files_db)
    info = {"dataset": "/Prim/alice-waiting-v1/USER", "events": 1, "lumis": {}, "parents": []}
    ids, now = [], time.time()
    for publish, then in [
        (True, None),
        (True, (PUBLICATION, "publication_error", {"publication_retry_after": now + 900})),
        (False, None),
        (False, (CLEANUP, "cleanup_error", {"cleanup_retry_after": now + 900})),
    ]:
        extra = {"publish": True, "publish_info": info} if publish else {}
        doc = sample_request("alice", task=TASK, **extra)
        doc["_rev"] = owner.create(doc)
        for change in (Change(STATE, "submitted", "s1"), Change(STATE, "done", "m1")):
            doc = model.transition(doc, [change], AGENT)
            doc["_rev"] = agent.put(doc)
        if then is not None:
            axis, to, fields = then
            doc = model.transition(doc, [Change(axis, to, "p1", "refused")], AGENT, **fields)
            doc["_rev"] = agent.put(doc)
        ids.append(doc["_id"])
    return ids


def test_every_file_on_its_way_says_why_it_waits(sim_config, accounts, admin, tmp_path):
    sim = dataclasses.replace(
        sim_config.sim,
        mean_duration=600.0,
        distribution="fixed",
        outages=[{"link": f"{LINKS[2][0]}>{LINKS[2][1]}", "start": 0, "end": 1e9}],
    )
    retry = dataclasses.replace(sim_config.retry, base_delay=600.0, jitter=0.0)
    fts3 = dataclasses.replace(sim_config.fts3, monitor_url="https://fts.example/job/{job_id}")
    config = dataclasses.replace(
        sim_config, sim=sim, retry=retry, fts3=fts3, source=tmp_path / "aso.toml"
    )
    db = admin.db(config.store.files_db)
    owner = owner_db(accounts, config)
    # At the service (links 0 and 1), failing at once (link 2): then cool-off and deciding.
    going = upload(accounts, config, 3, users=("alice",), links=LINKS[:3], task=TASK)
    submitter, monitor = Runner(Submitter(config, "s1")), Runner(Monitor(config, "m1"))
    run_until(lambda: states(db, going)["new"] == 0, [submitter])
    run_until(lambda: states(db, going)["failed_attempt"] == 1, [monitor], timeout=30)
    retried = [d for d in db.get_many(going).values() if d[STATE] == "failed_attempt"]
    Runner(RetryManager(config, "r1")).step(wait=False)  # its cool-off: 600 s
    # One more failure, left to the retry manager; a kill; files queued, some held back.
    more = upload(accounts, config, 1, users=("alice",), links=[LINKS[2]], task=TASK)
    run_until(lambda: states(db, more)["new"] == 0, [submitter])
    run_until(lambda: states(db, more) == Counter(failed_attempt=1), [monitor], timeout=30)
    killed = next(d for d in db.get_many(going).values() if d[STATE] == "submitted")
    owner.put(model.transition(killed, [Change(STATE, "kill_requested", "alice")], OWNER))
    queued = upload(accounts, config, 2, users=("alice",), links=LINKS[:2], task=TASK)
    operator = accounts["operator"].db(config.store.files_db)
    set_control(operator, model.SITE, LINKS[0][0], model.DRAIN, "disk swap", "operator", 1.0)
    # Copied: waiting for their block, a publication retry, their cleanup, a cleanup retry.
    copied = done_files(accounts, config)

    docs = db.get_many(going + more + queued + copied)
    assert Counter(d[STATE] for d in docs.values()) == {
        "submitted": 1, "kill_requested": 1, "retry": 1, "failed_attempt": 1, "new": 2, "done": 4,
    }  # fmt: skip
    answer = queries.task_status(db, TASK)
    rows = {f.id: f for f in answer.files}
    assert set(rows) == set(docs)
    for doc_id, doc in docs.items():
        waiting = rows[doc_id].waiting
        assert waiting is not None, f"{doc[STATE]} file without a reason"
        axis, why = expected_why(doc)
        changes = [h["at"] for h in doc["history"] if h["axis"] in (axis, STATE)]
        assert waiting["since"] == changes[-1]  # its last change on that axis, or its copy
        held = doc[STATE] == "new" and doc["source"] == LINKS[0][0]
        assert waiting["why"] == (model.HELD_BACK if held else why)
        retry_after = {"retry": "retry_after", "publication_error": "publication_retry_after",
                       "cleanup_error": "cleanup_retry_after"}.get(doc[axis])  # fmt: skip
        assert waiting["until"] == (doc[retry_after] if retry_after else None)
        assert waiting["until"] is None or waiting["until"] > waiting["since"]
        job = doc["transfer"]["job_id"] if doc[STATE] in model.AT_THE_SERVICE else None
        assert waiting["job_id"] == job
        if held:
            assert waiting["control"] == f"site {LINKS[0][0]} drain by operator: disk swap"
    assert queries.waiting_counts(answer.files) == {
        "at_service": 1, "cancelling": 1, "cool_off": 1, "deciding": 1, "queued": 1,
        "held_back": 1, "block": 1, "publication_retry": 1, "cleanup": 1, "cleanup_retry": 1,
    }  # fmt: skip
    assert retried[0]["_id"] in docs
    # A queued file says what it waits behind on its link: every user's files there.
    [waiting_row] = [rows[i] for i in queued if rows[i].waiting["why"] == "queued"]
    link = (waiting_row.source, waiting_row.destination)
    on_link = [d for d in db.get_many(going + more + queued).values()
               if (d["source"], d["destination"]) == link]  # fmt: skip
    assert waiting_row.waiting["link_waiting"] == sum(d[STATE] in model.TO_SUBMIT for d in on_link)
    assert waiting_row.waiting["link_active"] == sum(
        d[STATE] in model.AT_THE_SERVICE for d in on_link
    )

    # The rows as served match docs/openapi.yaml; a final file has no reason to wait.
    start, end = queries.task_range(TASK)
    served = db.view("asyncstageout", "by_task", start_key=start, end_key=end).rows
    rows_schema().validate(served)
    bobs = "261130_110000:bob_waiting"
    done = upload(accounts, config, 1, users=("bob",), links=[LINKS[1]], task=bobs)
    bob = owner_db(accounts, config, "bob")
    bob.put(model.transition(bob.get(done[0]), [Change(STATE, "killed", "bob")], OWNER))
    [row] = queries.task_status(db, bobs).files
    assert (row.state, row.waiting) == ("killed", None)

    # `aso status` counts the reasons, lists each file's, and tells one file's.
    path = write_config(config)
    text = aso("status", TASK, config=path)
    assert text.returncode == 0, text.stderr
    counted = text.stdout.split("waiting: ", 1)[1].splitlines()[0]
    assert sorted(counted.split("; ")) == sorted(
        f"1 {model.WAITING_WORDS[why]}" for why in queries.waiting_counts(answer.files)
    )
    as_json = json.loads(aso("status", TASK, "--json", config=path).stdout)
    assert {f["id"]: f["waiting"]["why"] for f in as_json["files"]} == {
        i: rows[i].waiting["why"] for i in docs
    }
    story = aso("status", "--file", retried[0]["_id"], config=path)
    assert "now: cooling off after a failed attempt since " in story.stdout
    assert " until " in story.stdout.splitlines()[-1]
    at_service = next(d for d in docs.values() if d[STATE] == "submitted")
    story = aso("status", "--file", at_service["_id"], config=path)
    job = at_service["transfer"]["job_id"]
    assert f"(job {job} https://fts.example/job/{job})" in story.stdout.splitlines()[-1]
    listed = aso("status", TASK, config=path).stdout
    assert "waiting to start on its link" in listed
