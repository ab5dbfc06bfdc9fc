"""The store's rules judged without a store: the files database's validate_doc_update.js and its
views' map functions, as `aso db init` pushes them, run in QuickJS (tests/storejs.py). A tier
that answers in seconds (`make test-fast`); tests/test_validation.py checks the same rules on
the real stores, and that the stores and QuickJS agree.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from aso import model
from aso.model import AGENT, OWNER, STATE
from tests import storejs
from tests.conftest import sample_request
from tests.test_validation import base_for, changed

USER_CTX = {
    OWNER: {"name": "alice", "roles": [model.USER_ROLE]},
    AGENT: {"name": "agent", "roles": [model.AGENT_ROLE]},
    "other user": {"name": "bob", "roles": [model.USER_ROLE]},
}
STORED_REV = "1-" + "0" * 32


def disagreements(design: storejs.DesignDocument, role: str) -> list[tuple[Any, ...]]:
    """Every pair of every axis, moved by `role` on alice's request: where validate_doc_update
    and the model's transition table (model.may_transition) disagree, or a refusal names
    another rule than the one that refuses it (another user's: owner; a role's: transition)."""
    who = USER_CTX[role]
    found = []
    for axis in model.AXES:
        for old, new in itertools.permutations(model.STATES[axis], 2):
            stored = dict(base_for(axis, old), _rev=STORED_REV)
            update = changed(stored, axis, new, who["name"])
            expected = role in (OWNER, AGENT) and model.may_transition(axis, old, new, role)
            try:
                design.validate(update, stored, who)
                verdict = None
            except model.Refusal as refusal:
                verdict = refusal.reason
            rule = "[owner]" if role == "other user" else "[transition]"
            if (verdict is None) != expected or not (verdict or rule).startswith(rule):
                found.append((axis, old, new, verdict))
    return found


@pytest.mark.parametrize("role", [OWNER, AGENT, "other user"])
def test_every_pair_of_every_axis_agrees_with_the_model(role):
    assert disagreements(storejs.files_design(), role) == []


def test_an_owner_creates_their_own_request_and_no_one_else_s():
    doc = sample_request("alice")
    storejs.validate_doc_update(doc, None, USER_CTX[OWNER])
    with pytest.raises(model.Refusal) as refused:
        storejs.validate_doc_update(doc, None, USER_CTX["other user"])
    assert refused.value.reason == '[owner] user "bob" may not write requests of user "alice"'


def test_a_document_without_an_id_is_judged_as_the_stores_judge_a_post():
    """The stores give a POSTed document an id before they validate it (the JavaScript reads
    `_id` as a string): a request without one is refused for its id, not a TypeError (found by
    `make fuzz`)."""
    doc = sample_request("alice")
    expected = doc.pop("_id")
    for who in USER_CTX.values():
        with pytest.raises(model.Refusal) as refused:
            storejs.validate_doc_update(doc, None, who)
        assert refused.value.rule == "schema" and expected in refused.value.message


def test_a_request_naming_a_site_the_catalogue_does_not_have_is_refused():
    doc = sample_request("alice")
    with pytest.raises(model.Refusal) as refused:
        storejs.validate_doc_update(doc, None, USER_CTX[OWNER], sites=["T2_XX_Elsewhere"])
    assert refused.value.rule == "site"


def test_the_views_emit_what_the_agents_read():
    """by_state, the submitter's and the pages' view: a request under its three axes."""
    doc = dict(sample_request("alice"), state="done", cleanup="pending")
    rows = storejs.files_design().map("by_state", doc)
    assert rows == [([doc[STATE], doc["cleanup"], doc["publication"]], None)]
    assert storejs.files_design().map("by_state", {"type": "heartbeat"}) == []


def test_a_file_is_final_in_the_views_as_the_model_says_for_every_state():
    """by_task's `final` and task_states' [task, "final", ...] count say model.has_ended for
    every combination of the three axes: a failed or killed file is final too."""
    design = storejs.files_design()
    for state, cleanup, publication in itertools.product(*model.STATES.values()):
        doc = dict(sample_request("alice"), state=state, cleanup=cleanup, publication=publication)
        [(_, row)] = design.map("by_task", doc)
        ended = model.has_ended(doc)
        assert row["final"] is ended, (state, cleanup, publication)
        assert ([doc["task"], "final", ended], None) in design.map("task_states", doc)


# A change of the rules in validate_doc_update.js that the fast tier must notice: each is a rule
# of the transition table the JavaScript stops enforcing, or enforces differently.
MUTATIONS = {
    "anyone may write anyone's request": (
        "if (role === null) {\n    refuse('owner'",
        "if (false) {\n    refuse('owner'",
    ),
    "a transition the table does not hold": (
        "if (!allowed) {\n      refuse('transition'",
        "if (!allowed) { return; }\n    if (false) {\n      refuse('transition'",
    ),
    "any role may make any legal transition": (
        "if (allowed.indexOf(role) === -1) {",
        "if (false) {",
    ),
    "the axes checked in the other order, the last skipped": (
        "for (k = 0; k < model.axes.length; k++) {\n    axis = model.axes[k];",
        "for (k = 0; k < model.axes.length - 1; k++) {\n    axis = model.axes[k];",
    ),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_changed_rule_is_caught(mutation):
    """The fast tier judges with the JavaScript itself, so a change to validate_doc_update.js
    fails it: each mutation below makes some pair of some axis disagree with the model."""
    before, after = MUTATIONS[mutation]
    ddoc = copy.deepcopy(storejs.files_design().ddoc)
    source = ddoc["validate_doc_update"]
    assert source.count(before) == 1, "the mutation no longer matches the JavaScript"
    ddoc["validate_doc_update"] = source.replace(before, after)
    mutated = storejs.DesignDocument(ddoc)
    assert any(disagreements(mutated, role) for role in USER_CTX), mutation
