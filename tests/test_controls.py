"""Operators' controls (`aso site ban|drain|allow`, `aso user ban|allow`): only operators write
them, each setting kept with who, when and why; the submitter holds back the files they cover,
the monitor cancels the copies a ban covers (a drain lets them finish), and `aso status` says
why a task's files wait."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

import pytest

from aso import metrics, model
from aso.actions import set_control
from aso.agents.monitor import Monitor
from aso.agents.submitter import Submitter
from aso.core.controls import changed
from aso.model import ALLOW, AS_DESTINATION, AS_SOURCE, BAN, BOTH, DRAIN, SITE, USER, control_id
from aso.monitoring import queries
from aso.runtime import Runner
from aso.store import Forbidden
from tests.conftest import PASSWORD, db_as, write_config
from tests.pipeline_helpers import LINKS, jobs_of, run_until, states, upload
from tests.test_cli import aso, one_line_error

OPERATOR_ONLY = r"\[operator-doc\] only operators write control documents"


def refused(db: Any, doc: dict[str, Any], rule: str) -> None:
    with pytest.raises(Forbidden, match=rule):
        db.put(doc)


def test_only_operators_set_controls_and_every_setting_is_kept(files_db, accounts):
    operator = db_as(accounts, "operator", files_db)
    site = "T2_DE_DESY"
    set_control(operator, SITE, site, BAN, "disk full", "operator", 100.0, AS_DESTINATION)
    set_control(operator, SITE, site, DRAIN, "space freed, draining", "operator", 200.0)
    kept = set_control(operator, SITE, site, ALLOW, "", "operator", 300.0)
    stored = operator.get(control_id(SITE, site))
    assert stored["_rev"] == kept["_rev"] and (stored["mode"], stored["by"]) == (ALLOW, "operator")
    assert [(h["mode"], h["direction"], h["reason"], h["at"]) for h in stored["history"]] == [
        (BAN, AS_DESTINATION, "disk full", 100.0),
        (DRAIN, BOTH, "space freed, draining", 200.0),
        (ALLOW, BOTH, "", 300.0),
    ]

    # A user or an agent sets none, new or existing, and deletes none.
    for who in ("alice", "agent"):
        db = db_as(accounts, who, files_db)
        with pytest.raises(Forbidden, match=OPERATOR_ONLY):
            set_control(db, SITE, "T2_CH_CERN", BAN, "mine now", who, 1.0)
        with pytest.raises(Forbidden, match=OPERATOR_ONLY):
            set_control(db, USER, "bob", BAN, "bob out", who, 1.0)
        refused(db, changed(stored, SITE, site, BAN, "mine now", who, 400.0), OPERATOR_ONLY)
        refused(db, {**stored, "type": model.REQUEST_TYPE}, OPERATOR_ONLY)
        refused(db, {"_id": stored["_id"], "_rev": stored["_rev"], "_deleted": True}, r"\[delete\]")
    assert operator.get(control_id(SITE, "T2_CH_CERN")) is None
    assert operator.get(control_id(USER, "bob")) is None
    assert operator.get(control_id(SITE, site)) == stored

    # Nor does an operator rewrite what was set, or set it in another's name.
    now = changed(stored, SITE, site, BAN, "again", "operator", 400.0)
    first, *rest = now["history"]
    user_doc = changed(None, USER, "bob", BAN, "abuse", "operator", 400.0)
    [setting] = user_doc["history"]
    for doc, rule in [
        ({**now, "history": [{**first, "reason": "nothing"}, *rest]}, "history entries cannot"),
        ({**now, "history": rest}, "a change adds one history entry"),
        (changed(stored, SITE, site, BAN, "x", "admin", 400.0), "recorded by its operator"),
        ({**now, "reason": "not in the history"}, "the last history entry is the setting"),
        ({**user_doc, "_id": control_id(USER, "carol")}, "_id must be control:user:bob"),
        ({**user_doc, "mode": DRAIN, "history": [{**setting, "mode": DRAIN}]}, "may not be set"),
        (
            {**user_doc, "direction": AS_SOURCE, "history": [{**setting, "direction": AS_SOURCE}]},
            "a user's control has direction both",
        ),
        ({**user_doc, "colour": "red"}, "doc.colour is not a field"),
    ]:
        refused(operator, doc, rule)
    operator.put(now)  # the well-formed one is taken
    assert operator.get(control_id(SITE, site))["mode"] == BAN


def test_bans_and_drains_hold_back_new_files_and_a_ban_cancels_those_under_way(
    sim_config, accounts, admin
):
    sim = dataclasses.replace(sim_config.sim, mean_duration=30.0)
    config = dataclasses.replace(sim_config, sim=sim)
    operator = accounts["operator"].db(config.store.files_db)
    db = admin.db(config.store.files_db)
    cern, pisa = LINKS[0], LINKS[1]  # both to T2_DE_DESY
    tasks = {user: f"261130_100000:{user}_held" for user in ("alice", "bob")}
    alice = upload(accounts, config, 2, users=("alice",), links=[cern], task=tasks["alice"])
    bob = upload(accounts, config, 2, users=("bob",), links=[pisa], task=tasks["bob"])
    drain = "downtime at 14:00"
    set_control(operator, SITE, "T2_CH_CERN", DRAIN, drain, "operator", 1.0, AS_SOURCE)
    set_control(operator, USER, "bob", BAN, "proxy compromised", "operator", 2.0)
    submitter, monitor = Runner(Submitter(config, "s1")), Runner(Monitor(config, "m1"))
    report = submitter.step(wait=False)
    assert (report["held_back"], report["submitted"]) == (4, 0)
    assert states(db, alice + bob) == Counter(new=4)
    says = {
        "alice": "site T2_CH_CERN drain as source by operator: downtime at 14:00",
        "bob": "user bob ban by operator: proxy compromised",
    }
    assert queries.task_status(db, tasks["alice"]).held_back == {says["alice"]: 2}
    assert queries.task_status(db, tasks["bob"]).held_back == {says["bob"]: 2}
    held = {
        (s.labels["kind"], s.labels["name"], s.labels["mode"]): s.value
        for s in metrics.HELD_BACK.collect()[0].samples
    }
    assert held == {("site", "T2_CH_CERN", "drain"): 2, ("user", "bob", "ban"): 2}

    # Lifted: every file starts.
    set_control(operator, SITE, "T2_CH_CERN", ALLOW, "back", "operator", 3.0)
    set_control(operator, USER, "bob", ALLOW, "new proxy", "operator", 4.0)
    run_until(lambda: states(db, alice + bob) == Counter(submitted=4), [submitter])
    assert queries.task_status(db, tasks["alice"]).held_back == {}

    # Under way: a drain of bob's source lets his copies finish, a ban of alice's cancels hers.
    set_control(operator, SITE, "T2_IT_Pisa", DRAIN, "retiring", "operator", 5.0)
    set_control(operator, SITE, "T2_CH_CERN", BAN, "storage corrupts files", "operator", 6.0)
    run_until(lambda: states(db, alice) == Counter(failed_attempt=2), [monitor], timeout=30)
    assert states(db, bob) == Counter(submitted=2)
    for doc in db.get_many(alice).values():
        attempt = doc["attempts"][-1]
        assert (attempt["outcome"], doc["error_class"]) == ("canceled", "canceled")
        assert doc["failure_reason"] == (
            "cancelled: site T2_CH_CERN ban by operator: storage corrupts files"
        )
    assert {f for job in jobs_of(admin, config) for f in job["cancel"]} == set(alice)


def test_the_site_and_user_commands_set_list_and_refuse(sim_config, accounts, admin, tmp_path):
    """`aso site ...` and `aso user ...` as an operator types them (docs/usage.md), and what
    they refuse: an unknown site, no reason, both directions, a plain user's account."""
    config = dataclasses.replace(sim_config, source=tmp_path / "aso.toml")
    path = write_config(config)
    banned = aso("site", "ban", "T2_DE_DESY", "--destination", "--reason", "disk full", config=path)
    assert banned.returncode == 0, banned.stderr
    assert "site T2_DE_DESY: ban as destination (by admin: disk full)" in banned.stdout
    assert aso("site", "drain", "T2_DE_DESY", "-r", "moving", config=path).returncode == 0
    assert aso("site", "allow", "T2_DE_DESY", config=path).returncode == 0
    listed = aso("site", "list", "--history", config=path)
    rows = [line.split("\t") for line in listed.stdout.splitlines()[1:]]
    assert [(r[0], r[1], r[2], r[4], r[5]) for r in rows] == [
        ("T2_DE_DESY", "ban", "destination", "admin", "disk full"),
        ("T2_DE_DESY", "drain", "both", "admin", "moving"),
        ("T2_DE_DESY", "allow", "both", "admin", ""),
    ]
    assert aso("user", "ban", "bob", "--reason", "abuse", config=path).returncode == 0
    [user] = json.loads(aso("user", "list", "--json", config=path).stdout)
    assert (user["name"], user["mode"], user["reason"]) == ("bob", "ban", "abuse")
    assert aso("user", "allow", "bob", config=path).returncode == 0
    assert "bob\tallow" in aso("user", "list", config=path).stdout

    for args, message in [
        (("site", "ban", "T2_XX_Nowhere", "-r", "x"), "is not a site of the catalogue"),
        (("site", "ban", "T2_DE_DESY"), "--reason is required"),
        (("site", "drain", "T2_DE_DESY", "-r", "x", "--source", "--destination"), "together"),
        (("user", "ban", "bob/x", "-r", "x"), "'bob/x' is not a user name"),
    ]:
        result = aso(*args, config=path)
        assert result.returncode == 2 and message in one_line_error(result), result.stderr

    # A plain user's account: the store refuses the write.
    as_alice = dataclasses.replace(
        config,
        source=tmp_path / "alice.toml",
        store=dataclasses.replace(config.store, user="alice", password=PASSWORD),
    )
    mine = aso("site", "ban", "T2_DE_DESY", "-r", "mine", config=write_config(as_alice))
    assert mine.returncode == 1 and "only operators write control documents" in one_line_error(mine)
    assert admin.db(config.store.files_db).get(control_id(SITE, "T2_DE_DESY"))["mode"] == ALLOW
