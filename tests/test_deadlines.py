"""Deadlines (`transfer.deadline`): a file not copied within it from its creation fails with
class `expired`, whatever keeps it waiting (queued behind an operator's ban, cooling off after
failed attempts, held); within a user's turn the submitter takes the oldest first, the nearest
its deadline. On both stores."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

from aso.actions import resubmit, set_control
from aso.agents.monitor import Monitor
from aso.agents.retry_manager import RetryManager
from aso.agents.submitter import Submitter
from aso.core.submission import deadline_start, fair_order
from aso.model import ALLOW, AS_DESTINATION, BAN, SITE
from aso.runtime import Runner
from aso.transfer import errors
from tests.pipeline_helpers import LINKS, run_until, states, upload


def test_files_not_copied_within_their_deadline_fail_as_expired(sim_config, accounts, admin):
    sim = dataclasses.replace(
        sim_config.sim, link_failure_rates={"T2_CH_CERN>T2_DE_DESY": 1.0},
        failure_classes={"connection": 1.0},
    )  # fmt: skip
    config = dataclasses.replace(
        sim_config,
        sim=sim,
        transfer=dataclasses.replace(sim_config.transfer, deadline=3.0),
        retry=dataclasses.replace(sim_config.retry, base_delay=0.2, jitter=0.0, max_attempts=100),
    )
    db = admin.db(config.store.files_db)
    operator = accounts["operator"].db(config.store.files_db)
    set_control(operator, SITE, "T2_IT_Bari", BAN, "disks out", "operator", time.time(),
                AS_DESTINATION)  # fmt: skip
    failing = upload(accounts, config, 2, users=("alice",), links=[LINKS[0]])
    banned = upload(accounts, config, 2, users=("bob",), links=[LINKS[5]])
    runners = [Runner(Submitter(config, "s1")), Runner(Monitor(config, "m1")),
               Runner(RetryManager(config, "r1"))]  # fmt: skip
    ids = failing + banned
    run_until(lambda: states(db, ids) == Counter(failed=4), runners, 60, lambda: states(db, ids))
    for doc in db.get_many(ids).values():
        assert doc["error_class"] == errors.EXPIRED, doc["error_class"]
        assert "not copied within its deadline (3 s from its creation" in doc["failure_reason"]
        assert doc["history"][-1]["to"] == "failed"
    stored = db.get_many(ids)
    assert all(stored[i].get("attempts") for i in failing)  # tried, then expired
    assert not any(stored[i].get("attempts") for i in banned)  # never started: expired waiting
    # Resubmitted (the ban lifted), bob's files have a new deadline: copied.
    set_control(operator, SITE, "T2_IT_Bari", ALLOW, "back", "operator", time.time())
    resubmit(accounts["bob"].db(config.store.files_db), stored[banned[0]]["task"], None, "bob")
    roomy = dataclasses.replace(config, transfer=dataclasses.replace(config.transfer, deadline=600))
    again = [Runner(Submitter(roomy, "s2")), Runner(Monitor(roomy, "m2"))]
    run_until(lambda: states(db, banned) == Counter(done=2), again, 60,
              lambda: states(db, banned))  # fmt: skip
    for doc in db.get_many(banned).values():
        assert deadline_start(doc) > doc["created"]  # counted from the resubmission


def test_within_a_user_s_turn_the_oldest_file_goes_first():
    docs = [
        {"_id": f"{n:064x}", "user": user, "created": created, "priority": 0}
        for n, (user, created) in enumerate(
            [("alice", 30.0), ("alice", 10.0), ("bob", 20.0), ("alice", 20.0), ("bob", 5.0)]
        )
    ]
    order = [(d["user"], d["created"]) for d in fair_order(docs)]
    assert order == [("alice", 10.0), ("bob", 5.0), ("alice", 20.0), ("bob", 20.0),
                     ("alice", 30.0)]  # fmt: skip
