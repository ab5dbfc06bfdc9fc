"""Status queries (aso.monitoring.queries, `aso status`) against the real store: a task of 1000 jobs
whose files are in every state, counted directly from the documents; the polling form; the estimated
completion from the links' recent throughput; a file's timeline; a task that does not exist."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from collections import Counter
from typing import Any

import pytest
import requests

from aso import model
from aso.agents.cleaner import Cleaner
from aso.agents.monitor import Monitor
from aso.agents.publisher import Publisher
from aso.agents.retry_manager import RetryManager
from aso.agents.submitter import Submitter
from aso.model import AGENT, CLEANUP, PUBLICATION, STATE, Change
from aso.monitoring import queries
from aso.runtime import Runner
from tests.conftest import db_as, sample_request, write_config
from tests.pipeline_helpers import run_until, upload
from tests.test_cli import aso

# Each file's path through the states (by the agent), cut at a random point.
PATH = [
    [(STATE, "submitted")],
    [(STATE, "done")],
    [(CLEANUP, "cleaned")],
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

    answer = queries.task_status(db_as(accounts, "bob", files_db), task)  # any member may ask
    for axis in model.AXES:
        assert answer.counts[axis] == dict(Counter(d[axis] for d in truth))
    assert {f.id: (f.job_id, f.state, f.cleanup, f.publication) for f in answer.files} == {
        d["_id"]: (d["job_id"], d["state"], d["cleanup"], d["publication"]) for d in truth
    }
    on_their_way = sum(d["state"] in model.ON_ITS_WAY for d in truth)
    assert answer.on_its_way == on_their_way > 0
    # Jobs in numeric order (1, 2, ... 10, not 1, 10, 100), each row whole and without a stale
    # failure; pages of any size give every file once, in the same order.
    assert [int(f.job_id) for f in answer.files] == list(range(1, 1001))
    row = next(f for f in answer.files if f.id == truth[0]["_id"])
    assert (row.source_lfn, row.destination_lfn, row.size, row.rev) == (
        truth[0]["source_lfn"], truth[0]["destination_lfn"], truth[0]["size"], truth[0]["_rev"]
    )  # fmt: skip
    for size in (7, 250, 1000):
        pages = list(queries.task_pages(db_as(accounts, "bob", files_db), task, page=size))
        assert [f.id for page in pages for f in page] == [f.id for f in answer.files]
        assert all(len(page) <= size for page in pages)

    cli = aso("status", task, "--json", config=config.source)
    assert cli.returncode == 0, cli.stderr
    printed = json.loads(cli.stdout)
    assert printed["counts"] == answer.counts and len(printed["files"]) == 1000
    one_job = aso("status", task, "--job", "17", "--json", config=config.source)
    [only] = json.loads(one_job.stdout)["files"]
    assert only["id"] == next(d["_id"] for d in truth if d["job_id"] == "17")
    table = aso("status", task, "--summary", config=config.source)
    assert table.returncode == 0 and f"{on_their_way} files on their way" in table.stdout


# Jobs of a task as CRAB names them and retries them: numbers (one written "007"), and text.
PAGING_JOBS = ["1", "2", "007", "7", "10", "11", "100", "10a", "a", "b-7", "retry.3"]


def by_task_order(doc: dict[str, Any]) -> tuple[Any, ...]:
    """Where a file's row is in by_task: numeric jobs first in numeric order, then the others
    as text; within a job, its type, then its id."""
    job = model.job_order(doc["job_id"])
    return ((0, job) if isinstance(job, int) else (1, job), doc["file_type"], doc["_id"])


def raw_pages(server, db: str, task: str, page: int) -> list[list[dict[str, Any]]]:
    """A task's rows read as docs/status-api.md tells a client to page (plain HTTP): start at
    the last row's key and skip it. At most 100 pages: a loop would show as too many."""
    url = f"{server.url}/{db}/_design/asyncstageout/_view/by_task"
    params: dict[str, Any] = {"start_key": json.dumps([task]), "end_key": json.dumps([task, {}])}
    pages = []
    for _ in range(100):
        answer = requests.get(url, params={**params, "limit": page},
                              auth=(server.user, server._password), timeout=30)  # fmt: skip
        answer.raise_for_status()
        rows = answer.json()["rows"]
        pages.append(rows)
        if len(rows) < page:
            break
        params.update(start_key=json.dumps(rows[-1]["key"]), skip=1)
    return pages


def test_paging_a_task_of_several_files_per_job_gives_each_file_once(config, files_db, accounts):
    """Issue 20: by_task's keys repeated within a job (an output and a log file), so paging by
    key looped forever at page size 2 and gave 24 rows for 15 files at page size 4. Jobs of
    three files (two outputs and a log), numeric and text job ids mixed: at pages of 2 and 4,
    through the library and as a client pages over HTTP, every file comes once, in job order."""
    task = "261121_200007:alice_paging"
    owner = db_as(accounts, "alice", files_db)
    docs = [sample_request("alice", task=task, job_id=job, file_type=kind)
            for job in PAGING_JOBS for kind in ("output", "output", "log")]  # fmt: skip
    assert all(r.ok for r in owner.bulk_write(docs))
    expected = [d["_id"] for d in sorted(docs, key=by_task_order)]
    reader = db_as(accounts, "bob", files_db)
    for size in (2, 4):
        pages = list(queries.task_pages(reader, task, page=size))
        assert [f.id for page in pages for f in page] == expected
        assert all(len(page) <= size for page in pages) and len(pages) == -(-len(docs) // size)
        raw = raw_pages(accounts["bob"], files_db, task, size)
        assert [row["id"] for page in raw for row in page] == expected
        assert len(raw) == len(docs) // size + 1  # the last page short (or empty): the end
    # One job of the three files, by its id as written: "007" and "7" are both job 7.
    assert {f.id for f in queries.task_files(reader, task, "7")} == {
        d["_id"] for d in docs if d["job_id"] in ("007", "7")
    }
    printed = json.loads(aso("status", task, "--json", config=config.source).stdout)
    assert [f["id"] for f in printed["files"]] == expected and printed["total"] == len(docs)
    jobs = [f["job_id"] for f in printed["files"][::3]]
    assert jobs[:2] == ["1", "2"] and jobs[-4:] == ["10a", "a", "b-7", "retry.3"]


def test_a_task_that_does_not_exist_is_an_empty_answer(config):
    text = aso("status", "261121_0:nobody_here", config=config.source)
    assert text.returncode == 0 and "no requests for task 261121_0:nobody_here" in text.stdout
    data = json.loads(aso("status", "261121_0:nobody_here", "--json", config=config.source).stdout)
    assert data["files"] == [] and data["counts"] == {} and "no requests" in data["message"]
    missing = aso("status", "--file", "f" * 64, config=config.source)
    assert missing.returncode == 1 and "no request" in missing.stdout


def test_polling_from_a_sequence_returns_what_changed(config, files_db, accounts):
    task = "261121_200001:alice_poll"
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    reader = db_as(accounts, "bob", files_db)
    docs = [sample_request("alice", task=task, job_id=str(j)) for j in range(6)]
    for doc in docs:
        doc["_rev"] = owner.create(doc)
    everything, seq = queries.changed_since(reader, task, "0")
    assert sorted(f.id for f in everything) == sorted(d["_id"] for d in docs)
    for doc in docs[:2]:
        # An agent whose clock is an hour behind: a cursor of times would never see this.
        agent.put(model.transition(doc, [Change(STATE, "submitted", "agent-x")], AGENT,
                                   at=doc["last_update"] - 3600))  # fmt: skip
    late = sample_request("alice", task=task, job_id="7")  # a file recorded after the cursor
    owner.create(late)
    changed, seq2 = queries.changed_since(reader, task, seq)
    assert sorted(f.id for f in changed) == sorted([d["_id"] for d in docs[:2]] + [late["_id"]])
    assert {f.id: f.state for f in changed}[docs[0]["_id"]] == "submitted"
    assert queries.changed_since(reader, task, seq2)[0] == []  # nothing since
    cli = json.loads(aso("status", task, "--since", seq, "--json", config=config.source).stdout)
    assert sorted(f["id"] for f in cli["files"]) == sorted(f.id for f in changed)
    assert cli["seq"] and all("rev" in f and "source_lfn" in f for f in cli["files"])
    text = aso("status", task, "--since", seq, config=config.source)
    assert text.returncode == 0 and f"--since {cli['seq']}" in text.stdout


def done_at(owner, agent, task: str, link: dict[str, str], at: float) -> None:
    """A file of `task` on `link` whose copy ended at `at`."""
    doc = sample_request("alice", task=task, **link)
    doc["_rev"] = owner.create(doc)
    advance(agent, doc, 2, at - 1)  # submitted, done at `at`


def test_the_estimate_follows_the_links_recent_throughput(files_db, accounts, admin):
    task = "261121_200002:alice_eta"
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    now = time.time()
    # Links no other test of the module uses (they share the database).
    fast = dict(source="T2_FR_GRIF", destination="T2_ES_PIC")
    slow = dict(source="T2_UK_London", destination="T2_ES_PIC")
    # In the window: 30 copies on the fast link since 600 s ago, 9 on the slow one since 300 s
    # ago (an older copy on the slow link falls out of the window).
    for link, n, first in ((fast, 30, now - 600), (slow, 9, now - 300), (slow, 1, now - 7200)):
        for k in range(n):
            done_at(owner, agent, "261121_1:alice_other", link, first + k * 10)
    for link, n in ((fast, 10), (slow, 3)):  # the task's files still to go
        for _ in range(n):
            owner.create(sample_request("alice", task=task, **link))
    answer = queries.task_status(db_as(accounts, "bob", files_db), task, now=now)
    # Each link's pace while it copied (a copy every 10 s), not over the quiet time since.
    assert answer.rates == pytest.approx(
        {"T2_FR_GRIF>T2_ES_PIC": 29 / 290, "T2_UK_London>T2_ES_PIC": 8 / 80}
    )
    # fast: 10 files at 0.1/s = 100 s; slow: 3 files at 0.1/s = 30 s: the fast link decides.
    assert answer.eta == pytest.approx(100)
    # A link that copied nothing lately: no estimate rather than a made-up one, and why.
    owner.create(sample_request("alice", task=task, source="T2_FR_GRIF", destination="T2_UK_ICL"))
    unknown = queries.task_status(db_as(accounts, "bob", files_db), task, now=now)
    assert unknown.eta is None
    assert "T2_FR_GRIF → T2_UK_ICL has copied 0 files" in unknown.eta_note


def test_a_task_that_ends_in_25_seconds_is_never_estimated_beyond_a_minute(
    files_db, accounts, admin
):
    """40 files uploaded at once on a fresh link, done in batches (jobs of 5) over 25 s: at
    every second of the task, once the link's pace is known, the estimate is under a minute
    (an estimate over the last hour said 46 min, then 13 min)."""
    task = "261121_200004:alice_quick"
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    reader = db_as(accounts, "bob", files_db)
    link = dict(source="T2_IT_Pisa", destination="T2_FR_GRIF")
    t0 = time.time() - 100  # the upload; the test then reads the store "at" t0 + s
    docs = [sample_request("alice", task=task, job_id=str(j // 5 + 1), **link) for j in range(40)]
    for doc in docs:
        doc["_rev"] = owner.create(doc)
    ends = {doc["_id"]: t0 + 25 * (j // 5 + 1) / 8 for j, doc in enumerate(docs)}
    for doc in docs:
        advance(agent, doc, 2, ends[doc["_id"]] - 1)
    estimates = {}
    for s in range(0, 26):
        answer = queries.task_status(reader, task, now=t0 + s)
        # What the store would have said then: the files not done by t0 + s are on their way.
        to_go = sum(1 for at in ends.values() if at > t0 + s)
        answer.files = [
            dataclasses.replace(f, state="submitted" if ends[f.id] > t0 + s else "done")
            for f in answer.files
        ]
        eta, note = queries.estimate(
            answer.files, {(link["source"], link["destination"]): queries.link_pace(
                reader, (link["source"], link["destination"]), t0 + s)}, t0 + s
        )  # fmt: skip
        estimates[s] = (to_go, eta, note)
    known = {s: e for s, (to_go, e, _) in estimates.items() if e is not None and to_go}
    assert known and min(known) <= 7, estimates  # known from the second job's end on
    assert max(known.values()) <= 60, estimates
    assert estimates[0][1] is None and "too few" in estimates[0][2]


# Recorded task timelines (the copies' ends, seconds after the task's upload) of three kinds:
# jobs of 5 files ending together every 6 s; a link that copied another task's files 12 min
# before this one's start at a quite different pace; copies ending at random (seeded).
def _timelines() -> dict[str, list[float]]:
    rng = random.Random(37)
    jittered, at = [], 5.0
    for _ in range(80):
        at += rng.expovariate(0.5)
        jittered.append(at)
    return {
        "jobs of five": [6.0 * (j // 5 + 1) for j in range(60)],
        "after another task": [3.0 + 1.0 * k + rng.uniform(0, 0.5) for k in range(60)],
        "at random": jittered,
    }


ETA_LINKS = {"jobs of five": ("T1_US_FNAL", "T2_IT_Bari"),
             "after another task": ("T1_DE_KIT", "T2_IT_Bari"),
             "at random": ("T2_US_MIT", "T2_IT_Bari")}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(ETA_LINKS))
def test_the_estimate_replayed_on_recorded_timelines_is_within_its_stated_error(
    files_db, accounts, kind
):
    """docs/status-api.md, "The estimated completion": a task's timeline replayed through the
    store, the estimate asked after every copy from the tenth on, while 3 files or more are
    to go: its median error is within 30 % of the true remaining time and it is never off by
    more than 3x."""
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    reader = db_as(accounts, "bob", files_db)
    source, destination = ETA_LINKS[kind]
    link = dict(source=source, destination=destination)
    ends = _timelines()[kind]
    t0 = time.time() - 1000 - ends[-1]
    if kind == "after another task":  # 20 quick copies 12 min before, then nothing
        for k in range(20):
            done_at(owner, agent, "261121_1:alice_before", link, t0 - 720 + 0.2 * k)
    task = f"261121_300000:alice_replay_{len(kind)}"
    docs = [sample_request("alice", task=task, job_id=str(j + 1), **link) for j in range(len(ends))]
    for doc, end in zip(docs, ends, strict=True):
        doc["_rev"] = owner.create(doc)
        advance(agent, doc, 2, t0 + end - 1)
    files = queries.task_files(reader, task)
    end_of = {doc["_id"]: t0 + end for doc, end in zip(docs, ends, strict=True)}
    errors, ratios = [], []
    for k in range(9, len(ends)):
        now = t0 + ends[k] + 0.5
        if sum(1 for end in ends if t0 + end > now) < 3:
            break  # when one or two files are left, one copy's chance is no pace
        moving = [dataclasses.replace(f, state="submitted" if end_of[f.id] > now else "done")
                  for f in files]  # fmt: skip
        pace = queries.link_pace(reader, (source, destination), now)
        eta, note = queries.estimate(moving, {(source, destination): pace}, now)
        truth = t0 + ends[-1] - now
        assert eta is not None, (k, note)
        errors.append(abs(eta - truth) / truth)
        ratios.append(max(eta / truth, truth / eta))
    errors.sort()
    median = errors[len(errors) // 2]
    print(f"{kind}: median error {median:.0%}, worst ratio {max(ratios):.2f}")
    assert median <= 0.30 and max(ratios) <= 3.0, (median, max(ratios))


def test_a_file_timeline_tells_its_whole_story(config, files_db, accounts):
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    doc = sample_request("alice", task="261121_200003:alice_story")
    doc["_rev"] = owner.create(doc)
    t = time.time()
    doc = model.transition(doc, [Change(STATE, "submitted", "sub-1")], AGENT, at=t + 2)
    doc["_rev"] = agent.put(doc)
    doc["attempts"] = [{"job_id": "fts-job-1", "service": "fts3", "submitted": t + 2,
                        "ended": t + 3, "outcome": "failed", "reason": "no space left",
                        "error_class": "destination_full"}]  # fmt: skip
    failed = Change(STATE, "failed_attempt", "mon-1", "no space")
    doc = model.transition(doc, [failed], AGENT, at=t + 3)
    doc["_rev"] = agent.put(doc)
    events = queries.timeline(agent.get(doc["_id"]))
    whats = [e.what for e in events]
    assert whats[0].startswith("recorded as new by alice")
    assert "attempt 1 submitted to fts3 as job fts-job-1" in whats
    ended = next(e for e in events if e.what == "attempt 1 failed")
    assert ended.detail == "[destination_full] no space left"
    assert [e.at for e in events] == sorted(e.at for e in events)
    # With the FTS web monitor's link template, each attempt's job links there.
    linked = queries.timeline(agent.get(doc["_id"]), "https://fts.example/ftsmon/#/job/{job_id}")
    submitted = next(e for e in linked if e.what.startswith("attempt 1 submitted"))
    assert submitted.detail == "https://fts.example/ftsmon/#/job/fts-job-1"
    cli = json.loads(aso("status", "--file", doc["_id"], "--json", config=config.source).stdout)
    assert [e["what"] for e in cli["events"]] == whats


def test_a_client_following_a_task_sees_every_final_state_once(pub_config, accounts, admin):
    """Agents copy, clean and publish a task's 40 files while a client follows it from another
    thread, polling as fast as it can: every file's final revision reaches the client exactly
    once and no revision twice, though agents stamp their own clocks and the publisher's
    stamp can be earlier than the cleaner's (a cursor of last_update times lost final states
    for 12 of 15 files in 2 runs of 4)."""
    task = "261121_200005:alice_follow"
    publish = {"publish": True, "publish_info": {"dataset": "/Prim/alice-follow-v1/USER"}}
    ids = upload(accounts, pub_config, 40, users=("alice",), task=task, **publish)
    reader = db_as(accounts, "bob", pub_config.store.files_db)
    poller = queries.Poller(reader, task)
    seen: list[queries.FileStatus] = list(poller.start())
    stop = threading.Event()

    def follow() -> None:
        while not stop.is_set():
            seen.extend(poller.poll())

    client = threading.Thread(target=follow, daemon=True)
    client.start()
    db = admin.db(pub_config.store.files_db)

    def finished() -> bool:
        return all(model.has_ended(d) for d in db.get_many(ids).values())

    runners = [Runner(agent) for agent in (
        Submitter(pub_config, "s1"), Monitor(pub_config, "m1"), RetryManager(pub_config, "r1"),
        Cleaner(pub_config, "c1"), Publisher(pub_config, "p1"),
    )]  # fmt: skip
    run_until(finished, runners, 120)
    stop.set()
    client.join(30)
    seen.extend(poller.poll())  # what changed after the client's last poll
    final = db.get_many(ids)
    assert len(final) == 40 and {d[PUBLICATION] for d in final.values()} == {"published"}
    by_id: dict[str, list[queries.FileStatus]] = {}
    for row in seen:
        by_id.setdefault(row.id, []).append(row)
    assert set(by_id) == set(ids)
    for doc_id, rows in by_id.items():
        revs = [r.rev for r in rows]
        assert len(revs) == len(set(revs)), (doc_id, revs)  # no revision twice
        assert revs.count(final[doc_id]["_rev"]) == 1  # the final state, exactly once
        assert rows[-1].publication == "published" and rows[-1].reason is None
    assert sum(len(rows) for rows in by_id.values()) > 40  # it followed, not read once at the end


def test_a_task_with_failed_files_says_what_to_do(config, files_db, accounts):
    """`aso status T`: a failed file shows its current failure (class and reason), the count
    of failed files says how to queue them again, and a done file shows no old failure."""
    task = "261121_200006:alice_failing"
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    failing, copied = (sample_request("alice", task=task, job_id=str(j)) for j in (1, 2))
    for doc in (failing, copied):
        doc["_rev"] = owner.create(doc)
    for doc, path in ((failing, ("submitted", "failed_attempt", "failed")),
                      (copied, ("submitted", "failed_attempt", "retry", "new", "submitted",
                                "done"))):  # fmt: skip
        for to in path:
            extra = {"error_class": "destination_full", "failure_reason": "no space left"}
            doc.update(model.transition(doc, [Change(STATE, to, "agent-x")], AGENT, **extra))
            doc["_rev"] = agent.put(doc)
    text = aso("status", task, config=config.source)
    assert text.returncode == 0, text.stderr
    assert f"1 files failed or were killed: `aso resubmit --task {task}`" in text.stdout
    rows = {line.split("\t")[0]: line.split("\t") for line in text.stdout.splitlines()}
    assert rows[failing["_id"][:12]][8] == "[destination_full] no space left"
    assert rows[failing["_id"][:12]][4] == "pending (no copy)"  # it waits for a resubmission
    assert rows[copied["_id"][:12]][8] == ""  # done: the old attempt's failure is history
    # The failed file is final; the copied one is not while its temporary copy is kept.
    answer = json.loads(aso("status", task, "--json", config=config.source).stdout)
    final = {f["id"]: f["final"] for f in answer["files"]}
    assert final == {failing["_id"]: True, copied["_id"]: False} and not answer["finished"]
    assert "not final yet: 1" in text.stdout
    copied.update(model.transition(copied, [Change("cleanup", "cleaned", "agent-x")], AGENT))
    agent.put(copied)  # its publication not required: finished
    answer = json.loads(aso("status", task, "--json", config=config.source).stdout)
    assert answer["finished"] and all(f["final"] for f in answer["files"])
    assert (
        "finished: every file of the task is final"
        in aso("status", task, config=config.source).stdout
    )
