"""The in-memory store (tests/memstore.py) against the real store: one scenario (uploads, the
agent's transitions, writes the validation refuses or that conflict, a retry manager's cycle,
a deletion) played on both with the same documents and the same clock, then the documents,
every view of the files database (rows and reductions) and the changes feed compared. What
the fast tier concludes from the double holds as long as this holds."""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any

from aso import model
from aso.agents.retry_manager import RetryManager
from aso.config import Config
from aso.core import request
from aso.model import AGENT, OWNER, STATE, Change
from aso.provision import designdocs
from aso.runtime import Runner
from aso.store import Database, Server
from aso.workqueue import DECIDE, QueueView
from tests.conftest import ACCOUNT_ROLES, sample_request
from tests.memstore import MemStore, provision
from tests.test_retry import failed_doc

REVISION = re.compile(r"^[0-9]+-[0-9a-f]{32}$")


def play(config: Config, accounts: dict[str, Server], docs: list[dict[str, Any]], now: float):
    """The scenario on one store; what each write answered."""
    files = config.store.files_db
    alice, bob, agent = (accounts[who].db(files) for who in ("alice", "bob", "agent"))
    answers = [alice.bulk_write(docs[:3]), bob.bulk_write(docs[3:])]
    stored = alice.get_many(d["_id"] for d in docs)
    first, second, third = (stored[d["_id"]] for d in docs[:3])
    for to in ("submitted", "failed_attempt"):
        first = model.transition(first, [Change(STATE, to, "x")], AGENT, at=now)
        first["_rev"] = agent.put(first)
    failed = failed_doc("connection", 1)
    first.update({k: failed[k] for k in ("attempts", "error_class", "failure_reason")})
    first["_rev"] = agent.put(first)
    second = model.transition(second, [Change(STATE, "submitted", "x")], AGENT, at=now)
    stale = dict(second)
    second["_rev"] = agent.put(second)
    killed = model.transition(third, [Change(STATE, "killed", "alice")], OWNER, at=now)
    answers.append(
        alice.bulk_write(
            [
                stale,  # a stale revision: conflict
                killed,  # the owner's kill: written
                dict(stored[docs[3]["_id"]], size=1),  # bob's request: refused
            ]
        )
    )
    answers.append(agent.bulk_write([dict(first, _rev=stale["_rev"])]))  # a made-up revision
    manager = RetryManager(
        dataclasses.replace(
            config, retry=dataclasses.replace(config.retry, base_delay=30, jitter=0)
        ),
        "r1",
        server=accounts["agent"],
    )
    runner = Runner(manager)
    runner.clock = lambda: now
    manager.cycle(runner.context(QueueView(agent).docs(DECIDE), {}))
    # The killed file's temporary copy discarded (cleaner.failed_grace): it is finished.
    discarded = request.cleaned(agent.get(killed["_id"]), "c1", now, "temporary copy deleted")
    agent.put(discarded)
    for who, doc_id in ((bob, docs[-1]["_id"]), (agent, killed["_id"])):  # refused; written
        gone = who.get(doc_id)
        answers.append(who.bulk_write([{"_id": doc_id, "_rev": gone["_rev"], "_deleted": True}]))
    # A conflict's reason is each store's own (EMBEDDED_VALIDATES_BEFORE_CONFLICT); a
    # refusal's is the JavaScript's.
    return [
        [(r.id, r.ok, r.error, None if r.conflict else r.reason) for r in batch]
        for batch in answers
    ]


def outcome(db: Database, config: Config, ids: list[str]) -> dict[str, Any]:
    """The documents (revisions by number), every view's rows and reductions, the feed."""

    def numbered(value: Any) -> Any:
        """`value` with each revision by its number (the hashes are each store's own)."""
        if isinstance(value, dict):
            return {k: numbered(v) for k, v in value.items()}
        if isinstance(value, list):
            return [numbered(v) for v in value]
        return value.split("-")[0] if isinstance(value, str) and REVISION.match(value) else value

    views = {}
    for ddoc in designdocs.design_documents(config):
        name = ddoc["_id"].removeprefix("_design/")
        for view, functions in ddoc.get("views", {}).items():
            rows = db.view(name, view, reduce=False, include_docs=True).rows
            views[name, view] = [
                (r["id"], r["key"], numbered(r["value"]), numbered(r["doc"]))
                for r in rows
                if r["id"] in ids
            ]
            if "reduce" in functions:
                for level in (1, 2):
                    views[name, view, level] = db.view(name, view, group_level=level).rows
                views[name, view, "all"] = db.view(name, view).rows
    feed = db.changes("0", include_docs=True).results
    return {
        "docs": {i: numbered(d) for i, d in db.get_many(ids).items()},
        "views": views,
        "feed": sorted(
            (c["id"], bool(c.get("deleted")), numbered(c["doc"])) for c in feed if c["id"] in ids
        ),
        "deleted": db.get(ids[2]),
    }


def alike(double: Any, real: Any) -> bool:
    """Equal, but for times a unit or two in the last place apart: the embedded store decodes
    a row's key from its index's text (EMBEDDED_VIEW_KEYS_INEXACT)."""
    if isinstance(double, float) and isinstance(real, float):
        return math.isclose(double, real, rel_tol=1e-15, abs_tol=0.0)
    if isinstance(double, (list, tuple)) and isinstance(real, (list, tuple)):
        return len(double) == len(real) and all(map(alike, double, real))
    if isinstance(double, dict) and isinstance(real, dict):
        return double.keys() == real.keys() and all(alike(double[k], real[k]) for k in real)
    return bool(double == real)


def test_the_in_memory_store_answers_as_the_real_one(sim_config, accounts, tmp_path):
    now = time.time()
    docs = [sample_request("alice") for _ in range(3)] + [sample_request("bob") for _ in range(2)]
    ids = [d["_id"] for d in docs]
    mem = MemStore()
    provision(mem, sim_config)
    doubles = {name: mem.server(name, roles) for name, roles in ACCOUNT_ROLES.items()}
    real_answers = play(sim_config, accounts, docs, now)
    double_answers = play(sim_config, doubles, docs, now)
    assert double_answers == real_answers
    assert [r[1] for batch in real_answers for r in batch] == [
        *[True] * 5,
        False,  # the stale revision
        True,  # the owner's kill
        False,  # another user's request
        False,  # a made-up revision
        False,  # a user's deletion
        True,  # the agent's deletion of a finished request
    ]
    real = outcome(accounts["agent"].db(sim_config.store.files_db), sim_config, ids)
    double = outcome(doubles["agent"].db(sim_config.store.files_db), sim_config, ids)
    assert double["docs"] == real["docs"]
    assert double["feed"] == real["feed"]
    assert double["deleted"] is None is real["deleted"]
    assert double["views"].keys() == real["views"].keys()
    for name in real["views"]:
        assert alike(double["views"][name], real["views"][name]), (
            name,
            double["views"][name],
            real["views"][name],
        )
    states = {d["_id"]: d[STATE] for d in real["docs"].values() if d}
    assert sorted(states.values()) == ["new", "new", "retry", "submitted"]
