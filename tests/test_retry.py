"""The retry manager and its policies: decisions, backoff, the adaptive link penalty, the
plug-in mechanism (with a policy defined here, registered as a real entry point), and the
retry loop over the sim transfer service and the real store."""

from __future__ import annotations

import dataclasses
import random
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from aso import model
from aso.agents.monitor import Monitor
from aso.agents.retry_manager import RetryManager
from aso.agents.submitter import Submitter
from aso.config import Config, RetryConfig
from aso.model import AGENT, OWNER, STATE, Change
from aso.retry import (
    DefaultPolicy,
    LinkAdaptivePolicy,
    PolicyError,
    attempts_since_resubmission,
    load_policy,
)
from aso.runtime import Runner
from aso.store import Server
from tests.conftest import sample_request
from tests.pipeline_helpers import LINKS, owner_db, run_until, states, upload


def failed_doc(error_class: str, attempts: int = 1, **extra: Any) -> dict[str, Any]:
    doc = sample_request("alice")
    doc["attempts"] = [
        {
            "job_id": f"j{i}",
            "service": "sim",
            "submitted": 100.0 + i,
            "ended": 101.0 + i,
            "outcome": "failed",
            "reason": "boom",
            "error_class": error_class,
        }
        for i in range(attempts)
    ]
    doc.update(state="failed_attempt", error_class=error_class, failure_reason="boom", **extra)
    return doc


def test_default_policy_decisions():
    config = RetryConfig(max_attempts=3, base_delay=10, max_delay=30, jitter=0.0)
    policy = DefaultPolicy(config)
    for permanent in ("source_missing", "destination_exists", "permission", "quota"):
        decision = policy.decide(failed_doc(permanent), 0)
        assert not decision.retry and decision.reason.startswith(f"permanent error ({permanent})")
    assert [policy.decide(failed_doc("connection", n), 0).delay for n in (1, 2)] == [10, 20]
    last = policy.decide(failed_doc("timeout", 3), 0)
    assert not last.retry and last.reason.startswith("out of attempts (3 of 3)")
    assert policy.decide(failed_doc("checksum_mismatch", 1), 0).retry
    twice = policy.decide(failed_doc("checksum_mismatch", 2), 0)
    assert not twice.retry and twice.reason == "checksum mismatch in 2 attempts"
    capped = DefaultPolicy(RetryConfig(max_attempts=99, base_delay=10, max_delay=30, jitter=0))
    assert capped.decide(failed_doc("connection", 8), 0).delay == 30


def test_jitter_spreads_cool_offs_within_bounds():
    policy = DefaultPolicy(RetryConfig(base_delay=100, jitter=0.2), rng=random.Random(1))
    delays = [policy.decide(failed_doc("connection"), 0).delay for _ in range(200)]
    assert min(delays) >= 80 and max(delays) <= 120 and len(set(delays)) > 100


def test_attempts_count_since_the_last_resubmission():
    doc = failed_doc("connection", 4)
    doc["history"].append(
        {"axis": "state", "from": "failed", "to": "new", "at": 102.5, "by": "alice"}
    )
    assert [a["job_id"] for a in attempts_since_resubmission(doc)] == ["j3"]
    policy = DefaultPolicy(RetryConfig(max_attempts=2, jitter=0))
    assert policy.decide(doc, 0).retry  # 1 attempt since the resubmission, not 4


def test_adaptive_policy_penalises_a_bad_link():
    config = RetryConfig(
        base_delay=10, jitter=0, min_samples=4, bad_link_ratio=0.5, link_penalty=4, window=1000
    )
    policy = LinkAdaptivePolicy(config)
    bad = {"source": "T2_A_x", "destination": "T2_B_y"}
    for i in range(6):  # 5 failures, 1 success on the bad link; successes elsewhere
        outcome = "done" if i == 0 else "failed"
        policy.observe(
            dict(
                sample_request("alice"),
                **bad,
                attempts=[
                    {
                        "job_id": "j",
                        "service": "sim",
                        "submitted": 1.0,
                        "ended": 500.0 + i,
                        "outcome": outcome,
                    }
                ],
            )
        )
        policy.observe(
            dict(
                sample_request("alice"),
                attempts=[
                    {
                        "job_id": "j",
                        "service": "sim",
                        "submitted": 1.0,
                        "ended": 500.0 + i,
                        "outcome": "done",
                    }
                ],
            )
        )
    on_bad = policy.decide(dict(failed_doc("connection"), **bad), now=600)
    elsewhere = policy.decide(failed_doc("connection"), now=600)
    assert on_bad.delay == 40 and elsewhere.delay == 10
    assert policy.decide(dict(failed_doc("connection"), **bad), now=5000).delay == 10  # window


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(
        PolicyError,
        match=r"'nope' is not an installed retry policy; known: "
        r"adaptive, default",
    ):
        load_policy(RetryConfig(policy="nope"))


TEST_POLICY = '''
    from aso.retry import Decision

    class AlwaysOnce:
        """Retry the first failure after 0.1 s, fail the second: a policy of the test's own."""

        name = "always-once"

        def __init__(self, config):
            self.config = config
            self.observed = 0

        def observe(self, doc):
            self.observed += 1

        def decide(self, doc, now):
            if len(doc.get("attempts", [])) < 2:
                return Decision(True, 0.1, "the test policy retries once")
            return Decision(False, reason="the test policy gives up")
'''


@pytest.fixture()
def test_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Registers `always-once` as a real entry point of a distribution on sys.path."""
    (tmp_path / "aso_test_policy.py").write_text(textwrap.dedent(TEST_POLICY))
    dist = tmp_path / "aso_test_policy-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: aso-test-policy\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[aso.retry_policies]\nalways-once = aso_test_policy:AlwaysOnce\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "always-once"
    sys.modules.pop("aso_test_policy", None)


def test_a_policy_plugged_in_by_entry_point_drives_the_retry_manager(
    sim_config, accounts, admin, test_policy
):
    config = dataclasses.replace(
        sim_config,
        retry=dataclasses.replace(sim_config.retry, policy=test_policy),
        sim=dataclasses.replace(
            sim_config.sim, failure_rate=1.0, failure_classes={"connection": 1.0}
        ),
    )
    assert type(load_policy(config.retry)).__name__ == "AlwaysOnce"
    ids = upload(accounts, config, 2, users=("alice",), links=LINKS[:1])
    db = admin.db(config.store.files_db)
    server = accounts["agent"]
    manager = RetryManager(config, "r1", server=server)
    runners = [
        Runner(Submitter(config, "s1", server=server)),
        Runner(Monitor(config, "m1", server=server)),
        Runner(manager),
    ]
    run_until(lambda: states(db, ids) == Counter(failed=2), runners, timeout=60)
    for doc in db.get_many(ids).values():
        assert [h["to"] for h in doc["history"]] == [
            "new",
            "submitted",
            "failed_attempt",
            "retry",
            "submitted",
            "failed_attempt",
            "failed",
        ]
        assert doc["history"][3]["reason"] == "the test policy retries once"
        # The submitter took the file from `retry` once its cool-off was over: no write back
        # to `new` in between (issue 22); the cool-off's end stays in the retry's entry.
        cooled, resubmitted = doc["history"][3], doc["history"][4]
        assert cooled["until"] == pytest.approx(cooled["at"] + 0.1, abs=0.002)
        assert resubmitted["by"] == "s1" and resubmitted["at"] >= cooled["until"]
        assert doc["retry_after"] is None
        assert doc["failure_reason"] == "the test policy gives up"
        assert len(doc["attempts"]) == 2 and doc["history"][-1]["by"] == "r1"
    assert manager.policy.observed > 0  # it saw the feed


def test_default_retry_loop_until_out_of_attempts(sim_config, accounts, admin):
    config = dataclasses.replace(
        sim_config,
        retry=dataclasses.replace(sim_config.retry, max_attempts=3, base_delay=0.1, jitter=0),
        sim=dataclasses.replace(
            sim_config.sim,
            link_failure_rates={"T2_CH_CERN>T2_DE_DESY": 1.0},
            failure_classes={"timeout": 1.0},
        ),
    )
    ids = upload(accounts, config, 4, users=("alice",), links=LINKS[:2])
    db = admin.db(config.store.files_db)
    server = accounts["agent"]
    runners = [
        Runner(Submitter(config, "s1", server=server)),
        Runner(Monitor(config, "m1", server=server)),
        Runner(RetryManager(config, "r1", server=server)),
    ]
    run_until(lambda: states(db, ids) == Counter(failed=2, done=2), runners, timeout=60)
    for doc in db.get_many(ids).values():
        if doc[STATE] == "failed":
            assert len(doc["attempts"]) == 3
            assert doc["failure_reason"] == "out of attempts (3 of 3); last: timeout"
            retries = [h for h in doc["history"] if h["to"] == "retry"]
            assert len(retries) == 2 and all(h["by"] == "r1" for h in retries)
        else:
            assert doc["source"] == "T2_IT_Pisa" and len(doc["attempts"]) == 1


def failed_attempt(config: Config, accounts: dict[str, Server]) -> dict[str, Any]:
    """A request of alice's, moved by the agent to failed_attempt."""
    owner = owner_db(accounts, config)
    agent_db = accounts["agent"].db(config.store.files_db)
    doc = sample_request("alice")
    doc["_rev"] = owner.create(doc)
    for to in ("submitted", "failed_attempt"):
        doc = model.transition(doc, [Change(STATE, to, "x")], AGENT)
        doc["_rev"] = agent_db.put(doc)
    return doc


def test_the_owners_kill_wins_over_a_retry(sim_config, accounts, admin):
    owner = owner_db(accounts, sim_config)
    agent_db = accounts["agent"].db(sim_config.store.files_db)
    doc = failed_attempt(sim_config, accounts)
    stale = dict(doc)  # what the retry manager read
    owner.put(model.transition(doc, [Change(STATE, "killed", "alice")], OWNER))
    manager = RetryManager(sim_config, "r1", server=accounts["agent"])
    ctx = Runner(manager).context([stale], {})
    manager.cycle(ctx)
    assert ctx.report["conflicts"] == 1 and ctx.report["retry"] == 0
    assert agent_db.get(doc["_id"])[STATE] == "killed"
