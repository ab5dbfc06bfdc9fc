"""Analytics: statistics of finished requests (live views in the files database, batches of the
statistics database after the purge) match a count done directly over the documents; the purge
leaves only live or recent requests, counts each request exactly once across crashes and
resubmissions; `aso stats`."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from aso import model
from aso.actions import kill, resubmit
from aso.agents.analytics import Analytics
from aso.agents.cleaner import Cleaner
from aso.agents.monitor import Monitor
from aso.agents.retry_manager import RetryManager
from aso.agents.submitter import Submitter
from aso.cli.stats import stats_cmd
from aso.config import Config
from aso.core import request
from aso.model import STATE
from aso.monitoring import purge, statistics, summaries
from aso.provision import designdocs, storejs
from aso.runtime import Runner
from aso.store import Database, Server
from aso.store import admin as store_admin
from tests.conftest import preloaded_cli, sample_request
from tests.pipeline_helpers import LINKS, owner_db, run_until, upload

BAD_LINK = LINKS[0]  # every copy on it fails with a timeout: failed after two attempts


@pytest.fixture()
def config(sim_config: Config, admin: Server) -> Config:
    config = dataclasses.replace(
        sim_config,
        store=dataclasses.replace(sim_config.store, stats_db=f"stats_{uuid.uuid4().hex[:8]}"),
        retry=dataclasses.replace(sim_config.retry, max_attempts=2, base_delay=0.05, jitter=0),
        sim=dataclasses.replace(
            sim_config.sim,
            link_failure_rates={f"{BAD_LINK[0]}>{BAD_LINK[1]}": 1.0},
            failure_classes={"timeout": 1.0},
        ),
        analytics=dataclasses.replace(sim_config.analytics, batch=7),
        # Failed and killed files are finished once their temporary copies are discarded.
        cleaner=dataclasses.replace(sim_config.cleaner, failed_grace=0, discard_interval=0),
    )
    designdocs.init_stats_db(admin, config.store.stats_db)
    yield config
    store_admin.delete_db(admin, config.store.stats_db)


def every_request(db: Database) -> list[dict[str, Any]]:
    rows = db.server.raw("GET", f"/{db.name}/_all_docs", params={"include_docs": "true"})["rows"]
    return [r["doc"] for r in rows if r["doc"].get("type") == model.REQUEST_TYPE]


def direct_count(docs: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], Counter[str]]:
    """The statistics counted by hand over the documents, independently of
    aso.monitoring.statistics."""
    out: dict[tuple[str, str, str], Counter[str]] = {}
    for doc in docs:
        if doc[STATE] not in ("done", "failed", "killed"):
            continue
        end = [h["at"] for h in doc["history"] if h["axis"] == STATE][-1]
        day, hour = time.strftime("%Y-%m-%d %H", time.gmtime(end)).split()
        figures: Counter[str] = Counter()
        figures[f"files_{doc[STATE]}"] += 1
        if doc[STATE] == "done":
            figures["bytes_done"] += doc["size"]
        else:
            figures[f"error:{doc.get('error_class') or 'unknown'}:files"] += doc[STATE] == "failed"
        for attempt in doc.get("attempts", []):
            figures["attempts"] += 1
            figures[f"attempts_{attempt['outcome']}"] += 1
            if attempt["outcome"] == "failed":
                figures[f"error:{attempt['error_class']}:attempts"] += 1
        names = {
            "link": f"{doc['source']}>{doc['destination']}",
            "user": doc["user"],
            "destination": doc["destination"],
            "hour": hour,
        }
        for by, name in names.items():
            out.setdefault((by, day, name), Counter()).update(figures)
    return {key: +figures for key, figures in out.items()}


def as_read(config: Config, admin: Server) -> dict[tuple[str, str, str], Counter[str]]:
    """What aso.monitoring.statistics.read says, in the shape of direct_count."""
    sources = [admin.db(config.store.files_db), admin.db(config.store.stats_db)]
    out = {}
    for by in statistics.DIMENSIONS:
        for r in statistics.read(sources, by, "2000-01-01", "2999-12-31"):
            figures: Counter[str] = Counter()
            for column in ("files_done", "bytes_done", "files_failed", "files_killed"):
                figures[column] = r[column]
            figures["attempts"] = r["attempts"]
            figures["attempts_done"] = r["attempts_done"]
            figures["attempts_failed"] = r["attempts_failed"]
            for cls, e in r["errors"].items():
                figures[f"error:{cls}:files"] = e["files"]
                figures[f"error:{cls}:attempts"] = e["attempts"]
            out[(by, r["day"], r["name"])] = +figures
    return out


def drive(config: Config, ids: list[str], db: Database) -> None:
    """Submitter, monitor, retry manager and cleaner until every request is finished."""
    runners = [
        Runner(Submitter(config, "s1")),
        Runner(Monitor(config, "m1")),
        Runner(RetryManager(config, "r1")),
        Runner(Cleaner(config, "c1")),
    ]
    run_until(
        lambda: all(model.is_final(d) for d in db.get_many(ids).values()), runners, timeout=90
    )


def purged(db: Database, stats_db: Database, **options: Any) -> purge.PurgeReport:
    """purge.purge as the analytics agent runs it (the views' contribution.js, a lease of 60 s)."""
    return purge.purge(db, stats_db, lease=60, counts=storejs.contribution, **options)


def test_what_a_request_counts_for():
    doc = sample_request("alice", size=5000)
    assert storejs.contribution(doc) is None  # not ended
    t0 = doc["created"]
    doc["attempts"] = [
        {"job_id": "j1", "service": "sim", "submitted": t0, "ended": t0 + 12.5,
         "outcome": "failed", "reason": "x", "error_class": "timeout"},
        {"job_id": "j2", "service": "sim", "submitted": t0 + 100, "ended": t0 + 107,
         "outcome": "done", "reason": None, "error_class": None},
    ]  # fmt: skip
    doc["history"].append({"axis": STATE, "from": "submitted", "to": "done", "at": 86400.0 * 3})
    doc[STATE] = "done"
    c = storejs.contribution(doc)
    assert c is not None and c.day == "1970-01-04" and c.names["hour"] == "00"
    assert c.names["link"] == "T2_CH_CERN>T2_DE_DESY" and c.names["user"] == "alice"
    v = dict(zip(statistics.COLUMNS, c.row.values, strict=True))
    assert (v["files_done"], v["bytes_done"], v["files_failed"]) == (1, 5000, 0)
    assert (v["attempts"], v["attempts_done"], v["attempts_failed"]) == (2, 1, 1)
    assert (v["time_count"], v["time_sum"], v["time_lt10s"]) == (1, 7, 1)
    assert c.row.errors == {"timeout": [0, 1]} and c.row.time_min == c.row.time_max == 7
    doc[STATE], doc["error_class"] = "failed", None
    assert storejs.contribution(doc).row.errors == {"unknown": [1, 0], "timeout": [0, 1]}


def test_statistics_match_the_documents_before_and_after_the_purge(config, accounts, admin):
    db = admin.db(config.store.files_db)
    stats_db = admin.db(config.store.stats_db)
    links = LINKS[:3]
    # Wave 1: done, failed (the bad link) and killed requests of two users.
    wave1 = upload(accounts, config, 12, links=links)
    victim = next(d for d in db.get_many(wave1).values() if d["user"] == "bob")
    killed = kill(owner_db(accounts, config, "bob"), victim["task"], victim["job_id"], "bob")
    assert list(killed.changed.values()) == ["killed"]
    drive(config, wave1, db)
    cutoff = time.time()
    time.sleep(0.05)
    # Wave 2: finished after the cutoff (recent); wave 3: never processed (live).
    wave2 = upload(accounts, config, 5, users=("alice",), links=links)
    drive(config, wave2, db)
    live = upload(accounts, config, 3, users=("bob",), links=links)
    before = every_request(db)
    states = Counter(d[STATE] for d in before)
    assert states["done"] and states["failed"] and states["killed"] and states["new"] == 3

    expected = direct_count(before)
    # The live views say what the documents say (no batch yet).
    assert as_read(config, admin) == expected
    # The views (contribution.js in the store) and the purge (the same file in QuickJS) agree.
    tally = statistics.Tally()
    for doc in before:
        if (c := storejs.contribution(doc)) is not None:
            tally.add(c)
    python = {(r["by"], r["day"], r["name"]): r["values"] for r in tally.documents()}
    views = {
        tuple(r["key"]): r["value"] for r in db.view(statistics.DDOC, "daily", group_level=3).rows
    }
    assert python.keys() == views.keys()
    for key, values in views.items():  # the purge rounds each request's times to the ms
        assert python[key] == pytest.approx(values, abs=0.01 * len(before)), key

    report = purged(db, stats_db, older_than=cutoff, batch_size=7, by="a1", max_batches=100)
    old = {d["_id"] for d in before if d["_id"] in wave1}
    assert report.purged == len(old) and report.kept == 0 and report.batches == -(-len(old) // 7)
    after = every_request(db)
    # Only live or recent requests are left; the statistics did not move.
    assert {d["_id"] for d in after} == set(wave2) | set(live)
    assert as_read(config, admin) == expected
    assert not purge.pending_batches(stats_db)
    # Nothing older than the cutoff is purgeable any more; a second purge finds nothing.
    assert purged(db, stats_db, older_than=cutoff, batch_size=7, by="a1").purged == 0


def test_a_purge_interrupted_at_any_step_counts_each_request_once(config, accounts, admin):
    db = admin.db(config.store.files_db)
    stats_db = admin.db(config.store.stats_db)
    agent_db = accounts["agent"].db(config.store.files_db)
    agent_stats = accounts["agent"].db(config.store.stats_db)
    ids = upload(accounts, config, 10, links=LINKS[:2])
    drive(config, ids, db)
    expected = direct_count(every_request(db))
    now = time.time()

    candidates = purge.select(agent_db, now, 100)
    assert len(candidates) == len(ids)
    failed = next(d for d in candidates if d[STATE] == "failed")
    first = [failed, *[d for d in candidates if d is not failed][:5]]
    rest = [d for d in candidates if d not in first]
    # Crash after step 2 (the pending batch is written, nothing deleted) ...
    purge.intend(agent_stats, first, by="crashed-1", now=now, counts=storejs.contribution)
    assert as_read(config, admin) == expected  # a pending batch counts nothing
    # ... and a crash after step 3 (deleted, batch still pending).
    second = purge.intend(
        agent_stats, rest, by="crashed-2", now=now + 0.001, counts=storejs.contribution
    )
    purge.delete(agent_db, second)
    # Meanwhile a job retry's new file renews a failed request of the first batch before its
    # deletion (its temporary copy was discarded: a plain resubmission is refused).
    owner = owner_db(accounts, config, failed["user"])
    assert resubmit(owner, failed["task"], failed["job_id"], failed["user"]).refused
    retry = dict(failed, job_retry=failed["job_retry"] + 1)
    owner.put(request.renewed(owner.get(failed["_id"]), retry, failed["user"], time.time()))
    assert as_read(config, admin) != expected  # the renewed request left the live views

    report = purged(agent_db, agent_stats, older_than=now, batch_size=100, by="a2")
    assert report.recovered == 2 and report.kept == 1
    left = every_request(db)
    reopened = {d["_id"] for d in left}
    assert failed["_id"] in reopened and all(d[STATE] == "new" for d in left)
    # Every purged request is counted once: the statistics plus what the reopened requests
    # counted for before are what the documents said.
    restored = as_read(config, admin)
    for doc in first:
        if doc["_id"] in reopened:
            for key, figures in direct_count([doc]).items():
                restored[key] = restored.get(key, Counter()) + figures
    assert restored == expected
    complete = stats_db.view(statistics.DDOC, "pending").rows
    assert complete == []


def test_the_agent_purges_with_a_lease_and_only_as_first_instance(config, accounts, admin):
    config = dataclasses.replace(
        config, analytics=dataclasses.replace(config.analytics, purge_after=0.01, interval=3600)
    )
    db = admin.db(config.store.files_db)
    ids = upload(accounts, config, 4, links=LINKS[1:3])
    drive(config, ids, db)
    expected = direct_count(every_request(db))
    time.sleep(0.05)
    first, second = Analytics(config, "an-1"), Analytics(config, "an-2")
    runner = Runner(second)
    runner.workset.start()
    # Another purger holds the lease: the agent waits for it.
    assert purge.acquire_lease(
        accounts["agent"].db(config.store.stats_db), "other", time.time(), 60
    )
    assert runner.step(wait=False)["purged"] == 0
    purge.release_lease(accounts["agent"].db(config.store.stats_db), "other")
    second.last_run = None
    # Not before the monitoring summaries hold the hours of their events.
    assert runner.step(wait=False)["purged"] == 0
    assert second.summaries.purge_bound() < min(d["last_update"] for d in every_request(db))
    # Two hours later (the summaries' clock) those hours are over and summed up.
    second.summaries.clock = lambda: time.time() + 7200
    second.last_run = second.last_summary = None
    assert runner.step(wait=False)["purged"] == len(ids)
    hours = admin.db(config.store.stats_db).all_docs(summaries.HOUR_PREFIX, "monitor:hour;")
    done = sum(h["moves"]["state"].get("submitted>done", [0])[0] for h in hours)
    assert done == len(ids)
    assert every_request(db) == [] and as_read(config, admin) == expected
    # Not due again before its interval; the lease is released when the agent stops.
    assert "purged" not in runner.step(wait=False)
    second.close()
    first.close()
    lease = admin.db(config.store.stats_db).get(purge.LEASE_ID)
    assert lease["holder"] == "an-2" and lease["until"] == 0


def test_statistics_database_refuses_what_is_not_an_agent_s_batch(config, accounts):
    user_stats = accounts["alice"].db(config.store.stats_db)
    agent_stats = accounts["agent"].db(config.store.stats_db)
    batch = {"_id": "batch:1", "type": statistics.BATCH, "status": statistics.COMPLETE, "rows": [],
             "requests": {}}  # fmt: skip
    with pytest.raises(Exception, match="only agents and admins"):
        user_stats.create(dict(batch, status=statistics.PENDING))
    with pytest.raises(Exception, match="written pending first"):
        agent_stats.create(batch)
    rev = agent_stats.create(dict(batch, status=statistics.PENDING))
    rev = agent_stats.put(dict(batch, _rev=rev))
    with pytest.raises(Exception, match="never changes"):
        agent_stats.put(dict(batch, _rev=rev, rows=[{"by": "link"}]))
    with pytest.raises(Exception, match="never delete"):
        agent_stats.delete("batch:1", rev)


def stats_cli(config: Config) -> typer.Typer:
    return preloaded_cli(config, commands={"stats": stats_cmd})


def test_aso_stats_prints_the_table_and_json(config, accounts, admin):
    db = admin.db(config.store.files_db)
    ids = upload(accounts, config, 4, links=[BAD_LINK, LINKS[1]])
    drive(config, ids, db)
    app = stats_cli(config)
    result = CliRunner().invoke(app, ["stats", "--by", "link", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)["rows"]}
    bad = rows["{}>{}".format(*BAD_LINK)]
    assert bad["files_failed"] == 4 and bad["errors"]["timeout"] == {"files": 4, "attempts": 8}
    good = rows["{}>{}".format(*LINKS[1])]
    assert good["files_done"] == 4 and good["time_mean"] is not None
    table = CliRunner().invoke(app, ["stats", "--by", "user"], terminal_width=200)
    assert table.exit_code == 0 and "alice" in table.output
    assert any(line.startswith("total\t") for line in table.output.splitlines())  # tab-separated
    bad_dim = CliRunner().invoke(app, ["stats", "--by", "planet"])
    assert bad_dim.exit_code == 2 and "not one of link, user" in bad_dim.output
    bad_day = CliRunner().invoke(app, ["stats", "--from", "yesterday"])
    assert bad_day.exit_code == 2 and "not a day" in bad_day.output
