"""Holds (aso/core/holds.py): a destination that refuses a user's files for want of room or of
permission holds them instead of failing them. The retry manager starts the hold without
spending the files' attempts, the submitter keeps them back while it holds, the hold checker
looks at the destination again and releases it once it passes (or expires it at its deadline),
its user releases or cancels it (`aso hold ...`) and nobody else but an operator may; `aso
status`, the status rows and the metrics say why the files wait. On both stores."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from aso import metrics, model
from aso.actions import NotHeld, end_hold, resubmit
from aso.agents.hold_checker import HoldChecker
from aso.agents.monitor import Monitor
from aso.agents.retry_manager import RetryManager
from aso.agents.submitter import Submitter
from aso.config import Config, HoldsConfig
from aso.core import holds
from aso.model import HOLD_ACTIVE, HOLD_CANCELLED, HOLD_EXPIRED, HOLD_RELEASED, hold_id
from aso.monitoring import queries
from aso.runtime import Runner
from aso.store import Database, Forbidden
from aso.transfer.sim import SimService
from tests.conftest import PASSWORD, db_as, write_config
from tests.pipeline_helpers import LINKS, run_until, states, upload
from tests.test_cli import aso, one_line_error

CERN_DESY = LINKS[0]
FULL = "T2_CH_CERN>T2_DE_DESY"


def refusing(config: Config, error_class: str = "quota", **holds_settings: Any) -> Config:
    """`config` whose copies on CERN → DESY all fail with `error_class`, holds looked at soon."""
    sim = dataclasses.replace(
        config.sim, link_failure_rates={FULL: 1.0}, failure_classes={error_class: 1.0}
    )
    settings = {"first_check": 0.2, "max_check_interval": 0.4, "interval": 0.1, **holds_settings}
    return dataclasses.replace(config, sim=sim, holds=dataclasses.replace(config.holds, **settings))


def accepting(config: Config) -> Config:
    return dataclasses.replace(config, sim=dataclasses.replace(config.sim, link_failure_rates={}))


class Storage:
    """What the hold checker's looks find: `free` bytes reported, a probe write's error."""

    def __init__(self, free: int | None, probe_error: str | None = None):
        self.free, self.probe_error = free, probe_error
        self.looked: list[str] = []

    def free_space(self, url: str) -> int | None:
        self.looked.append(url)
        return self.free

    def probe(self, directory: str) -> str | None:
        self.looked.append(f"probe {directory}")
        return self.probe_error

    def reachable(self, url: str) -> str | None:
        self.looked.append(f"reachable {url}")
        return self.probe_error


def held_files(config: Config, accounts: dict, db: Database, user: str, n: int, task: str):
    """`n` files of `user` uploaded on CERN → DESY and run until every one waits held."""
    ids = upload(accounts, config, n, users=(user,), links=[CERN_DESY], task=task)
    runners = [Runner(Submitter(config, "s1")), Runner(Monitor(config, "m1")),
               Runner(RetryManager(config, "r1"))]  # fmt: skip
    key = hold_id("T2_DE_DESY", user)
    run_until(
        lambda: states(db, ids) == Counter(retry=n) and db.get(key) is not None,
        runners,
        describe=lambda: states(db, ids),
    )
    return ids, runners


def step_until(runner: Runner, wanted: Any, timeout: float = 20.0) -> dict[str, Any]:
    """Step one agent until a cycle's report is `wanted` (its feed read once a second)."""
    runner.workset.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report = runner.step(wait=False)
        if wanted(report):
            return report
        time.sleep(0.1)
    raise AssertionError(f"no cycle of {runner.agent.name} reported what was wanted")


def step_checker(checker: Runner, db: Database, key: str, until: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        checker.step(wait=False)
        doc = db.get(key)
        if until(doc):
            return doc
        time.sleep(0.1)
    raise AssertionError(f"the hold checker did not get there: {db.get(key)}")


def test_a_full_destination_holds_its_files_and_a_look_with_room_releases_them(
    sim_config, accounts, admin
):
    config = refusing(sim_config)
    db = admin.db(config.store.files_db)
    task = "261207_100000:alice_full"
    ids, runners = held_files(config, accounts, db, "alice", 3, task)
    key = hold_id("T2_DE_DESY", "alice")
    hold = db.get(key)
    assert (hold["state"], hold["error_class"], hold["user"], hold["site"]) == (
        HOLD_ACTIVE, "quota", "alice", "T2_DE_DESY")  # fmt: skip
    assert hold["needs"] == max(d["size"] for d in db.get_many(ids).values())
    assert [h["state"] for h in hold["history"]] == [HOLD_ACTIVE]
    docs = db.get_many(ids).values()
    assert all(d["error_class"] == "quota" and len(d["attempts"]) == 1 for d in docs)
    held_by = f"held by {key}: quota"
    assert all(d["history"][-1]["reason"].startswith(held_by) for d in docs)
    assert all(d["attempts"][-1]["held"] == key for d in docs)

    # While it holds, nothing starts: the cool-offs end, the files stay, a new upload waits too.
    time.sleep(0.3)
    later = upload(accounts, config, 1, users=("alice",), links=[CERN_DESY], task=task)
    report = step_until(runners[0], lambda r: r.get("held") == 4)
    assert report["submitted"] == 0, report
    # Only holding files back is no work: the submitter waits as an idle one (round 30: it had
    # cycled 67 times a second, each cycle reading the holds).
    assert not runners[0]._did_something(report)
    assert runners[0]._did_something({**report, "submitted": 1})
    assert states(db, ids + later) == Counter(retry=3, new=1)
    samples = {(s.labels["site"], s.labels["error_class"]): s.value
               for s in metrics.HELD.collect()[0].samples}  # fmt: skip
    assert samples == {("T2_DE_DESY", "quota"): 4}

    # Why they wait: the status (every file, new ones too) and the status rows themselves.
    status = queries.task_status(db, task)
    assert status.held == {holds.hold_of(hold).says(): 4}
    assert {f.id: f.waiting["why"] for f in status.files} == dict.fromkeys(ids + later, "held")
    assert {f.waiting["hold"] for f in status.files} == {key}
    rows = {r["id"]: r["value"]["waiting"] for r in db.view("asyncstageout", "by_task",
            start_key=[task], end_key=[task, {}]).rows}  # fmt: skip
    assert {i: (w["why"], w.get("hold")) for i, w in rows.items() if i in ids} == dict.fromkeys(
        ids, ("held", key)
    )

    # A look that finds too little room keeps it and looks again later; enough room releases.
    tight = Storage(free=10)
    checker = Runner(HoldChecker(config, "h1", files=tight))
    kept = step_checker(checker, db, key, lambda d: d["checks"] >= 1)
    assert (kept["state"], kept["free"]) == (HOLD_ACTIVE, 10) and tight.looked
    assert kept["next_check"] > kept["since"]
    roomy = Storage(free=10**12)
    checker = Runner(HoldChecker(config, "h1", files=roomy))
    released = step_checker(checker, db, key, lambda d: d["state"] != HOLD_ACTIVE)
    assert released["state"] == HOLD_RELEASED and "1000000000000 bytes free" in released["reason"]
    assert roomy.looked == [roomy.looked[0]], "room reported: no probe write"

    # The destination takes them now: every file done, none failed, one attempt refused each.
    fine = accepting(config)
    again = [Runner(Submitter(fine, "s2")), Runner(Monitor(fine, "m2")),
             Runner(RetryManager(fine, "r2"))]  # fmt: skip
    run_until(lambda: states(db, ids + later) == Counter(done=4), again,
              describe=lambda: states(db, ids + later))  # fmt: skip
    attempts = [len(d["attempts"]) for d in db.get_many(ids).values()]
    assert attempts == [2, 2, 2]


def test_held_attempts_spend_nothing_and_a_file_fails_only_past_the_deadline(
    sim_config, accounts, admin
):
    """Refused again and again while its hold is released each time, a file keeps its attempt
    budget (retry.max_attempts 2 here) and fails, class quota, only once held past the
    deadline since its first such failure."""
    config = refusing(sim_config, deadline=8.0)
    config = dataclasses.replace(config, retry=dataclasses.replace(config.retry, max_attempts=2))
    db = admin.db(config.store.files_db)
    [file_id], runners = held_files(config, accounts, db, "alice", 1, "261207_100100:alice_d")
    operator = accounts["operator"].db(config.store.files_db)
    key = hold_id("T2_DE_DESY", "alice")
    checker = Runner(HoldChecker(config, "h1", files=Storage(free=10**12)))
    deadline = time.monotonic() + 40
    while db.get(file_id)[model.STATE] != "failed" and time.monotonic() < deadline:
        for runner in [*runners, checker]:
            runner.step(wait=False)
        time.sleep(0.1)
    doc = db.get(file_id)
    assert doc[model.STATE] == "failed", doc[model.STATE]
    assert len(doc["attempts"]) > config.retry.max_attempts  # held attempts spent nothing
    assert doc["error_class"] == "quota" and "held past its deadline" in doc["failure_reason"]
    assert operator.get(key)["state"] in (HOLD_ACTIVE, HOLD_RELEASED)


def test_a_hold_past_its_deadline_expires_and_fails_the_files_it_held(sim_config, accounts, admin):
    config = refusing(sim_config, "permission", deadline=4.0, first_check=30.0)
    db = admin.db(config.store.files_db)
    ids, runners = held_files(config, accounts, db, "bob", 2, "261207_100200:bob_forbidden")
    key = hold_id("T2_DE_DESY", "bob")
    refused = Storage(free=None, probe_error="[13] Permission denied")
    checker = Runner(HoldChecker(config, "h1", files=refused))
    time.sleep(max(0.0, db.get(key)["since"] + 4.1 - time.time()))
    expired = step_checker(checker, db, key, lambda d: d["state"] != HOLD_ACTIVE)
    assert expired["state"] == HOLD_EXPIRED and "Permission denied" in expired["reason"]
    assert any(look.startswith("probe ") for look in refused.looked)
    run_until(lambda: states(db, ids) == Counter(failed=2), runners[:1])
    for doc in db.get_many(ids).values():
        assert doc["error_class"] == "permission"
        assert "the hold past its deadline" in doc["failure_reason"]
    # Resubmitted, they are not failed again by the hold that ended before.
    resubmit(accounts["bob"].db(config.store.files_db), "261207_100200:bob_forbidden", None, "bob")
    fine = accepting(config)
    again = [Runner(Submitter(fine, "s2")), Runner(Monitor(fine, "m2"))]
    run_until(lambda: states(db, ids) == Counter(done=2), again)


def test_its_user_releases_or_cancels_a_hold_and_nobody_else_but_an_operator(
    sim_config, accounts, admin, tmp_path
):
    config = refusing(sim_config, first_check=3600.0)
    db = admin.db(config.store.files_db)
    task = "261207_100300:alice_cancel"
    ids, runners = held_files(config, accounts, db, "alice", 2, task)
    key = hold_id("T2_DE_DESY", "alice")
    stored = db.get(key)
    path = write_config(dataclasses.replace(
        config, source=tmp_path / "alice.toml",
        store=dataclasses.replace(config.store, user="alice", password=PASSWORD)))  # fmt: skip
    bob_path = write_config(dataclasses.replace(
        config, source=tmp_path / "bob.toml",
        store=dataclasses.replace(config.store, user="bob", password=PASSWORD)))  # fmt: skip

    listed = aso("hold", "list", config=path)
    assert listed.returncode == 0, listed.stderr
    [row] = [line.split("\t") for line in listed.stdout.splitlines()[1:]]
    assert row[:4] == ["T2_DE_DESY", "alice", "active", "quota"]
    [as_json] = json.loads(aso("hold", "list", "--json", config=path).stdout)
    assert as_json["next_check"] == stored["next_check"]

    # bob can neither release nor cancel alice's hold, by the CLI or by a write of his own.
    bobs = aso("hold", "cancel", "T2_DE_DESY", "--user", "alice", config=bob_path)
    assert bobs.returncode == 1 and "may not change a hold of user" in one_line_error(bobs)
    bob = db_as(accounts, "bob", config.store.files_db)
    for doc, rule in [
        (holds.ended(stored, HOLD_RELEASED, "mine", "bob", time.time(), by_owner=True), "hold"),
        ({**stored, "user": "bob"}, r"_id must be hold:T2_DE_DESY:bob"),
    ]:
        with pytest.raises(Forbidden, match=rule):
            bob.put(doc)
    # alice may release or cancel only, in her own name, keeping the rest as the agents left it.
    alice = db_as(accounts, "alice", config.store.files_db)
    now = time.time()
    mine = holds.ended(stored, HOLD_CANCELLED, "giving up", "alice", now, by_owner=True)
    for doc, rule in [
        ({**mine, "needs": 0}, "needs is the agents' to change"),
        ({**mine, "next_check": 0.0}, "next_check is the agents' to change"),
        (holds.ended(stored, HOLD_EXPIRED, "x", "alice", now, by_owner=True), "release or cancel"),
        (holds.ended(stored, HOLD_CANCELLED, "x", "bob", now, by_owner=True), "recorded by its"),
        (
            holds.ended(stored, HOLD_CANCELLED, "x", "alice", now - 86400, by_owner=True),
            r"\[time\]",
        ),
        ({**mine, "history": mine["history"][1:]}, "one history entry"),
        ({**mine, "reason": "not the history's"}, "the last history entry is the state"),
        ({**mine, "colour": "red"}, "doc.colour is not a field"),
    ]:
        with pytest.raises(Forbidden, match=rule):
            alice.put(doc)
    started = {**stored, "_id": hold_id("T2_IT_Pisa", "alice"), "site": "T2_IT_Pisa"}
    started.pop("_rev")
    with pytest.raises(Forbidden, match="holds are started by the agents"):
        alice.put(started)
    assert db.get(key) == stored

    cancelled = aso("hold", "cancel", "T2_DE_DESY", "-r", "no more room this month", config=path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "hold of alice's files at T2_DE_DESY: cancelled" in cancelled.stdout
    run_until(lambda: states(db, ids) == Counter(failed=2), runners[:1])
    for doc in db.get_many(ids).values():
        assert doc["error_class"] == "quota"
        assert "cancelled by alice: no more room this month" in doc["failure_reason"]
    again = aso("hold", "release", "T2_DE_DESY", config=path)
    assert again.returncode == 2 and "not held: the hold is cancelled" in one_line_error(again)

    # An operator releases anyone's hold.
    held_files(config, accounts, db, "bob", 1, "261207_100400:bob_release")
    operator = accounts["operator"].db(config.store.files_db)
    end_hold(operator, "T2_DE_DESY", "bob", HOLD_RELEASED, "room added", "operator", time.time())
    assert db.get(hold_id("T2_DE_DESY", "bob"))["by"] == "operator"
    with pytest.raises(NotHeld):
        end_hold(operator, "T2_DE_DESY", "bob", HOLD_RELEASED, "again", "operator", time.time())


def test_a_destination_that_stops_answering_everyone_holds_every_user_s_files(
    sim_config, accounts, admin, tmp_path
):
    """Many users' attempts to one destination fail without an answer (connection refused): its
    breaker trips and a site's hold holds everyone's files for it, spending no attempt (one
    each here: any failure not held would fail the file); a user cannot end it; once the site
    answers a look again the hold is released and every file completes."""
    sim = dataclasses.replace(
        sim_config.sim, outages=[{"site": "T2_DE_DESY", "start": 0, "end": 8}]
    )
    settings = {"first_check": 0.2, "max_check_interval": 0.4, "interval": 0.1,
                "breaker_failures": 4, "breaker_users": 2}  # fmt: skip
    config = dataclasses.replace(
        sim_config, sim=sim, holds=dataclasses.replace(sim_config.holds, **settings),
        retry=dataclasses.replace(sim_config.retry, max_attempts=1),
    )  # fmt: skip
    db = admin.db(config.store.files_db)
    task = "261207_100500:alice_down"
    ids = upload(accounts, config, 3, users=("alice",), links=LINKS[:2], task=task)
    ids += upload(accounts, config, 3, users=("bob",), links=LINKS[:2], task="261207_100500:bob_d")
    runners = [Runner(Submitter(config, "s1")), Runner(Monitor(config, "m1")),
               Runner(RetryManager(config, "r1"))]  # fmt: skip
    key = hold_id("T2_DE_DESY")
    run_until(lambda: states(db, ids) == Counter(retry=6) and db.get(key) is not None, runners,
              describe=lambda: states(db, ids))  # fmt: skip
    hold = db.get(key)
    assert (hold["user"], hold["state"], hold["error_class"]) == ("", HOLD_ACTIVE, "connection")
    assert "attempts of 2 users there failed without an answer" in hold["reason"]
    assert all(d["attempts"][-1]["held"] == key for d in db.get_many(ids).values())
    status = queries.task_status(db, task)
    assert status.held == {holds.hold_of(hold).says(): 3}
    assert {f.waiting["hold"] for f in status.files} == {key}
    report = step_until(runners[0], lambda r: r.get("held") == 6)
    assert report["submitted"] == 0

    # Nobody but an operator ends a site's hold; a look that finds no answer keeps it.
    for user in ("alice", "bob"):
        mine = holds.ended(hold, HOLD_RELEASED, "mine", user, time.time(), by_owner=True)
        with pytest.raises(Forbidden, match="may not change a hold of user"):
            db_as(accounts, user, config.store.files_db).put(mine)
    down = Storage(free=None, probe_error="[111] Connection refused")
    kept = step_checker(Runner(HoldChecker(config, "h1", files=down)), db, key,
                        lambda d: d["checks"] >= 1)  # fmt: skip
    assert kept["state"] == HOLD_ACTIVE and down.looked[0].startswith("reachable ")
    listed = aso("hold", "list", "--site", "T2_DE_DESY", config=write_config(config))
    [row] = [line.split("\t") for line in listed.stdout.splitlines()[1:]]
    assert row[:4] == ["T2_DE_DESY", "(everyone)", "active", "connection"], listed.stdout
    as_bob = write_config(dataclasses.replace(
        config, source=tmp_path / "bob.toml",
        store=dataclasses.replace(config.store, user="bob", password=PASSWORD)))  # fmt: skip
    refused = aso("hold", "release", "T2_DE_DESY", "--everyone", config=as_bob)
    assert refused.returncode == 1 and "may not change a hold" in one_line_error(refused)

    # It answers again (the outage over): released, every file done, none failed.
    time.sleep(max(0.0, 8.5 - (time.time() - SimService(admin.db(config.store.transfers_db),
                                                       config.sim).epoch)))  # fmt: skip
    up = Storage(free=None)
    released = step_checker(Runner(HoldChecker(config, "h1", files=up)), db, key,
                            lambda d: d["state"] != HOLD_ACTIVE)  # fmt: skip
    assert released["state"] == HOLD_RELEASED
    run_until(lambda: states(db, ids) == Counter(done=6), runners,
              describe=lambda: states(db, ids))  # fmt: skip


def test_the_breaker_blames_the_end_a_failure_names_and_needs_two_users():
    """Round 29: failures from a dead source were counted against the destination its users
    chose, which two users could trip for everyone. A failure counts for the site its reason
    names (SOURCE or DESTINATION, or the site), a copy done or failed otherwise answers for
    both ends, and one user's failures alone trip nothing."""
    config = dataclasses.replace(
        HoldsConfig(), breaker_failures=3, breaker_users=2, breaker_window=100.0
    )
    breaker = holds.Breaker(config)
    now = 1000.0

    def attempt(
        user: str,
        reason: str,
        outcome: str = "failed",
        error_class: str | None = "connection",
        at: float = now,
    ) -> None:
        doc = {"type": model.REQUEST_TYPE, "_id": uuid.uuid4().hex, "user": user,
               "source": "T2_IT_Pisa", "destination": "T2_CH_CERN",
               "attempts": [{"outcome": outcome, "ended": at, "reason": reason,
                             "error_class": error_class}]}  # fmt: skip
        breaker.observe(doc)

    for user in ("alice", "alice", "alice"):
        attempt(user, "[112] SOURCE CHECKSUM (Neon): Could not read status line")
    assert breaker.tripped("T2_IT_Pisa", now) is None  # one user's
    attempt("bob", "[112] SOURCE CHECKSUM (Neon): Connection reset by peer")
    assert "failed without an answer" in (breaker.tripped("T2_IT_Pisa", now) or "")
    assert breaker.tripped("T2_CH_CERN", now) is None  # the destination answered nothing wrong
    for user in ("alice", "bob", "carol"):
        attempt(user, "TRANSFER timed out")  # names neither end: counted for none
    assert breaker.tripped("T2_CH_CERN", now) is None
    attempt("carol", "", outcome="done", error_class=None, at=now + 1)  # both ends answered
    assert breaker.tripped("T2_IT_Pisa", now) is None
    assert breaker.tripped("T2_IT_Pisa", now + 1000) is None  # and old failures fall out


def test_files_at_the_service_whose_site_a_site_s_hold_holds_say_held(sim_config, accounts, admin):
    """A copy under way at a site found silent waits on it (the gfal worker holds such a site for
    everyone): `aso status` says `held` for the file at the service too, its job kept; a user's
    hold keeps back only what is not sent yet, so a copy under way there says `at_service`."""
    db = admin.db(sim_config.store.files_db)
    task = "261207_101500:alice_silent"
    ids = upload(accounts, sim_config, 2, users=("alice",), links=[LINKS[0], LINKS[3]], task=task)
    submitter = Runner(Submitter(sim_config, "s1"))
    run_until(lambda: states(db, ids) == Counter(submitted=2), [submitter],
              describe=lambda: states(db, ids))  # fmt: skip
    docs = db.get_many(ids)
    [to_desy] = [i for i in ids if docs[i]["destination"] == "T2_DE_DESY"]
    [other] = [i for i in ids if i != to_desy]
    now = time.time()
    for site, user in (("T2_DE_DESY", ""), (docs[other]["destination"], "alice")):
        hold = holds.started(None, site=site, user=user, error_class="timeout" if not user
                             else "quota", reason="test", path="/store/user", needs=0,
                             by="w1", now=now, config=sim_config.holds)  # fmt: skip
        assert hold is not None
        db.put(hold)
    status = queries.task_status(db, task)
    waiting = {f.id: f.waiting for f in status.files}
    assert waiting[to_desy]["why"] == "held" and waiting[to_desy]["hold"] == hold_id("T2_DE_DESY")
    assert waiting[to_desy]["job_id"] == docs[to_desy]["transfer"]["job_id"]  # its copy is there
    assert waiting[other]["why"] == "at_service" and "hold" not in waiting[other]
    assert sum(status.held.values()) == 1
