"""Monitoring summaries (aso.monitoring.summaries): hour, day and live documents agree with counts
made directly over the requests' documents, across hours closing, restarts, a crash between the hour
documents and the state document, requests changing while they are read, and the purge."""

from __future__ import annotations

import dataclasses
import json
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest

from aso import limits, model
from aso.config import Config
from aso.model import Change
from aso.monitoring import purge, summaries
from aso.provision import storejs
from aso.provision.designdocs import init_databases
from aso.store import Database, Server, StoreError
from aso.store import admin as store_admin
from tests.conftest import sample_request

HOUR = 3600.0
T0 = 1_790_000_000.0 - (1_790_000_000.0 % 86400) + 5 * HOUR  # a UTC day, 05:00


SCHEMA = Path(__file__).resolve().parent.parent / "docs" / "summaries.schema.json"


def summaries_schema() -> jsonschema_rs.Draft202012Validator:
    """docs/summaries.schema.json: the documents the analytics agent writes and the pages read."""
    return jsonschema_rs.Draft202012Validator(json.loads(SCHEMA.read_text()))


def check_summaries(stats_db: Database) -> list[dict[str, Any]]:
    """Every summary document of `stats_db` (ids monitor:*), each checked against the schema."""
    docs = stats_db.all_docs("monitor:", "monitor:\ufff0")
    schema = summaries_schema()
    for doc in docs:
        errors = [e.message for e in schema.iter_errors(doc)][:3]
        assert not errors, (doc["_id"], errors)
    return docs


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def dbs(admin: Server, store_config: Config) -> Iterator[tuple[Database, Database]]:
    """A fresh files database and statistics database."""
    suffix = uuid.uuid4().hex[:8]
    store = dataclasses.replace(
        store_config.store, files_db=f"mon_files_{suffix}", stats_db=f"mon_stats_{suffix}"
    )
    init_databases(admin, dataclasses.replace(store_config, store=store))
    yield admin.db(store.files_db), admin.db(store.stats_db)
    store_admin.delete_db(admin, store.files_db)
    store_admin.delete_db(admin, store.stats_db)


def lifecycle(start: float, rng: random.Random, **overrides: Any) -> dict[str, Any]:
    """A request created at `start` that goes some way through its life, a minute per step."""
    doc = sample_request(at=start, **overrides)
    steps = rng.choice(["new", "submitted", "done", "done", "failed", "retry", "cleaned"])
    t = start

    def step(axis: str, to: str, **fields: Any) -> None:
        nonlocal doc, t
        t += 60
        doc = model.transition(doc, [Change(axis, to, "test")], model.ADMIN, at=t, **fields)

    if steps == "new":
        return doc
    step(model.STATE, "submitted")
    if steps == "submitted":
        return doc
    attempt = {"job_id": uuid.uuid4().hex, "service": "sim", "submitted": t}
    if steps in ("failed", "retry"):
        cls = rng.choice(["timeout", "io"])
        # Reasons that differ only in what varies (the file, a count): one pattern per class.
        path = f"/store/user/{doc['user']}/{uuid.uuid4().hex}.root"
        reason = f"{cls} copying {path} after {rng.randint(10, 999)} s"
        attempt.update(ended=t + 60, outcome="failed", error_class=cls, reason=reason)
        step(model.STATE, "failed_attempt", attempts=[attempt])
        step(model.STATE, "failed" if steps == "failed" else "retry")
        return doc
    # A copy of 5 to 60 s (from its attempt's submission to its end): a link's transfer time.
    attempt.update(ended=t + rng.randint(5, 60), outcome="done")
    step(model.STATE, "done", attempts=[attempt])
    if steps == "cleaned":
        step(model.CLEANUP, "cleaned")
    return doc


def write(db: Database, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    written = []
    for result, doc in zip(db.bulk_write(docs), docs, strict=True):
        assert result.ok, result
        written.append(dict(doc, _rev=result.rev))
    return written


def requests(db: Database) -> list[dict[str, Any]]:
    return [d for d in db.all_docs("", "\ufff0") if d.get("type") == model.REQUEST_TYPE]


def direct_totals(docs: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Files per state of each axis, straight from the documents."""
    return {axis: dict(sorted(Counter(d[axis] for d in docs).items())) for axis in model.AXES}


def direct_moves(docs: list[dict[str, Any]], start: float, end: float) -> dict[str, list[int]]:
    """State-axis history entries of one hour, straight from the documents."""
    moves: dict[str, list[int]] = {}
    for doc in docs:
        for h in doc["history"]:
            if h["axis"] == model.STATE and start <= h["at"] < end:
                move = moves.setdefault(f"{h['from'] or ''}>{h['to']}", [0, 0])
                move[0] += 1
                move[1] += doc["size"]
    return moves


def direct_link_hours(docs: list[dict[str, Any]], start: float, end: float) -> dict[str, list]:
    """SRC>DST → [copies done, bytes done, failed attempts, transfer seconds of the copies done]
    in [start, end), from the documents (a copy's seconds: its done attempt's submission to its
    end; each file here is copied once)."""
    out: dict[str, list[float]] = {}
    for d in docs:
        link = f"{d['source']}>{d['destination']}"
        for h in d["history"]:
            if h["axis"] == model.STATE and h["to"] == "done" and start <= h["at"] < end:
                row = out.setdefault(link, [0, 0, 0, 0.0])
                row[0] += 1
                row[1] += d["size"]
                (copy,) = [a for a in d["attempts"] if a["outcome"] == "done"]
                row[3] += copy["ended"] - copy["submitted"]
        for a in d.get("attempts", []):
            if a["outcome"] == "failed" and start <= a["ended"] < end:
                out.setdefault(link, [0, 0, 0, 0.0])[2] += 1
    return out


def direct_failures(docs: list[dict[str, Any]], start: float, end: float) -> dict:
    """(link, class, pattern) → (failed attempts, first, last) in [start, end): the pattern is
    the reason with its path and count replaced, as the test's reasons are made."""
    out: dict[tuple[str, str, str], list] = {}
    for d in docs:
        for a in d.get("attempts", []):
            if a["outcome"] == "failed" and start <= a["ended"] < end:
                pattern = f"{a['error_class']} copying <path> after <n> s"
                key = (f"{d['source']}>{d['destination']}", a["error_class"], pattern)
                row = out.setdefault(key, [0, a["ended"], a["ended"]])
                row[0] += 1
                row[1], row[2] = min(row[1], a["ended"]), max(row[2], a["ended"])
    return {k: tuple(v) for k, v in out.items()}


def failure_counts(failures: dict) -> dict:
    return {
        (link, cls, pattern): (entry[0], entry[1], entry[2])
        for link, classes in failures.items()
        for cls, patterns in classes.items()
        for pattern, entry in patterns.items()
    }


def check_samples(failures: dict, docs: list[dict[str, Any]]) -> None:
    """Each sample is a request that failed that way, at most SAMPLES of them."""
    by_id = {d["_id"]: d for d in docs}
    for link, classes in failures.items():
        for cls, patterns in classes.items():
            for entry in patterns.values():
                assert 1 <= len(entry[3]) <= summaries.SAMPLES
                for doc_id in entry[3]:
                    doc = by_id[doc_id]
                    assert f"{doc['source']}>{doc['destination']}" == link
                    assert any(a.get("error_class") == cls for a in doc["attempts"])


def check_against(
    stats_db: Database, docs: list[dict[str, Any]], closed_end: float
) -> dict[str, Any]:
    """Every hour document, the state and the live documents against the documents."""
    live = stats_db.get(summaries.LIVE_ID)
    assert live["totals"] == direct_totals(docs)
    assert live["backlog"] == sum(d[model.STATE] in summaries.BACKLOG for d in docs)
    hours = {h["start"]: h for h in stats_db.all_docs(summaries.HOUR_PREFIX, "monitor:hour;")}
    first = min(h["at"] for d in docs for h in d["history"])
    start = summaries.hour_start(first)
    while start < closed_end:
        expected = direct_moves(docs, start, start + HOUR)
        got = hours.get(start, {}).get("moves", {}).get(model.STATE, {})
        assert got == expected, summaries.hour_name(start)
        start += HOUR
    assert all(s < closed_end for s in hours)
    # Each closed hour's links (copies and bytes done, failed attempts) and failures by link,
    # class and message pattern, with when they were first and last seen and sample files.
    details = {
        d["start"]: d for d in stats_db.all_docs(summaries.LINK_HOUR_PREFIX, "monitor:linkhour;")
    }
    assert set(details) == set(hours)
    for start, detail in details.items():
        assert "link_hours" not in hours[start]  # the overview reads moves only
        assert detail["link_hours"] == direct_link_hours(docs, start, start + HOUR)
        assert failure_counts(detail["failures"]) == direct_failures(docs, start, start + HOUR)
        check_samples(detail["failures"], docs)
    for h in live["open"]:
        assert h["link_hours"] == direct_link_hours(docs, h["start"], h["start"] + HOUR)
        assert failure_counts(h["failures"]) == direct_failures(docs, h["start"], h["start"] + HOUR)
    # The live document's open hours and the closed ones add up to every event.
    open_moves = Counter()
    for h in live["open"]:
        assert h["start"] >= closed_end
        for name, (files, _) in h["moves"].get(model.STATE, {}).items():
            open_moves[name] += files
    everything = direct_moves(docs, closed_end, float("inf"))
    assert dict(open_moves) == {k: v[0] for k, v in everything.items()}
    for day in stats_db.all_docs(summaries.LINK_DAY_PREFIX, "monitor:linkday;"):
        assert day["link_hours"] == direct_link_hours(docs, day["start"], day["start"] + 86400)
        assert failure_counts(day["failures"]) == direct_failures(
            docs, day["start"], day["start"] + 86400
        )
    return hours


def test_the_first_run_counts_every_hour_and_now(dbs: tuple[Database, Database]) -> None:
    files, stats_db = dbs
    rng = random.Random(1)
    docs = [
        lifecycle(T0 - rng.uniform(0, 50 * HOUR), rng, user=rng.choice(["alice", "bob"]))
        for _ in range(300)
    ]
    docs = write(files, docs)
    clock = Clock(T0 + 10)
    aggregator = summaries.Aggregator(files, stats_db, close_after=300, batch=70, clock=clock)
    report = aggregator.step()
    assert report.backfilled and report.read == 300
    # 05:00:10 minus close_after: the hours up to 04:00 are over.
    assert aggregator.closed_end == T0 - HOUR
    hours = check_against(stats_db, requests(files), T0 - HOUR)
    assert len(report.closed) == len(hours)
    details = stats_db.all_docs(summaries.LINK_HOUR_PREFIX, "monitor:linkhour;")
    assert sum(len(d["failures"]) for d in details) >= 10  # the check above had work
    assert len(stats_db.all_docs(summaries.LINK_DAY_PREFIX, "monitor:linkday;")) == 2
    # Days: the two full days before T0's day; each holds the sum of its hours and its end.
    days = stats_db.all_docs(summaries.DAY_PREFIX, "monitor:day;")
    assert [d["day"] for d in days] == report.days
    assert len(days) == 2
    for day in days:
        in_day = [h for s, h in hours.items() if day["start"] <= s < day["start"] + 86400]
        assert day["moves"]["state"]["submitted>done"][0] == sum(
            h["moves"].get("state", {}).get("submitted>done", [0])[0] for h in in_day
        )
        assert day["backlog_max"] == max(h["backlog"] for h in in_day)
    # Links and users now.
    live_links = stats_db.get(summaries.LIVE_LINKS_ID)["links"]
    link = "T2_CH_CERN>T2_DE_DESY"
    assert live_links[link] == {k: v for k, v in direct_totals(docs)[model.STATE].items()}
    failed_attempts = Counter(
        a["error_class"] for d in docs for a in d.get("attempts", []) if a["outcome"] == "failed"
    )
    assert stats_db.get(summaries.LIVE_LINKS_ID)["errors"][link] == dict(failed_attempts)
    users = stats_db.get(summaries.LIVE_USERS_ID)["users"]
    for user in ("alice", "bob"):
        mine = [d for d in docs if d["user"] == user]
        assert users[user] == {
            **Counter(d["state"] for d in mine),
            summaries.USER_BYTES_DONE: sum(d["size"] for d in mine if d["state"] == "done"),
        }
    # Every document written is the shape docs/summaries.schema.json gives the pages.
    kinds = Counter(d["type"] for d in check_summaries(stats_db))
    assert set(kinds) == set(summaries.TYPES), kinds


def test_the_summaries_schema_refuses_what_the_pages_could_not_read():
    """The schema is not a formality: a wrong shape, a missing figure, a stray member fail."""
    schema = summaries_schema()
    hour = {"_id": "monitor:hour:2026-11-28T05", "type": "monitor_hour", "hour": "2026-11-28T05",
            "start": T0, "moves": {"state": {">new": [3, 3000]}}, "totals": {"state": {"new": 3}},
            "backlog": 3}  # fmt: skip
    assert schema.is_valid(hour)
    for broken in (
        {**hour, "moves": {"state": {">new": [3]}}},  # [files, bytes]
        {**hour, "hour": "2026-11-28 05"},
        {k: v for k, v in hour.items() if k != "backlog"},
        {**hour, "extra": 1},
        {**hour, "type": "monitor_day"},
    ):
        assert not schema.is_valid(broken), broken


def test_hours_close_as_time_goes_by_exactly_once_across_restarts_and_crashes(
    dbs: tuple[Database, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    files, stats_db = dbs
    rng = random.Random(2)
    clock = Clock(T0)
    write(files, [lifecycle(T0 - rng.uniform(0, 3 * HOUR), rng) for _ in range(100)])
    aggregator = summaries.Aggregator(files, stats_db, close_after=300, batch=40, clock=clock)
    aggregator.step()
    for n in range(1, 7):
        # An hour goes by (the agent's cycles read the feed all along: one ten minutes before
        # the hour closes the last one), then new requests, and requests of the open hours move.
        clock.now = T0 + n * HOUR - 600
        if n == 5:
            # A crash after the hour documents, before the state document: the next instance
            # writes the same hours again.
            real_put = stats_db.put

            def crash(doc: dict[str, Any], real_put: Any = real_put) -> str:
                if doc["_id"] == summaries.STATE_ID:
                    raise StoreError(503, "crash", "before the state document")
                return real_put(doc)

            monkeypatch.setattr(stats_db, "put", crash)
            with pytest.raises(StoreError):
                aggregator.step()
            monkeypatch.setattr(stats_db, "put", real_put)
            aggregator = summaries.Aggregator(
                files, stats_db, close_after=300, batch=40, clock=clock
            )
        assert aggregator.step().closed == [summaries.hour_name(T0 + (n - 2) * HOUR)]
        clock.now = T0 + n * HOUR
        moved = []
        for doc in rng.sample(requests(files), 20):
            if doc["state"] == "retry":
                doc = model.transition(
                    doc, [Change(model.STATE, "new", "t")], model.ADMIN, at=clock.now - 900
                )
                moved.append(doc)
        fresh = [lifecycle(clock.now - rng.uniform(0, HOUR), rng) for _ in range(40)]
        write(files, moved + fresh)
        if n == 3:
            # A restart: a new instance resumes from what was written.
            aggregator = summaries.Aggregator(
                files, stats_db, close_after=300, batch=40, clock=clock
            )
        report = aggregator.step()
        assert report.read > 0
        assert aggregator.closed_end == summaries.hour_start(clock.now - 300)
        check_against(stats_db, requests(files), aggregator.closed_end)
    # What each task did in the last 24 hours (the live document; closed hours read back after
    # the restarts), against the documents' state-axis history.
    live = stats_db.get(summaries.LIVE_ID)
    recent: Counter = Counter()
    for doc in requests(files):
        for h in doc["history"]:
            if h["axis"] == model.STATE and summaries.hour_start(h["at"]) >= live["tasks_since"]:
                recent[(doc["task"], "created" if h["from"] is None else f"state:{h['to']}")] += 1
    shown = Counter(
        {(t, k): n for t, keys in live["tasks"].items() for k, n in keys.items()
         if k == "created" or k.startswith("state:")}
    )  # fmt: skip
    assert shown == recent
    state = stats_db.get(summaries.STATE_ID)
    assert state["resume_seq"] != "0"  # resumes from a recent point of the feed, not the start
    assert (
        summaries.Tally.from_json(state["cumulative"]).totals()
        == stats_db.get(
            f"{summaries.HOUR_PREFIX}{summaries.hour_name(aggregator.closed_end - HOUR)}"
        )["totals"]
    )


def test_a_request_changed_while_the_first_run_reads_is_counted_once(
    dbs: tuple[Database, Database],
) -> None:
    files, stats_db = dbs
    rng = random.Random(3)
    docs = write(files, [lifecycle(T0 - 5 * HOUR, rng) for _ in range(60)])
    clock = Clock(T0)
    aggregator = summaries.Aggregator(files, stats_db, close_after=300, batch=10, clock=clock)
    real_changes = files.changes
    touched = {"done": False}

    def changes_then_touch(since: str, **kw: Any) -> Any:
        batch = real_changes(since, **kw)
        if not touched["done"] and batch.results:
            # Requests already read change again: the feed shows them a second time.
            touched["done"] = True
            seen = {c["id"] for c in batch.results}
            again = [dict(d, priority=2) for d in docs if d["_id"] in seen]
            write(files, again)
        return batch

    files.changes = changes_then_touch  # type: ignore[method-assign]
    report = aggregator.step()
    assert report.read > 60  # some requests came twice
    check_against(stats_db, requests(files), aggregator.closed_end)


def test_a_restart_reads_the_feed_from_the_first_request_still_open(
    dbs: tuple[Database, Database],
) -> None:
    """A store of finished requests resumes near the end of its feed: a restart reads the
    requests that still have events in the open hours (from the feed batch of the first of
    them), and none once their hours are closed (issue 22: the first run's resume was the start
    of the feed, so a million finished requests were read again by each restart until an hour
    closed a further hour later)."""
    files, stats_db = dbs
    rng = random.Random(6)
    old = [lifecycle(T0 - 5 * HOUR - rng.uniform(0, HOUR), rng) for _ in range(150)]
    write(files, old)
    # The open hour's requests (created 20 to 25 minutes before T0), written last.
    write(files, [lifecycle(T0 - 20 * 60 - rng.uniform(0, 300), rng) for _ in range(5)])
    clock = Clock(T0)

    def restarted() -> summaries.Aggregator:
        return summaries.Aggregator(files, stats_db, close_after=300, batch=20, clock=clock)

    report = restarted().step()
    assert report.backfilled and report.read == 155 and report.pending == 5
    assert stats_db.get(summaries.STATE_ID)["resume_seq"] != "0"
    again = restarted()
    report = again.step()
    # From the batch of the first open request on (the feed of a store of several shards
    # interleaves them: the open five may be a little earlier than the last five).
    assert 5 <= report.read < 75 and report.pending == 5
    check_against(stats_db, requests(files), again.closed_end)
    # An hour later the open hour is closed and nothing is pending: a restart reads nothing.
    clock.now = T0 + HOUR
    report = again.step()
    assert report.closed == [summaries.hour_name(T0 - HOUR)] and report.pending == 0
    last = restarted()
    assert last.step().read == 0
    check_against(stats_db, requests(files), last.closed_end)
    # A request written after that is read, and counted once.
    write(files, [lifecycle(clock.now - 600, rng)])
    assert last.step().read == 1
    check_against(stats_db, requests(files), last.closed_end)


def test_purged_requests_stay_in_the_history(dbs: tuple[Database, Database], admin: Server) -> None:
    files, stats_db = dbs
    rng = random.Random(4)
    old = [lifecycle(T0 - 30 * HOUR - rng.uniform(0, HOUR), rng) for _ in range(80)]
    write(files, old + [lifecycle(T0 - rng.uniform(0, HOUR), rng) for _ in range(20)])
    clock = Clock(T0)
    aggregator = summaries.Aggregator(files, stats_db, close_after=300, clock=clock)
    aggregator.step()
    before = {h["_id"]: h["moves"] for h in stats_db.all_docs("monitor:hour:", "monitor:hour;")}
    totals = stats_db.get(summaries.LIVE_ID)["totals"]
    bound = aggregator.purge_bound()
    assert bound is not None
    report = purge.purge(
        files,
        stats_db,
        older_than=min(T0 - 24 * HOUR, bound),
        batch_size=50,
        by="t",
        lease=60,
        counts=storejs.contribution,
    )
    assert report.purged > 0
    assert len(requests(files)) == 100 - report.purged
    clock.now += HOUR
    aggregator.step()
    after = {h["_id"]: h["moves"] for h in stats_db.all_docs("monitor:hour:", "monitor:hour;")}
    assert {k: v for k, v in after.items() if k in before} == before
    # "Now" still counts the purged requests: the history since the records began.
    assert stats_db.get(summaries.LIVE_ID)["totals"] == totals


def test_agents_write_monitor_documents_and_others_may_not(
    dbs: tuple[Database, Database], accounts: dict[str, Server]
) -> None:
    _, stats_db = dbs
    as_agent = accounts["agent"].db(stats_db.name)
    as_agent.put({"_id": "monitor:live:x", "type": "monitor_live"})
    with pytest.raises(StoreError) as refused:
        as_agent.put({"_id": "monitor:bogus", "type": "something"})
    assert refused.value.status == 403
    with pytest.raises(StoreError) as refused:
        accounts["alice"].db(stats_db.name).put({"_id": "monitor:live", "type": "monitor_live"})
    assert refused.value.status == 403


def test_the_first_run_records_tasks_of_its_last_week_only(dbs: tuple[Database, Database]) -> None:
    files, stats_db = dbs
    rng = random.Random(5)
    old, recent = T0 - 10 * 86400, T0 - 2 * 86400
    write(files, [lifecycle(old, rng, task="261101_000000:alice_old"),
                  lifecycle(recent, rng, task="261111_000000:alice_recent")])  # fmt: skip
    summaries.Aggregator(files, stats_db, clock=Clock(T0)).step()
    hours = {h["hour"]: h for h in stats_db.all_docs(summaries.HOUR_PREFIX, "monitor:hour;")}
    tasks = {h["hour"]: h for h in stats_db.all_docs(summaries.TASKS_PREFIX, "monitor:tasks;")}
    old_hour, recent_hour = summaries.hour_name(old), summaries.hour_name(recent)
    assert hours[old_hour]["moves"]["state"][">new"][0] == 1  # the moves of every hour
    assert tasks[old_hour]["tasks"] == {}
    assert tasks[recent_hour]["tasks"]["261111_000000:alice_recent"]["created"] == 1


def listed_and_folded(doc: dict[str, Any]) -> Counter:
    """(user, "created" or "state:to") → files of a summary's tasks, listed and folded alike."""
    out: Counter = Counter()
    for row in doc["tasks"].values():
        for key, n in row.items():
            if key == "created" or key.startswith("state:"):
                out[(summaries.task_user(row), key)] += n
    for user, row in doc[summaries.OTHER_TASKS].items():
        for key, n in row.items():
            if key == "created" or key.startswith("state:"):
                out[(user, key)] += n
    return out


def test_summaries_stay_bounded_whatever_the_number_of_tasks(
    dbs: tuple[Database, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Users name their tasks: 30,000 tasks active in a day made `monitor:live` too large for
    CouchDB, which refused it every cycle (issue 33). Scaled down (a cap of 30 tasks, 4 of each
    user's first): alice makes a task per upload, 50 an hour, bob 6 tasks, for 4 hours. Every
    cycle writes the live document and closes its hour; no summary lists more than the cap; bob
    keeps his tasks listed; listed and folded tasks add up to the documents, user by user."""
    monkeypatch.setattr(summaries, "TASKS_CAP", 30)
    monkeypatch.setattr(summaries, "USER_TASKS", 4)
    files, stats_db = dbs
    rng = random.Random(33)
    clock = Clock(T0 + 10)
    aggregator = summaries.Aggregator(files, stats_db, close_after=300, batch=100, clock=clock)
    revs = set()
    for n in range(4):
        clock.now += HOUR
        fresh = [lifecycle(clock.now - rng.uniform(600, HOUR), rng, user="alice",
                           task=f"261121_120000:alice_t{n}x{i}") for i in range(50)]  # fmt: skip
        fresh += [lifecycle(clock.now - rng.uniform(600, HOUR), rng, user="bob",
                            task=f"261121_120000:bob_t{i}") for i in range(6)]  # fmt: skip
        write(files, fresh)
        aggregator.step()
        live = stats_db.get(summaries.LIVE_ID)
        revs.add(live["_rev"])
        assert live["as_of"] == clock.now and len(revs) == n + 1  # written every cycle
        assert aggregator.closed_end == summaries.hour_start(clock.now - 300)
        assert len(live["tasks"]) == 30
        bob = [t for t, row in live["tasks"].items() if summaries.task_user(row) == "bob"]
        assert len(bob) >= 4
        docs = requests(files)
        recent: Counter = Counter()
        for doc in docs:
            for h in doc["history"]:
                if h["axis"] == model.STATE and h["at"] >= live["tasks_since"]:
                    kind = "created" if h["from"] is None else f"state:{h['to']}"
                    recent[(doc["user"], kind)] += 1
        assert listed_and_folded(live) == recent
        active = {d["task"] for d in docs if d["user"] == "alice"}
        alice = [t for t, row in live["tasks"].items() if summaries.task_user(row) == "alice"]
        assert live[summaries.OTHER_TASKS]["alice"]["tasks"] >= len(active) - len(alice)
    hours = stats_db.all_docs(summaries.TASKS_PREFIX, "monitor:tasks;")
    assert len(hours) >= 3
    everything: Counter = Counter()
    for hour in hours:
        assert len(hour["tasks"]) <= 30
        everything.update(listed_and_folded(hour))
    closed: Counter = Counter()
    for doc in requests(files):
        for h in doc["history"]:
            if h["axis"] == model.STATE and h["at"] < aggregator.closed_end:
                closed[(doc["user"], "created" if h["from"] is None else f"state:{h['to']}")] += 1
    assert everything == closed


def test_a_summary_of_thirty_thousand_tasks_is_well_below_the_store_s_limit() -> None:
    """The red team's workload at the real cap: 30,000 tasks of 200-character names (60
    users) fold into a document of under a megabyte, a quarter of what ASO writes at most."""
    rng = random.Random(30)
    tasks = {
        f"261121_120000:u{i % 60}_" + "t" * 180 + f"{i:06d}": {
            "created": 1, "state:done": rng.randint(0, 3), "state:failed_attempt": 1,
            "cleanup:cleaned": 1, "publication:published": 1, f"user:u{i % 60}": 5,
        }
        for i in range(30_000)
    }  # fmt: skip
    listed, folded = summaries.fold_tasks(tasks)
    assert len(listed) == summaries.TASKS_CAP
    assert sum(row["tasks"] for row in folded.values()) == 30_000 - summaries.TASKS_CAP
    size = len(json.dumps({"tasks": listed, summaries.OTHER_TASKS: folded}))
    assert size < limits.MAX_WRITTEN_DOC_CHARS // 4, size


def test_a_request_created_done_is_no_copy_on_its_link():
    """Red team round 22: 300 requests a user created `done` (its job wrote the files at the
    destination itself) made a link's pace 78 files/s in everyone's estimates, and five of
    10^15 bytes showed 5 PB copied this hour on the pages. Only a move to `done` is a copy on
    its link: the estimates' view (link_done) and the pages' link figures leave creations out."""
    created = dict(sample_request("alice"), state="done", cleanup="not_needed")
    created["history"] = [dict(created["history"][0], to="done")]
    copied = sample_request("alice")
    start = copied["created"]
    copied["history"] = [
        *copied["history"],
        {"axis": model.STATE, "from": "new", "to": "submitted", "at": start + 1, "by": "agent"},
        {"axis": model.STATE, "from": "submitted", "to": "done", "at": start + 9, "by": "agent"},
    ]
    copied.update(state="done", attempts=[{"outcome": "done", "submitted": start + 1,
                                           "ended": start + 9}])  # fmt: skip
    design = storejs.files_design(Config())
    assert design.map("link_done", created) == []
    link = (copied["source"], copied["destination"])
    assert [key for key, _ in design.map("link_done", copied)] == [[*link, start + 9]]
    for doc, copies in ((created, None), (copied, 1)):
        tally = summaries.Tally()
        for event in summaries.events_of(doc):
            tally.count(event, summaries.Meta.of(doc))
        figures = tally.link_hours.get(f"{doc['source']}>{doc['destination']}")
        assert (figures[0] if figures else None) == copies, tally.link_hours
    # the statistics: its owner's own row only, where a copy counts under its link too
    assert set(storejs.contribution(created).names) == {"user"}
    assert set(storejs.contribution(copied).names) == {"link", "user", "destination", "hour"}
