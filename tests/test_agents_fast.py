"""The agents' cycles on the in-memory store (tests/memstore.py), which judges every write with
the store's own validate_doc_update.js and builds views with its own map functions: the fast
tier's run of scenarios of the real-store suites. The scenarios are those suites' own test
functions, imported here: this module's fixtures (`accounts`, `admin`, `sim_config`,
`pub_config`) stand in for tests/conftest.py's real store, so the same assertions hold on both
tiers. Then the proof that the double runs the real JavaScript and not a copy of its rules."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from aso import model
from aso.agents.retry_manager import RetryManager
from aso.config import Config
from aso.model import AGENT, STATE, Change
from aso.provision import designdocs
from aso.runtime import Runner
from aso.store import Forbidden, Server, Unauthorized
from tests.conftest import ACCOUNT_ROLES, pub_settings, sim_settings
from tests.memstore import MemStore, provision

# The scenarios: each runs here on the double, and in its own module on the real store.
from tests.test_publisher import (  # noqa: F401 (collected here, with this module's fixtures)
    test_a_block_closes_when_the_task_is_over_or_its_oldest_file_waited,
    test_a_cycles_blocks_go_to_the_catalog_together_each_with_its_own_outcome,
    test_a_file_in_another_datasets_block_is_a_real_conflict,
    test_a_refusal_that_cannot_heal_is_given_up_at_once,
    test_failed_publications_are_retried_then_given_up_then_reset,
    test_files_another_publisher_put_in_another_block_are_published_there,
    test_full_blocks_go_at_once_and_the_rest_waits,
)
from tests.test_retry import (  # noqa: F401 (test_policy: a fixture the first one takes)
    failed_attempt,
    failed_doc,
    test_a_policy_plugged_in_by_entry_point_drives_the_retry_manager,
    test_default_retry_loop_until_out_of_attempts,
    test_policy,
    test_the_owners_kill_wins_over_a_retry,
)


@pytest.fixture()
def mem() -> MemStore:
    return MemStore()


@pytest.fixture()
def accounts(mem: MemStore) -> dict[str, Server]:
    """The accounts of tests/conftest.py's `accounts`, on the double."""
    servers: dict[str, Server] = {
        name: mem.server(name, roles) for name, roles in ACCOUNT_ROLES.items()
    }
    servers["anonymous"] = mem.server()
    servers["admin"] = mem.admin()
    return servers


@pytest.fixture()
def admin(mem: MemStore) -> Server:
    return mem.admin()


@pytest.fixture()
def sim_config(mem: MemStore, tmp_path: Path) -> Iterator[Config]:
    """tests/conftest.py's sim_config, its databases in the double."""
    config = sim_settings(Config(source=tmp_path / "aso.toml"), tmp_path)
    provision(mem, config)
    yield config


@pytest.fixture()
def pub_config(mem: MemStore, sim_config: Config) -> Config:
    config = pub_settings(sim_config)
    provision(mem, config)  # the catalog of its own
    return config


# -- the double runs the store's own JavaScript --------------------------------------------------
def test_a_forbidden_write_is_refused_with_the_rule_of_the_javascript(sim_config, accounts):
    doc = failed_attempt(sim_config, accounts)
    owner = accounts["alice"].db(sim_config.store.files_db)
    # The owner may not decide a retry: the transition table's rule, as the JavaScript says it.
    retry = model.transition(doc, [Change(STATE, "retry", "alice")], AGENT)  # as alice
    with pytest.raises(Forbidden, match=r"^403 forbidden: \[transition\] only agent may move"):
        owner.put(retry)
    # Another user may not touch it at all; nor may a stranger read the database.
    with pytest.raises(Forbidden):
        accounts["bob"].db(sim_config.store.files_db).put(dict(doc, size=1))
    with pytest.raises(Forbidden):
        accounts["stranger"].db(sim_config.store.files_db).get(doc["_id"])
    assert owner.get(doc["_id"])[STATE] == "failed_attempt"


def test_an_altered_validation_changes_the_verdict(mem, sim_config, accounts, admin):
    """The double judges with the design document it holds, not with rules of its own: the
    same write, refused by the real validate_doc_update.js, is let through once the
    validation is replaced by one that lets everything through, and refused again with the
    altered function's own reason once it refuses everything."""
    doc = failed_attempt(sim_config, accounts)
    files = admin.db(sim_config.store.files_db)
    owner = accounts["alice"].db(sim_config.store.files_db)
    retry = model.transition(doc, [Change(STATE, "retry", "alice")], AGENT)  # as alice
    with pytest.raises(Forbidden):
        owner.put(retry)
    [real] = [d for d in designdocs.design_documents(sim_config) if "validate_doc_update" in d]
    stored = files.get(real["_id"])
    assert stored["validate_doc_update"] == real["validate_doc_update"]
    lenient = dict(stored, validate_doc_update="function (newDoc, oldDoc, userCtx) {}")
    lenient["_rev"] = files.put(lenient)
    retry["_rev"] = owner.put(retry)
    assert owner.get(doc["_id"])[STATE] == "retry"
    strict = copy.deepcopy(lenient)
    strict["validate_doc_update"] = (
        "function (newDoc) { throw({forbidden: '[altered] no write today'}); }"
    )
    strict["_rev"] = files.put(strict)
    with pytest.raises(Forbidden, match=r"\[altered\] no write today"):
        owner.put(dict(retry, size=7))
    # Design documents are the admin's alone, as on the stores (401).
    with pytest.raises(Unauthorized, match="not a db or server admin"):
        accounts["agent"].db(sim_config.store.files_db).put(lenient | {"_rev": strict["_rev"]})


def test_the_retry_manager_decides_each_failed_attempt_in_one_cycle(sim_config, accounts):
    """A cycle over a work set read from the real queue view: out of attempts → failed, a
    retryable error → retry with its cool-off's end, as the policy decides."""
    config = dataclasses.replace(
        sim_config,
        retry=dataclasses.replace(sim_config.retry, max_attempts=2, base_delay=30, jitter=0),
    )
    agent = accounts["agent"].db(config.store.files_db)
    once, twice = failed_attempt(config, accounts), failed_attempt(config, accounts)
    for doc, attempts in ((once, 1), (twice, 2)):
        failed = failed_doc("connection", attempts)
        doc.update({k: failed[k] for k in ("attempts", "error_class", "failure_reason")})
        doc["_rev"] = agent.put(doc)
    runner = Runner(RetryManager(config, "r1", server=accounts["agent"]))
    runner.workset.start()
    report = runner.step(wait=False)
    assert report["retry"] == 1 and report["failed"] == 1 and report["work"] == 2
    retried, failed = agent.get(once["_id"]), agent.get(twice["_id"])
    assert retried[STATE] == "retry" and failed[STATE] == "failed"
    entry = retried["history"][-1]
    assert entry["by"] == "r1" and entry["until"] == pytest.approx(entry["at"] + 30)
    assert retried["retry_after"] == entry["until"]
    assert failed["failure_reason"].startswith("out of attempts (2 of 2)")
    assert runner.step(wait=False)["work"] == 0  # neither is the retry manager's work now
