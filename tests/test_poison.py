"""No single document stops an agent (issue 18, finding 7): a request naming a site the
submitter's catalogue lacked made it exit, be restarted, take the file again at each lease
expiry and exit again, and held up the files of the same cycle for minutes.

An agent that fails on one document sets it aside (a terminal or parked state, the reason in the
document, counted in `aso_documents_set_aside_total`) and goes on with the rest; a cycle that
fails as a whole is logged, counted and tried again, never the end of the process. The errors
here are real (a site the agent does not know) or an agent's function made to fail on one
document, as a bug would."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest
from prometheus_client import REGISTRY

import aso.agents.monitor
import aso.agents.retry_manager
import aso.deleter
from aso import model
from aso.agents.cleaner import Cleaner
from aso.agents.monitor import Monitor
from aso.agents.publisher import Publisher
from aso.agents.retry_manager import RetryManager
from aso.agents.submitter import Submitter
from aso.catalog.base import Catalog
from aso.config import SiteConfig
from aso.model import AGENT, CLEANUP, PUBLICATION, STATE, Change
from aso.provision.designdocs import design_documents
from aso.runtime import Agent, Cycle, Runner
from aso.store import admin as store_admin
from aso.transfer import errors
from tests.conftest import sample_request
from tests.pipeline_helpers import owner_db, run_until, states
from tests.test_publisher import done_outputs, run_publisher, states_of

FINAL = ("done", "failed")


def set_aside(agent: str) -> float:
    return REGISTRY.get_sample_value("aso_documents_set_aside_total", {"agent": agent}) or 0.0


def document_errors(agent: str) -> float:
    return REGISTRY.get_sample_value("aso_document_errors_total", {"agent": agent}) or 0.0


def failing_on(doc_id: str, function: Any) -> Any:
    """`function`, but raising on the document `doc_id` as a bug of the agent's would."""

    def flaky(doc: Any, *args: Any, **kwargs: Any) -> Any:
        if doc["_id"] == doc_id:
            raise KeyError("a field the code did not expect to miss")
        return function(doc, *args, **kwargs)

    return flaky


def uploaded(config, accounts, n: int, **kw: Any) -> list[dict[str, Any]]:
    docs = [sample_request("alice", **kw) for _ in range(n)]
    results = owner_db(accounts, config).bulk_write(docs)
    assert all(r.ok for r in results)
    return [dict(doc, _rev=r.rev) for doc, r in zip(docs, results, strict=True)]


def test_a_site_the_submitter_does_not_know_sets_the_file_aside(sim_config, accounts, admin):
    """The store knows a site this host's catalogue lacks (another host's configuration is
    ahead, or `aso db init` ran with another file): the submitter sets the file aside
    (`failed_attempt`, class unprocessable, the reason naming the site), submits the files of
    the same cycle, and the retry manager makes the file `failed` for the user to see."""
    here = dataclasses.replace(
        sim_config, transfer=dataclasses.replace(sim_config.transfer, backend="gfal")
    )
    elsewhere = dataclasses.replace(
        here,
        sites={**here.sites, "T2_XX_Nowhere": SiteConfig(http_url="https://127.0.0.1:1")},
    )
    db = admin.db(here.store.files_db)
    for ddoc in design_documents(elsewhere):  # the store knows T2_XX_Nowhere, this host not
        store_admin.push_design(db, ddoc)
    innocent = uploaded(here, accounts, 3)
    [poison] = uploaded(here, accounts, 1, destination="T2_XX_Nowhere")
    before = set_aside("submitter")
    submitter = Runner(Submitter(here, "s1"))
    submitter.workset.start()
    submitter.step(wait=False)
    # In the first cycle the innocent files went to the transfer service; the poisoned one is
    # left `new` for the next cycles (agents.set_aside_after: 3 errors in a row)...
    assert states(db, [d["_id"] for d in innocent]) == Counter(submitted=3)
    assert db.get(poison["_id"])[STATE] == "new" and set_aside("submitter") == before
    # ...then set aside.
    run_until(lambda: db.get(poison["_id"])[STATE] == "failed_attempt", [submitter], 30)
    stored = db.get(poison["_id"])
    assert stored["error_class"] == errors.UNPROCESSABLE
    assert "submitter could not act on this request (SiteError" in stored["failure_reason"]
    assert "unknown site 'T2_XX_Nowhere'" in stored["failure_reason"]
    assert set_aside("submitter") == before + 1
    retry = Runner(RetryManager(here, "r1"))
    run_until(lambda: db.get(poison["_id"])[STATE] == "failed", [retry], 30)
    stored = db.get(poison["_id"])
    assert stored["failure_reason"].startswith("permanent error (unprocessable): ")
    assert [h["to"] for h in stored["history"]] == [
        "new",
        "failed_attempt",  # set aside before any job was made of it
        "failed",
    ]


def test_a_monitor_failing_on_one_file_sets_it_aside(sim_config, accounts, admin, monkeypatch):
    docs = uploaded(sim_config, accounts, 6)
    poison = docs[0]["_id"]
    monkeypatch.setattr(
        aso.agents.monitor, "outcome", failing_on(poison, aso.agents.monitor.outcome)
    )
    before, errors_before = set_aside("monitor"), document_errors("monitor")
    db = admin.db(sim_config.store.files_db)
    ids = [d["_id"] for d in docs]
    runners = [
        Runner(Submitter(sim_config, "s1")),
        Runner(Monitor(sim_config, "m1")),
        Runner(RetryManager(sim_config, "r1")),
    ]
    run_until(lambda: sum(states(db, ids)[s] for s in FINAL) == 6, runners, 60)
    assert states(db, ids) == Counter(done=5, failed=1)
    stored = db.get(poison)
    assert stored[STATE] == "failed" and stored["error_class"] == errors.UNPROCESSABLE
    assert "monitor could not act on this request (KeyError" in stored["attempts"][-1]["reason"]
    assert set_aside("monitor") == before + 1
    # The errors before it was set aside were each counted (set_aside_after - 1 of them).
    assert document_errors("monitor") == errors_before + sim_config.agents.set_aside_after - 1


def test_a_retry_policy_failing_on_one_file_gives_it_up(sim_config, accounts, admin, monkeypatch):
    docs = uploaded(sim_config, accounts, 4)
    agent_db = accounts["agent"].db(sim_config.store.files_db)
    for doc in docs:  # four failed attempts, waiting for the retry manager's decision
        for to in ("submitted", "failed_attempt"):
            doc.update(model.transition(doc, [Change(STATE, to, "t", "boom")], AGENT))
            doc["_rev"] = agent_db.put(doc)
    poison = docs[0]["_id"]
    decided = failing_on(poison, aso.agents.retry_manager.decided)
    monkeypatch.setattr(aso.agents.retry_manager, "decided", decided)
    before = set_aside("retry-manager")
    runner = Runner(RetryManager(sim_config, "r1"))
    ids = [d["_id"] for d in docs]
    run_until(lambda: "failed_attempt" not in states(agent_db, ids), [runner], 30)
    assert states(agent_db, ids) == Counter(retry=3, failed=1)
    assert "retry-manager could not act on this request" in agent_db.get(poison)["failure_reason"]
    assert set_aside("retry-manager") == before + 1


def test_a_cleaner_failing_on_one_file_parks_it_with_the_reason(
    sim_config, accounts, admin, monkeypatch
):
    docs = uploaded(sim_config, accounts, 3)
    agent_db = accounts["agent"].db(sim_config.store.files_db)
    for doc in docs:
        for to in ("submitted", "done"):
            doc.update(model.transition(doc, [Change(STATE, to, "t")], AGENT))
            doc["_rev"] = agent_db.put(doc)
    poison = docs[0]["_id"]
    monkeypatch.setattr(aso.deleter, "clean_one", lambda config, files, doc, *_: (
        failing_on(poison, lambda d: aso.deleter.Outcome(True, "deleted"))(doc)))  # fmt: skip
    cleaner = Cleaner(sim_config, "c1")
    runner = Runner(cleaner)
    ids = [d["_id"] for d in docs]
    try:
        run_until(
            lambda: (
                Counter(d[CLEANUP] for d in agent_db.get_many(ids).values())
                == Counter(cleaned=2, cleanup_error=1)
            ),
            [runner],
            30,
        )
    finally:
        cleaner.close()
    stored = agent_db.get(poison)
    assert "cleaner could not act on this request (KeyError" in stored["cleanup_error"]
    assert stored["cleanup_retry_after"] > time.time()  # tried again after the backoff


class BuggyCatalog(Catalog):
    """A catalog client with a bug: anything but a CatalogError (its publish_blocks is the
    base's, a block at a time)."""

    name = "buggy"

    def publish_block(self, block: Any) -> bool:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    def block_files(self, name: str) -> list[str] | None:
        return None

    def dataset_files(self, dataset: str) -> dict[str, list[str]]:
        return {}


class BuggyBatchCatalog(BuggyCatalog):
    """A catalog whose batch call itself has the bug: every block of the call gets it."""

    def publish_blocks(self, blocks: Any) -> list[bool | Exception]:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")


@pytest.mark.parametrize("catalog", [BuggyCatalog, BuggyBatchCatalog], ids=["block", "call"])
def test_a_publisher_failing_on_a_block_records_a_publication_error(pub_config, accounts, catalog):
    docs = done_outputs(pub_config, accounts, 4)
    before = set_aside("publisher")
    run_publisher(pub_config, accounts, Publisher(pub_config, "p1", catalog=catalog()))
    assert states_of(pub_config, accounts, docs) == {"publication_error": 4}
    stored = accounts["agent"].db(pub_config.store.files_db).get(docs[0]["_id"])
    assert stored[PUBLICATION] == "publication_error"
    assert "publisher could not act on this request (TypeError" in stored["publication_error"]
    assert set_aside("publisher") == before + 1


class BrokenAgent(Agent):
    """An agent whose cycle always fails, as a bug outside any one document would."""

    name = "broken"

    def __init__(self, config: Any) -> None:
        super().__init__(config, "b1")
        self.calls = 0

    def cycle(self, ctx: Cycle) -> None:
        self.calls += 1
        raise ZeroDivisionError("division by zero")


def test_a_cycle_that_fails_is_retried_and_never_ends_the_agent(sim_config):
    config = dataclasses.replace(
        sim_config, agents=dataclasses.replace(sim_config.agents, poll_interval=0.05)
    )
    agent = BrokenAgent(config)
    runner = Runner(agent)
    ended: list[BaseException | None] = []

    def run() -> None:
        try:
            runner.run()
            ended.append(None)
        except BaseException as exc:  # what would have ended the process
            ended.append(exc)

    before = REGISTRY.get_sample_value("aso_agent_cycle_errors_total", {"agent": "broken"}) or 0
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while agent.calls < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    runner.stop_event.set()
    thread.join(30)
    assert not thread.is_alive() and ended == [None]  # stopped when asked, not by the error
    assert agent.calls >= 3
    errors_counted = REGISTRY.get_sample_value("aso_agent_cycle_errors_total", {"agent": "broken"})
    assert errors_counted is not None and errors_counted - before == agent.calls
    beat = agent.db.get(model.heartbeat_id("broken", "b1"))
    assert beat["totals"]["cycle_errors"] >= 2 and beat["stopped"]


def test_an_error_that_passes_sets_nothing_aside(sim_config, accounts, admin, monkeypatch):
    """An error of the monitor's on a file that does not come back (a back end that
    hiccuped): the file is asked about again next poll and ends as its transfer did."""
    docs = uploaded(sim_config, accounts, 3)
    flaky, real = docs[0]["_id"], aso.agents.monitor.outcome
    calls: Counter[str] = Counter()

    def once(doc: Any, *args: Any, **kwargs: Any) -> Any:
        calls[doc["_id"]] += 1
        if doc["_id"] == flaky and calls[flaky] == 1:
            raise ConnectionResetError("the answer was cut")
        return real(doc, *args, **kwargs)

    monkeypatch.setattr(aso.agents.monitor, "outcome", once)
    before, errors_before = set_aside("monitor"), document_errors("monitor")
    db = admin.db(sim_config.store.files_db)
    ids = [d["_id"] for d in docs]
    runners = [Runner(Submitter(sim_config, "s1")), Runner(Monitor(sim_config, "m1"))]
    run_until(lambda: states(db, ids) == Counter(done=3), runners, 60)
    assert calls[flaky] >= 2 and set_aside("monitor") == before
    assert document_errors("monitor") == errors_before + 1
    assert [h["to"] for h in db.get(flaky)["history"]] == ["new", "submitted", "done", "cleaned"]


def test_each_cycle_gets_its_context_from_the_harness(sim_config, accounts, admin, caplog):
    """The runner hands the agent its instance, its part of the work, the store and the clock
    (no hooks assigned): a cycle run on a clock of the test stamps the documents with it, and
    the runner's work set learns the writes at once, before the feed shows them."""
    docs = uploaded(sim_config, accounts, 2)
    agent_db = accounts["agent"].db(sim_config.store.files_db)
    for doc in docs:  # cooling off, due at 1000.0 on the test's clock
        for to, extra in (
            ("submitted", {}),
            ("failed_attempt", {}),
            ("retry", {"retry_after": 1000.0}),
        ):
            doc.update(model.transition(doc, [Change(STATE, to, "t", "boom")], AGENT, **extra))
            doc["_rev"] = agent_db.put(doc)
    runner = Runner(Submitter(sim_config, "s7"))
    runner.clock = lambda: 999.0  # not due yet
    runner.workset.start()
    assert runner.step(wait=False)["submitted"] == 0
    runner.clock = lambda: 1000.5
    with caplog.at_level(logging.DEBUG, logger="aso"):
        report = runner.step(wait=False)
    assert report["submitted"] == 2 and report["work"] == 2
    # The log: one INFO line for the cycle, with its counts; each file at DEBUG only.
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(info) == 1 and "s7: cycle of" in info[0] and "submitted 2" in info[0], info
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert all(any(doc["_id"] in line for line in debug) for doc in docs)
    assert not any(doc["_id"] in line for line in info for doc in docs)
    for doc in docs:
        stored = agent_db.get(doc["_id"])
        assert stored[STATE] == "submitted" and stored["retry_after"] is None
        assert stored["history"][-1]["at"] == 1000.5 and stored["history"][-1]["by"] == "s7"
        assert stored["lease"]["until"] == 1000.5 + sim_config.transfer.lease
        # Learnt at once: the work set holds the document as written, not as the feed had it.
        assert runner.workset.docs[doc["_id"]]["_rev"] == stored["_rev"]
