"""validate_doc_update, run by the real store: the state machine, the roles and the schema.

Every (from, to) pair of every axis is tried by every role against the store, and the store's
answer must be the Python model's (aso.model.may_transition): the two cannot disagree.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import itertools
import re
import string
import threading
import time
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aso import jsvalues as js
from aso import model, sites
from aso.model import AGENT, CLEANUP, OWNER, PUBLICATION, STATE, Change
from aso.provision import designdocs
from aso.provision.designdocs import init_databases
from aso.provision.storejs import owner_refusal
from aso.sites import simulated
from aso.store import (
    Conflict,
    Database,
    Forbidden,
    Server,
    StoreError,
    Unauthorized,
    refused_as_conflict,
)
from aso.store import admin as store_admin
from aso.upload import upload
from tests import storejs
from tests.conftest import ACCOUNT_ROLES, PASSWORD, db_as, sample_request

ROLE_ACCOUNT = {OWNER: "alice", AGENT: "agent", "other user": "bob"}


def base_for(axis: str, value: str) -> dict[str, Any]:
    """A request (owned by alice) with `axis` at `value`; other axes where `value` is reachable."""
    doc = sample_request(
        "alice", publish=True, publish_info={"dataset": "/prim/alice-proc-v1/USER"}
    )
    if axis == STATE:
        doc[STATE] = value
    else:
        doc[STATE] = "done"
        doc[axis] = value
    return doc


def changed(doc: dict[str, Any], axis: str, to: str, by: str) -> dict[str, Any]:
    """`doc` with one change applied and recorded, whatever the model thinks of it."""
    return model.transition(doc, [Change(axis, to, by)], model.ADMIN)


def write_all(db: Database, docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {r.id: r for r in db.bulk_write(docs)}


@pytest.mark.parametrize("role", [OWNER, AGENT, "other user"])
def test_every_pair_of_every_axis_agrees_with_the_model(files_db, accounts, role):
    admin_db = db_as(accounts, "admin", files_db)
    user_db = db_as(accounts, ROLE_ACCOUNT[role], files_db)
    cases = []
    for axis in model.AXES:
        for old, new in itertools.permutations(model.STATES[axis], 2):
            cases.append((axis, old, new, base_for(axis, old)))
    setup = admin_db.bulk_write([doc for _, _, _, doc in cases])
    assert all(r.ok for r in setup), [r for r in setup if not r.ok][:3]
    updates = []
    for (axis, _old, new, doc), result in zip(cases, setup, strict=True):
        doc["_rev"] = result.rev
        updates.append(changed(doc, axis, new, ROLE_ACCOUNT[role]))
    results = write_all(user_db, updates)

    disagreements = []
    for axis, old, new, doc in cases:
        expected = role in (OWNER, AGENT) and model.may_transition(axis, old, new, role)
        result = results[doc["_id"]]
        if result.ok != expected:
            disagreements.append((axis, old, new, result.error, result.reason))
        if not result.ok:
            assert result.error == "forbidden", (axis, old, new, result)
            rule = "[owner]" if role == "other user" else "[transition]"
            assert result.reason.startswith(rule), (axis, old, new, result.reason)
    assert disagreements == []
    # Sanity: the table is not empty for the role, so the test above exercised acceptances.
    accepted = [r for r in results.values() if r.ok]
    assert len(accepted) == (
        0
        if role == "other user"
        else sum(role in roles for t in model.TRANSITIONS.values() for roles in t.values())
    )


def test_admin_may_make_any_change(files_db, accounts):
    admin_db = db_as(accounts, "operator", files_db)
    doc = base_for(STATE, "failed")
    doc["_rev"] = admin_db.create(doc)
    update = changed(doc, STATE, "submitted", "operator")
    assert admin_db.put(update)


@pytest.mark.parametrize(
    ("axis", "state", "when"),
    [
        (CLEANUP, "submitted", "done or failed or killed"),
        (PUBLICATION, "submitted", "done"),
        (PUBLICATION, "failed", "done"),
    ],
)
def test_cleanup_and_publication_only_move_once_the_copy_is_over(
    files_db, accounts, axis, state, when
):
    """A copy's publication once it is done; its temporary copy's cleanup once it is done, or
    given up (failed, killed: the cleaner discards it after `cleaner.failed_grace`)."""
    admin_db = db_as(accounts, "admin", files_db)
    doc = base_for(axis, "pending")
    doc[STATE] = state
    doc["_rev"] = admin_db.create(doc)
    target = "cleaned" if axis == CLEANUP else "published"
    with pytest.raises(Forbidden) as err:
        db_as(accounts, "agent", files_db).put(changed(doc, axis, target, "agent"))
    assert err.value.reason == f"[transition] {axis} may only change while state is {when}"


def test_a_legal_chain_from_upload_to_published(files_db, accounts):
    """One request through its whole life, each step made by the role that owns it."""
    owner = db_as(accounts, "alice", files_db)
    agent = db_as(accounts, "agent", files_db)
    doc = sample_request(
        "alice", publish=True, publish_info={"dataset": "/prim/alice-proc-v1/USER"}
    )
    doc["_rev"] = owner.create(doc)
    steps = [
        (STATE, "submitted"),
        (STATE, "failed_attempt"),
        (STATE, "retry"),
        (STATE, "new"),
        (STATE, "submitted"),
        (STATE, "done"),
        (CLEANUP, "cleaned"),
        (PUBLICATION, "published"),
    ]
    for axis, to in steps:
        doc = model.transition(doc, [Change(axis, to, "agent-1")], AGENT)
        doc["_rev"] = agent.put(doc)
    stored = agent.get(doc["_id"])
    assert (stored[STATE], stored[CLEANUP], stored[PUBLICATION]) == ("done", "cleaned", "published")
    assert [(h["axis"], h["to"]) for h in stored["history"][1:]] == steps
    assert model.is_final(stored)


# --- creation --------------------------------------------------------------------------------
def test_owner_creates_and_duplicate_create_is_a_clear_conflict(files_db, accounts):
    owner = db_as(accounts, "alice", files_db)
    doc = sample_request("alice")
    owner.create(doc)
    again = dict(doc, size=doc["size"] + 1)
    with pytest.raises(Conflict) as err:
        owner.create(again)
    assert err.value.status == 409
    assert owner.get(doc["_id"])["size"] == doc["size"]  # nothing lost, nothing overwritten


def test_a_file_already_at_its_destination_is_created_done(files_db, accounts):
    owner = db_as(accounts, "alice", files_db)
    doc = sample_request("alice", already_at_destination=True)
    owner.create(doc)
    stored = owner.get(doc["_id"])
    assert (stored[STATE], stored[CLEANUP]) == ("done", "not_needed")


def _token() -> str:
    return uuid.uuid4().hex[:12]


NAMESPACE_ATTACKS = [
    ("alice", "a destination in bob's area",
     lambda d: d.update(destination_lfn=f"/store/user/bob/x/{_token()}.root"),
     "destination_lfn must be in /store/user/alice/ (a group area"),
    ("alice", "bob's temporary output as the source",
     lambda d: d.update(source_lfn=f"/store/temp/user/bob.abc/x/{_token()}.root"),
     "source_lfn must be in /store/temp/user/alice/ or /store/temp/user/alice.<hash>/"),
    ("alice", "a temporary area whose name starts with alice's",
     lambda d: d.update(source_lfn=f"/store/temp/user/alicex/{_token()}.root"),
     "source_lfn must be in /store/temp/user/alice/"),
    ("alice", "a source outside any temporary area",
     lambda d: d.update(source_lfn=f"/store/user/alice/precious/{_token()}.root"),
     "source_lfn must be in /store/temp/user/alice/"),
    ("alice", "bob's dataset",
     lambda d: d.update(publish=True, publish_info={"dataset": "/prim/bob-proc-v1/USER"}),
     "publish_info.dataset must be /<primary>/alice-<processed>/USER"),
    ("alice", "a group area without a grant",
     lambda d: d.update(destination_lfn=f"/store/group/higgs/{_token()}.root"),
     "destination_lfn must be in /store/user/alice/ (a group area /store/group/<group>/ "
     "needs the role group:<group>)"),
    ("hugo", "another group's area",
     lambda d: d.update(destination_lfn=f"/store/group/top/{_token()}.root"),
     "destination_lfn must be in /store/user/hugo/ or /store/group/<group>/ of higgs"),
]  # fmt: skip


@pytest.mark.parametrize(("who", "case", "edit", "reason"), NAMESPACE_ATTACKS,
                         ids=[c[1] for c in NAMESPACE_ATTACKS])  # fmt: skip
def test_a_user_stays_in_their_own_namespace(files_db, accounts, who, case, edit, reason):
    """Issue 18, finding 6: alice had written into bob's area, taken bob's not yet recorded
    temporary output as her source (the cleaner then deleted it) and put her file in bob's
    dataset. CMS's namespaces are the store's rule (namespaceRefusal), as the model
    says."""
    owner = db_as(accounts, who, files_db)
    doc = sample_request(who)
    edit(doc)
    doc["_id"] = model.request_id(doc["source_lfn"])
    with pytest.raises(Forbidden) as refused:
        owner.create(doc)
    assert f"[namespace] {reason}" in str(refused.value), refused.value
    with pytest.raises(model.Refusal, match=re.escape(reason)):
        storejs.validate_doc_update(doc, None, {"name": who, "roles": ACCOUNT_ROLES[who]})
    assert owner.get(doc["_id"]) is None


def test_a_granted_group_area_and_a_hashed_temporary_area_are_the_user_s(files_db, accounts):
    """What the conventions allow: /store/temp/user/<name>.<hash>/ as the source, a group area
    and its datasets with the grant (role group:<group>, from the grid-mapfile)."""
    hugo = db_as(accounts, "hugo", files_db)
    doc = sample_request(
        "hugo",
        source_lfn=f"/store/temp/user/hugo.1f2e3d/higgs/{_token()}.root",
        destination_lfn=f"/store/group/higgs/hugo/{_token()}.root",
        publish=True,
        publish_info={"dataset": "/Higgs/higgs-skim-v1/USER"},
    )
    hugo.create(doc)
    assert hugo.get(doc["_id"])["destination_lfn"].startswith("/store/group/higgs/")


@pytest.mark.parametrize("end", ["source", "destination"])
def test_a_request_naming_an_unknown_site_is_refused_at_upload(
    files_db, store_config, accounts, end
):
    """Issue 18, finding 7: an upload naming T2_XX_Nowhere was accepted, and the submitter then
    exited on it at each lease expiry. The store knows the site catalogue (the design document's
    lib/sites, written by `aso db init`) and refuses the request with the names it knows."""
    known = designdocs.known_sites(store_config)
    assert {"T2_CH_CERN", "T2_DE_DESY", "T2_IT_Pisa"} <= set(known) and "T2_XX_Nowhere" not in known
    owner = db_as(accounts, "alice", files_db)
    doc = sample_request("alice", **{end: "T2_XX_Nowhere"})
    reason = f'{end} "T2_XX_Nowhere" is not a site of this ASO (its sites: {", ".join(known)})'
    with pytest.raises(Forbidden) as refused:
        owner.create(doc)
    assert f"[site] {reason}" in str(refused.value), refused.value
    user = {"name": "alice", "roles": [model.USER_ROLE]}
    with pytest.raises(model.Refusal, match=re.escape(reason)):
        storejs.validate_doc_update(doc, None, user, designdocs.known_sites(store_config))
    assert owner.get(doc["_id"]) is None
    owner.create(sample_request("alice"))  # the catalogue's sites are accepted


def test_the_simulator_s_sites_are_the_sites_its_store_knows(admin, store_config, accounts):
    """The simulator's catalogue is simulated sites (protocol sim, no endpoint): its store
    knows those and refuses the rest, as a production store does."""
    name = f"sim_sites_{uuid.uuid4().hex[:8]}"
    config = dataclasses.replace(
        store_config,
        store=dataclasses.replace(store_config.store, files_db=name),
        transfer=dataclasses.replace(store_config.transfer, backend="sim"),
        sites=simulated(["T2_SM_Site000", "T2_SM_Site001"]),
    )
    init_databases(admin, config)
    alice = db_as(accounts, "alice", name)
    try:
        doc = sample_request("alice", source="T2_SM_Site000", destination="T2_SM_Site001")
        alice.create(doc)
        assert alice.get(doc["_id"])["source"] == "T2_SM_Site000"
        assert sites.pfn(config, "T2_SM_Site000", doc["source_lfn"]) == (
            f"sim://T2_SM_Site000{doc['source_lfn']}"
        )
        with pytest.raises(Forbidden, match=r'\[site\] destination "T2_DE_DESY" is not a site'):
            alice.create(sample_request("alice", source="T2_SM_Site000"))
    finally:
        store_admin.delete_db(admin, name)


BORN_FINISHED = [
    ("done", "cleaned", "pending", "a request created done has cleanup not_needed, not cleaned"),
    ("done", "not_needed", "published", "has publication pending or not_required, not published"),
    ("done", "not_needed", "publication_error", "not publication_error"),
    ("new", "not_needed", "pending", "a request created new has cleanup pending, not not_needed"),
    ("new", "pending", "publication_failed", "not publication_failed"),
    ("failed", "pending", "pending", "a request is created with state done or new, not failed"),
]


@pytest.mark.parametrize(("state", "cleanup", "publication", "reason"), BORN_FINISHED)
def test_a_request_cannot_be_born_finished(files_db, accounts, state, cleanup, publication, reason):
    """Issue 18, finding 5: a user had created requests already `done`/`cleaned` or
    `done`/`not_needed`/`published`, and the publisher published a block for a file that exists
    nowhere. The store refuses each (model.CREATION) as the model does."""
    owner = db_as(accounts, "alice", files_db)
    doc = sample_request("alice", publish=True, publish_info={"dataset": "/p/alice-q-v1/USER"})
    doc.update({STATE: state, CLEANUP: cleanup, PUBLICATION: publication})
    doc["history"] = [dict(doc["history"][0], to=state)]
    with pytest.raises(Forbidden) as refused:
        owner.create(doc)
    assert reason in str(refused.value), refused.value
    with pytest.raises(model.Refusal, match=reason):
        storejs.validate_doc_update(doc, None, {"name": "alice", "roles": [model.USER_ROLE]})
    assert owner.get(doc["_id"]) is None


@pytest.mark.parametrize(
    ("who", "edit", "status", "reason"),
    [
        (
            "alice",
            lambda d: d.update(state="submitted", history=[dict(d["history"][0], to="submitted")]),
            403,
            "[create] a request is created with state done or new, not submitted",
        ),
        ("agent", lambda d: None, 403, "[create] only the owner (or an admin) may create"),
        ("bob", lambda d: None, 403, '[owner] user "bob" may not write requests of user "alice"'),
        (
            "alice",
            lambda d: d["history"][0].update(by="mallory"),
            403,
            "[history] history entries of an owner must be by alice",
        ),
        (
            "alice",
            lambda d: d["history"].append(dict(d["history"][0])),
            403,
            "[history] a new request has exactly one history entry",
        ),
        ("alice", lambda d: d.update(_id="not-the-hash"), 403, "[schema] doc._id must be"),
        ("stranger", lambda d: None, None, None),
        ("anonymous", lambda d: None, None, None),
    ],
)
def test_creation_rules(files_db, accounts, who, edit, status, reason):
    doc = sample_request("alice")
    edit(doc)
    with pytest.raises((Forbidden, Unauthorized)) as err:
        db_as(accounts, who, files_db).create(doc)
    if status is None:  # not a member of the database: refused before validation
        assert err.value.status in (401, 403)
    else:
        assert err.value.status == status
        assert err.value.reason.startswith(reason), err.value.reason
    assert db_as(accounts, "admin", files_db).get(doc["_id"]) is None


# --- what an owner records -------------------------------------------------------------------
def refused_alike(
    db: Database, doc: dict[str, Any], old: dict[str, Any] | None, who: str, reason: str
) -> None:
    """The store refuses `doc` (a creation when `old` is None, else an update of `old`) with
    `reason`, the same JavaScript run in QuickJS (tests/storejs.py) with the same, and the
    store keeps what it had."""
    with pytest.raises(Forbidden) as refused:
        db.create(doc) if old is None else db.put(doc)
    assert refused.value.reason == reason
    with pytest.raises(model.Refusal) as judged:
        storejs.validate_doc_update(doc, old, {"name": who, "roles": [model.USER_ROLE]})
    assert judged.value.reason == reason
    kept = db.get(doc["_id"])
    assert (kept is None) if old is None else (kept is not None and own(kept) == own(old))


def born(state: str, **fields: Any) -> dict[str, Any]:
    """A new request of alice's, created `state` (new, or done: already at its destination)."""
    return sample_request("alice", already_at_destination=state == "done", **fields)


# What the red team forged at creation: each field an agent writes, as an agent would.
AGENTS_BOOKKEEPING = {
    "lease": {"owner": "submitter-x", "until": 9e9, "job_key": "k"},
    "transfer": {"job_id": "bobs-job", "service": "gfal", "file_id": "f"},
    "attempts": [{"job_id": "bobs-job", "service": "gfal", "submitted": 1.0, "ended": 2.0,
                  "outcome": "failed", "reason": "no", "error_class": "permanent"}],
    "retry_after": 9e9,
    "failure_reason": "failed for good",
    "error_class": "permanent",
    "cleanup_attempts": 3,
    "cleanup_retry_after": 9e9,
    "cleanup_error": "storage down",
    "discarding": 9e9,
    "publication_block": "/P/bob-x-v1/USER#b",
    "publication_attempts": 3,
    "publication_retry_after": 9e9,
    "publication_error": "catalog down",
}  # fmt: skip


PUBLISHED = {"publish": True, "publish_info": {"dataset": "/P/alice-a-v1/USER"}}


def test_every_field_is_the_owner_s_record_or_the_agents_bookkeeping():
    """A field added to the schema must be classified: what a job records at upload
    (judged_request's), or what agents write (absent, or its blank value, at creation)."""
    fields = set(model.REQUEST_SCHEMA["fields"])
    assert set(model.OWNER_RECORDED) | set(model.BOOKKEEPING) == fields
    assert set(AGENTS_BOOKKEEPING) == set(model.BOOKKEEPING)
    everything = sample_request("alice", user_dn="/CN=a", group="g", role="r", priority=-1,
                                **PUBLISHED)  # fmt: skip
    assert set(everything) - set(model.STORE_MEMBERS) == set(model.OWNER_RECORDED)
    storejs.check_schema(dict(everything, **model.BOOKKEEPING))
    storejs.check_schema(dict(everything, **AGENTS_BOOKKEEPING))


@pytest.mark.parametrize("state", ["new", "done"])
@pytest.mark.parametrize("field", sorted(AGENTS_BOOKKEEPING))
def test_a_creation_carries_nothing_an_agent_acts_on(files_db, accounts, state, field):
    """The red team created requests (new, and done) with a lease of a submitter, bob's job as
    their transfer, past attempts, a cool-off, a failure, cleanup and publication bookkeeping:
    what agents act on. The owner records what a job knows; each such field is refused."""
    doc = dict(born(state), **{field: AGENTS_BOOKKEEPING[field]})
    blank = js.stringify(model.BOOKKEEPING[field])
    reason = f"[create] {field} is the agents' bookkeeping: a new request has none (or {blank})"
    refused_alike(db_as(accounts, "alice", files_db), doc, None, "alice", reason)


def test_a_creation_may_carry_the_agents_fields_blank(files_db, accounts):
    """Absent, or at the value it has before any agent acted (null, [], 0): nothing forged."""
    doc = dict(born("new"), **model.BOOKKEEPING)
    storejs.validate_doc_update(doc, None, {"name": "alice", "roles": [model.USER_ROLE]})
    db_as(accounts, "alice", files_db).create(doc)
    assert db_as(accounts, "alice", files_db).get(doc["_id"])["lease"] is None


PUBLICATIONS = [
    ("a log file published without a dataset", {"publish": True, "file_type": "log"}, "pending",
     "not_required"),
    ("a file not to publish", {"publish": False}, "pending", "not_required"),
    ("an output to publish, not published", PUBLISHED, "not_required", "pending"),
    ("a log file with a dataset", dict(PUBLISHED, file_type="log"), "pending", "not_required"),
]  # fmt: skip


@pytest.mark.parametrize("state", ["new", "done"])
@pytest.mark.parametrize(("case", "fields", "publication", "intent"), PUBLICATIONS,
                         ids=[p[0] for p in PUBLICATIONS])  # fmt: skip
def test_a_creation_s_publication_is_what_it_publishes(
    files_db, accounts, state, case, fields, publication, intent
):
    """A pending publication with no dataset (publish true on a log file, or publish false)
    was accepted, and ended publication_failed: pending is only for an output file to publish,
    with its dataset; anything else is not_required."""
    doc = dict(born(state, **fields), publication=publication)
    doc.pop("publish_info", None) if "publish_info" not in fields else None
    reason = (f"[create] publication must be {intent}, not {publication} (pending only for an "
              "output file with publish true and its dataset)")  # fmt: skip
    refused_alike(db_as(accounts, "alice", files_db), doc, None, "alice", reason)
    db_as(accounts, "alice", files_db).create(dict(doc, publication=intent))


PRIORITY_RULE = (
    "[create] priority must be <= 0: an owner may only lower their own files' priority (a "
    "higher one is an operator's)"
)


def test_an_owner_may_only_lower_their_own_files_priority(files_db, accounts):
    """Priority orders a user's own files (users take turns in the submitter), so an owner
    needs only lower ones; above 0 is an operator's. The red team's 100 is refused by the
    store, its JavaScript in QuickJS and judged_request (so `aso upload` says it before sending)."""
    alice = db_as(accounts, "alice", files_db)
    for priority in (100, 1):
        doc = dict(born("new"), priority=priority)
        refused_alike(alice, doc, None, "alice", PRIORITY_RULE)
        with pytest.raises(model.Refusal) as built:
            sample_request("alice", priority=priority)
        assert built.value.reason == PRIORITY_RULE
    for priority in (0, -100):
        alice.create(born("new", priority=priority))
    urgent = dict(born("new"), priority=7)  # an operator may raise a file
    db_as(accounts, "operator", files_db).create(urgent)
    assert alice.get(urgent["_id"])["priority"] == 7


def stamped(doc: dict[str, Any], created: float, last_update: float, at: float) -> dict[str, Any]:
    return dict(doc, created=created, last_update=last_update,
                history=[dict(doc["history"][0], at=at)])  # fmt: skip


CLOCK = (
    "must be the store's time: at most 900 seconds ahead of its clock and 86400 seconds behind it"
)
ONE_STAMP = (
    "[time] a new request is stamped once: created, last_update and its history entry's at are "
    "one time"
)
STAMPS = [
    ("far in the future", (9.9e12, 9.9e12, 9.9e12), f"[time] created {CLOCK}"),
    ("at the epoch", (0, 0, 0), f"[time] created {CLOCK}"),
    ("an hour ahead", (3600, 3600, 3600), f"[time] created {CLOCK}"),
    ("two days ago", (-172800, -172800, -172800), f"[time] created {CLOCK}"),
    ("updated before it was created", (0, -60, 0), ONE_STAMP),
    ("updated in the future", (0, 9.9e12, 0), ONE_STAMP),
    ("a history entry of another time", (0, 0, 9.9e12), ONE_STAMP),
]


@pytest.mark.parametrize("state", ["new", "done"])
@pytest.mark.parametrize(("case", "times", "reason"), STAMPS, ids=[s[0] for s in STAMPS])
def test_a_creation_is_stamped_once_with_the_store_s_time(
    files_db, accounts, state, case, times, reason
):
    """created and last_update were accepted anywhere in time (9.9e12, 0). A job stamps its
    request once (created, last_update and the history entry's at: one time), and that time is
    the store's, give or take a job's clock off by minutes or a resend through an outage
    (model.CLOCK_AHEAD, CLOCK_BEHIND). Offsets below are from now; 0 and 9.9e12 are absolute."""
    now = time.time()
    absolute = case in ("far in the future", "at the epoch")
    doc = stamped(born(state), *(t if absolute else now + t for t in times))
    refused_alike(db_as(accounts, "alice", files_db), doc, None, "alice", reason)


def test_a_job_s_clock_may_be_off_by_minutes(files_db, accounts):
    alice = db_as(accounts, "alice", files_db)
    for offset in (600.0, -3600.0, -80000.0):  # ahead, behind, a resend a day later
        at = time.time() + offset
        alice.create(stamped(born("new"), at, at, at))


def killed(stored: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return model.transition(stored, [Change(STATE, "killed", "alice")], OWNER, **fields)


def test_an_owner_s_change_sets_nothing_an_agent_writes(files_db, accounts, stored):
    """A kill, a resubmission, a publication reset and a renewal change the state and its stamp
    only: no agent's bookkeeping, no priority, no time of another clock."""
    alice = db_as(accounts, "alice", files_db)
    owners_only = "[owner] owners may only request a kill or a resubmission; "
    far = 9.9e12
    cases = [
        (killed(stored, priority=100), f"{owners_only}priority cannot change"),
        (killed(stored, lease=AGENTS_BOOKKEEPING["lease"]), f"{owners_only}lease cannot change"),
        (killed(stored, transfer=AGENTS_BOOKKEEPING["transfer"]),
         f"{owners_only}transfer cannot change"),
        (killed(stored, created=far), "[immutable] created cannot change after creation"),
        (model.transition(stored, [Change(STATE, "killed", "alice")], OWNER, at=far),
         f"[time] last_update {CLOCK}"),
        (model.transition(stored, [Change(STATE, "killed", "alice")], OWNER, at=0),
         f"[time] last_update {CLOCK}"),
        (dict(killed(stored), last_update=far),
         "[time] an owner's change is stamped once: last_update and its history entries' at are "
         "one time"),
    ]  # fmt: skip
    entry = killed(stored)
    entry["history"][-1]["until"] = far
    cases.append(
        (entry, "[history] until is the retry manager's: an owner's history entry has none")
    )
    for doc, reason in cases:
        refused_alike(alice, doc, stored, "alice", reason)
    done = killed(stored)
    done["_rev"] = alice.put(done)
    back = model.transition(done, [Change(STATE, "new", "alice")], OWNER, at=far)
    refused_alike(alice, back, done, "alice", f"[time] last_update {CLOCK}")
    alice.put(model.transition(done, [Change(STATE, "new", "alice")], OWNER))


def test_a_publication_reset_is_only_for_a_file_to_publish(files_db, accounts):
    """A request whose publication was pending without a dataset (accepted before) ends
    publication_failed; its owner's reset would only fail again: refused, with why."""
    alice, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    doc = born("done", file_type="log", publish=True)
    doc.update(publication="publication_failed")
    doc["_rev"] = db_as(accounts, "admin", files_db).create(doc)
    reset = model.transition(doc, [Change(PUBLICATION, "pending", "alice")], OWNER)
    refused_alike(alice, reset, doc, "alice", "[transition] publication must be not_required, "
                  "not pending (pending only for an output file with publish true and its "
                  "dataset)")  # fmt: skip
    mine = born("done", **PUBLISHED)
    mine["_rev"] = alice.create(mine)
    for to in ("publication_error", "publication_failed"):
        mine = model.transition(mine, [Change(PUBLICATION, to, "publisher-1")], AGENT)
        mine["_rev"] = agent.put(mine)
    alice.put(model.transition(mine, [Change(PUBLICATION, "pending", "alice")], OWNER))


def test_a_renewal_brings_a_new_file_not_the_agents_fields(files_db, accounts):
    alice = db_as(accounts, "alice", files_db)
    failed = never_copied(files_db, accounts, "killed")
    retry = {"job_retry": 1, "size": failed["size"] + 1, "checksum": {"adler32": "0badf00d"}}
    again = [Change(STATE, "new", "alice", "job retry 1")]
    for fields, reason in (
        ({"priority": 100}, "[owner] owners may only request a kill or a resubmission; priority "
         "cannot change"),
        ({"attempts": []}, "[owner] owners may only request a kill or a resubmission; attempts "
         "cannot change"),
    ):  # fmt: skip
        doc = model.transition(failed, again, OWNER, **retry, **fields)
        refused_alike(alice, doc, failed, "alice", reason)
    doc = model.transition(failed, again, OWNER, at=9.9e12, **retry)
    refused_alike(alice, doc, failed, "alice", f"[time] last_update {CLOCK}")


# --- tasks -----------------------------------------------------------------------------------
def in_task(doc: dict[str, Any], task: str) -> dict[str, Any]:
    return dict(doc, task=task)


def task_rule(name: str) -> str:
    return (
        f"[task] task must be <YYMMDD_HHMMSS>:{name}_<name>, as CRAB names them (a task "
        'belongs to the user named after its first ":" up to the next "_")'
    )


NOBODY_S_TASKS = ["ceiling:abc", "alice_crab_test", "261121_120000:alicex_crab_test",
                  "261121_120000:alice", "261121_120000:_alice_crab",
                  "261121:120000:alice_x"]  # fmt: skip


def test_a_task_belongs_to_the_user_it_names(files_db, accounts):
    """Alice recorded a file in bob's task 261121_120000:bob_crab_test: bob's by_task listing,
    his status, his kills by task and the publisher's "task over" then counted it. A task
    belongs to the user named after its first ":" up to the next "_", as CRAB names them;
    a user records files in their own tasks only."""
    alice, bob = db_as(accounts, "alice", files_db), db_as(accounts, "bob", files_db)
    task = f"261121_120000:bob_crab_{_token()}"
    bobs = in_task(sample_request("bob"), task)
    bob.create(bobs)
    refused_alike(alice, in_task(born("new"), task), None, "alice", task_rule("alice"))
    for other in NOBODY_S_TASKS:
        refused_alike(alice, in_task(born("new"), other), None, "alice", task_rule("alice"))
    rows = bob.view("asyncstageout", "by_task", start_key=[task], end_key=[task, {}]).rows
    assert [row["id"] for row in rows] == [bobs["_id"]]
    with pytest.raises(model.Refusal) as built:
        sample_request("alice", task=task)
    assert built.value.reason == task_rule("alice")
    for mine in ("261121_120000:alice_crab_test", model.task_name("alice", "crab_x"), ":alice_x"):
        alice.create(in_task(born("new"), mine))


def test_a_user_whose_name_holds_an_underscore_owns_no_task(admin, files_db):
    """alice_x's task 261121_120000:alice_x_crab_test would be alice's as well (her name ends
    at the first "_"): it is alice's, and alice_x owns none, as the refusal says."""
    store_admin.put_user(admin, "alice_x", PASSWORD, [model.USER_ROLE])
    doc = born("new")
    doc.update(user="alice_x", task="261121_120000:alice_x_crab_test",
               source_lfn=doc["source_lfn"].replace("/alice.abc/", "/alice_x/"),
               destination_lfn=doc["destination_lfn"].replace("/alice/", "/alice_x/"),
               history=[dict(doc["history"][0], by="alice_x")])  # fmt: skip
    doc["_id"] = model.request_id(doc["source_lfn"])
    reason = task_rule("alice_x")[:-1] + ', so a user whose name holds a "_" owns none)'
    refused_alike(Server(admin.url, "alice_x", PASSWORD).db(files_db), doc, None, "alice_x",
                  reason)  # fmt: skip
    assert owner_refusal(dict(doc, user="alice")) is None  # the task is alice's


# --- malformed documents ---------------------------------------------------------------------
def _drop(field):
    return lambda d: d.pop(field)


MALFORMED = [
    ("missing field", _drop("size"), "[schema] doc.size is required"),
    (
        "missing nested field",
        lambda d: d["checksum"].pop("adler32"),
        "[schema] doc.checksum.adler32 is required",
    ),
    (
        "wrong type",
        lambda d: d.update(size="1000"),
        "[schema] doc.size must be integer, not string",
    ),
    ("float for integer", lambda d: d.update(size=10.5), "[schema] doc.size must be integer"),
    ("unknown state", lambda d: d.update(state="flying"), "[schema] doc.state must be one of"),
    (
        "unknown cleanup state",
        lambda d: d.update(cleanup="maybe"),
        "[schema] doc.cleanup must be one of",
    ),
    (
        "unknown field",
        lambda d: d.update(colour="blue"),
        "[schema] doc.colour is not a field of the schema",
    ),
    ("oversized string", lambda d: d.update(task="t" * 5000), "[schema] doc.task"),
    (
        "oversized LFN",
        lambda d: d.update(destination_lfn="/store/user/" + "x" * 2000),
        "[schema] doc.destination_lfn is longer than 1024 characters",
    ),
    (
        "oversized document",
        lambda d: d.update(
            publish=True,
            publish_info={
                "dataset": "/p/alice-x/USER",
                "lumis": {str(r): list(range(9000)) for r in range(6)},
            },
        ),
        "[schema] the document is larger than",
    ),
    (
        "LFN escaping its area",
        lambda d: d.update(source_lfn="/store/temp/../user/x.root"),
        "[schema] doc.source_lfn",
    ),
    ("bad checksum", lambda d: d["checksum"].update(adler32="zz"), "[schema] doc.checksum.adler32"),
    ("negative size", lambda d: d.update(size=-1), "[schema] doc.size must be >= 0"),
    ("bad site", lambda d: d.update(destination="nowhere"), "[schema] doc.destination"),
    (
        "wrong document type",
        lambda d: d.update(type="bogus"),
        '[type] unknown document type "bogus"',
    ),
    (
        "publish without dataset",
        lambda d: d.update(publish=True),
        "[schema] doc.publish_info is required when publish is true",
    ),
    (
        "bad history entry",
        lambda d: d["history"][0].update(at="yesterday"),
        "[schema] doc.history[0].at must be number",
    ),
]


@pytest.mark.parametrize(("case", "edit", "reason"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_documents_are_refused_with_the_rule(files_db, accounts, case, edit, reason):
    doc = sample_request("alice")
    edit(doc)
    for who in ("alice", "admin"):  # the schema binds admins too
        with pytest.raises(Forbidden) as err:
            db_as(accounts, who, files_db).create(doc)
        assert err.value.reason.startswith(reason), (who, err.value.reason)
    with pytest.raises(model.Refusal):  # and the Python model refuses it as well
        storejs.check_schema(doc)


# --- updates ---------------------------------------------------------------------------------
@pytest.fixture()
def stored(files_db, accounts) -> dict[str, Any]:
    doc = sample_request("alice")
    doc["_rev"] = db_as(accounts, "alice", files_db).create(doc)
    return doc


def test_nobody_but_admins_changes_what_the_request_is(files_db, accounts, stored):
    for who in ("agent", "alice"):
        edited = dict(copy.deepcopy(stored), size=stored["size"] + 1)
        with pytest.raises(Forbidden) as err:
            db_as(accounts, who, files_db).put(edited)
        assert err.value.reason == "[immutable] size cannot change after creation"
    db_as(accounts, "operator", files_db).put(dict(stored, size=stored["size"] + 1))


def test_owner_may_only_kill_or_resubmit(files_db, accounts, stored):
    owner = db_as(accounts, "alice", files_db)
    with pytest.raises(Forbidden) as err:
        owner.put(dict(stored, failure_reason="I say so"))
    assert err.value.reason.startswith("[owner] owners may only request a kill or a resubmission")
    with pytest.raises(Forbidden) as err:
        owner.put(dict(stored))  # a no-op rewrite
    assert err.value.reason == "[owner] owners may only request a kill or a resubmission"
    killed = model.transition(stored, [Change(STATE, "killed", "alice")], OWNER)
    killed["_rev"] = owner.put(killed)
    resubmitted = model.transition(killed, [Change(STATE, "new", "alice")], OWNER)
    owner.put(resubmitted)
    assert owner.get(stored["_id"])[STATE] == "new"


def test_a_job_retry_renews_only_a_request_never_copied(files_db, accounts, stored):
    """docs/status-api.md, "Job retries": the owner may replace a failed or killed request's
    file (size, checksum, job_retry, publication details) with a job retry's, queued again;
    nobody may while it is on its way or copied, nor without a higher job_retry, nor change
    anything else with it. The store and its JavaScript in QuickJS agree on each case."""
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    retry = {"job_retry": 1, "size": stored["size"] + 7, "checksum": {"adler32": "0badf00d"}}
    # On its way (new): a job retry may not replace it.
    early = model.transition(stored, [Change(STATE, "killed", "alice")], OWNER)
    early = dict(early, **retry, state="new", history=stored["history"])
    with pytest.raises(Forbidden) as err:
        owner.put(early)
    assert err.value.reason == "[immutable] job_retry cannot change after creation"
    failed = stored
    for to in ("submitted", "failed_attempt", "failed"):
        failed = model.transition(failed, [Change(STATE, to, "agent-x")], AGENT)
        failed["_rev"] = agent.put(failed)
    renewal = model.transition(failed, [Change(STATE, "new", "alice", "job retry 1")], OWNER,
                               **retry)  # fmt: skip
    for bad, reason in (
        (dict(renewal, job_retry=0), "[immutable] size cannot change after creation"),
        (dict(renewal, destination_lfn=renewal["destination_lfn"] + "x"),
         "[immutable] destination_lfn cannot change after creation"),
        (dict(renewal, priority=5), "[owner] owners may only request a kill or a resubmission; "
         "priority cannot change"),
    ):  # fmt: skip
        with pytest.raises(model.Refusal) as judged:
            storejs.validate_doc_update(bad, failed, {"name": "alice", "roles": ["aso-user"]})
        with pytest.raises(Forbidden) as err:
            owner.put(bad)
        assert err.value.reason == reason == judged.value.reason
    with pytest.raises(Forbidden):  # an agent may not renew
        agent.put(dict(renewal, history=[*renewal["history"][:-1],
                                         dict(renewal["history"][-1], by="agent-x")]))  # fmt: skip
    storejs.validate_doc_update(renewal, failed, {"name": "alice", "roles": ["aso-user"]})
    owner.put(renewal)
    now = owner.get(stored["_id"])
    assert (now[STATE], now["size"], now["job_retry"]) == ("new", stored["size"] + 7, 1)


def test_owner_cannot_hand_a_request_to_another_user(files_db, accounts, stored):
    with pytest.raises(Forbidden) as err:
        db_as(accounts, "bob", files_db).put(
            model.transition(stored, [Change(STATE, "killed", "bob")], OWNER)
        )
    assert err.value.reason.startswith('[owner] user "bob" may not write requests of user')
    with pytest.raises(Forbidden):
        db_as(accounts, "bob", files_db).put(dict(stored, user="bob"))


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (
            lambda d: d.update(state="submitted"),
            "[history] the change of state from new to submitted needs its history entry",
        ),
        (
            lambda d: (
                d.update(state="submitted"),
                d["history"].append(
                    {"axis": STATE, "from": "new", "to": "submitted", "at": 1.0, "by": "a"}
                ),
                d["history"].append(
                    {"axis": STATE, "from": "new", "to": "submitted", "at": 1.0, "by": "a"}
                ),
            ),
            "[history] history gets exactly one entry per state change",
        ),
        (
            lambda d: d["history"][0].update(by="someone else"),
            "[history] history entries cannot be changed",
        ),
        (lambda d: d.update(history=[]), "[history] history entries cannot be removed"),
    ],
)
def test_history_is_append_only_and_records_every_change(files_db, accounts, stored, edit, reason):
    doc = copy.deepcopy(stored)
    edit(doc)
    with pytest.raises(Forbidden) as err:
        db_as(accounts, "agent", files_db).put(doc)
    assert err.value.reason.startswith(reason), err.value.reason


def test_agents_update_bookkeeping_without_a_transition(files_db, accounts, stored):
    agent = db_as(accounts, "agent", files_db)
    moved = model.transition(
        stored,
        [Change(STATE, "submitted", "submitter-1")],
        AGENT,
        lease={"owner": "submitter-1", "until": 1e9, "job_key": "k1"},
    )
    moved["_rev"] = agent.put(moved)
    renewed = dict(moved, lease={"owner": "submitter-1", "until": 2e9, "job_key": "k1"})
    agent.put(renewed)
    assert agent.get(stored["_id"])["lease"]["until"] == 2e9


def test_deletion_rules(files_db, accounts):
    admin = db_as(accounts, "admin", files_db)
    live = sample_request("alice")
    live_rev = admin.create(live)
    finished = sample_request("alice")
    finished[STATE] = "failed"
    finished_rev = admin.create(finished)
    # Failed, its temporary copy still there: not finished (a purge would leave it behind).
    with pytest.raises(Forbidden, match="agents may only delete finished requests"):
        db_as(accounts, "agent", files_db).delete(finished["_id"], finished_rev)
    finished_rev = admin.put(dict(finished, _rev=finished_rev, cleanup="cleaned"))
    with pytest.raises(Forbidden) as err:
        db_as(accounts, "alice", files_db).delete(live["_id"], live_rev)
    assert err.value.reason.startswith("[delete] only agents (finished requests) and admins")
    with pytest.raises(Forbidden) as err:
        db_as(accounts, "agent", files_db).delete(live["_id"], live_rev)
    assert err.value.reason == "[delete] agents may only delete finished requests"
    db_as(accounts, "agent", files_db).delete(finished["_id"], finished_rev)
    assert admin.get(finished["_id"]) is None
    db_as(accounts, "operator", files_db).delete(live["_id"], live_rev)
    assert admin.get(live["_id"]) is None


def test_only_admins_touch_design_documents_and_security(files_db, accounts):
    ddoc = {"_id": "_design/evil", "views": {"all": {"map": "function(d){emit(d._id,null)}"}}}
    for who in ("alice", "agent"):
        with pytest.raises((Forbidden, Unauthorized)):
            store_admin.push_design(db_as(accounts, who, files_db), ddoc)
        with pytest.raises((Forbidden, Unauthorized)):
            store_admin.set_security(db_as(accounts, who, files_db), {"members": {"names": [who]}})
    # Operators (aso-admin) repair requests, but design documents are code the store runs:
    # the store admin's alone (`aso db init`), on both stores.
    for who in ("alice", "agent", "operator"):
        with pytest.raises((Forbidden, Unauthorized)):
            store_admin.push_design(db_as(accounts, who, files_db), ddoc)
    assert db_as(accounts, "admin", files_db).get("_design/evil") is None
    assert store_admin.push_design(db_as(accounts, "admin", files_db), ddoc)
    db_as(accounts, "admin", files_db).delete(
        "_design/evil", db_as(accounts, "admin", files_db).get("_design/evil")["_rev"]
    )


def test_members_read_and_strangers_do_not(files_db, accounts, stored):
    for who in ("alice", "bob", "agent", "operator"):
        assert db_as(accounts, who, files_db).get(stored["_id"])["_id"] == stored["_id"]
    for who in ("stranger", "anonymous"):
        with pytest.raises(StoreError) as err:
            db_as(accounts, who, files_db).get(stored["_id"])
        assert err.value.status in (401, 403)


def test_heartbeats_are_written_by_agents_only(files_db, accounts):
    beat = {
        "_id": model.heartbeat_id("submitter", "h-1"),
        "type": "heartbeat",
        "agent": "submitter",
        "instance": "h-1",
        "host": "h",
        "pid": 1,
        "started": 1.0,
        "last_seen": 2.0,
        "cycles": 0,
        "totals": {"jobs": 3},
    }
    with pytest.raises(Forbidden) as err:
        db_as(accounts, "alice", files_db).create(beat)
    assert err.value.reason == "[agent-doc] only agents write heartbeat documents"
    with pytest.raises(Forbidden) as err:
        db_as(accounts, "agent", files_db).create(dict(beat, pid="one"))
    assert err.value.reason.startswith("[schema] doc.pid must be integer")
    with pytest.raises(Forbidden) as err:
        db_as(accounts, "agent", files_db).create(dict(beat, _id="heartbeat-of-nobody"))
    assert err.value.reason == "[schema] doc._id does not name a heartbeat"
    agent = db_as(accounts, "agent", files_db)
    rev = agent.create(beat)
    rev = agent.put(dict(beat, _rev=rev, last_seen=3.0))
    agent.delete(beat["_id"], rev)
    assert agent.get(beat["_id"]) is None


def test_a_stale_write_is_a_conflict_not_a_refusal(files_db, accounts, stored):
    """Both stores answer 409 to a write based on an old revision, whatever it would change
    (the embedded store validates before it finds the conflict: EMBEDDED_VALIDATES_BEFORE_
    CONFLICT), so writers read again instead of taking a refusal for the rules' answer."""
    agent, owner = db_as(accounts, "agent", files_db), db_as(accounts, "alice", files_db)
    moved = model.transition(
        stored,
        [Change(STATE, "submitted", "s1")],
        AGENT,
        lease={"owner": "s1", "until": 1e10, "job_key": "k"},
    )
    agent.put(moved)
    with pytest.raises(Conflict):  # new → killed is legal from what alice read...
        owner.put(model.transition(stored, [Change(STATE, "killed", "alice")], OWNER))
    current = owner.get(stored["_id"])
    with pytest.raises(Forbidden):  # ...and submitted → killed is not, once she reads again
        owner.put(model.transition(current, [Change(STATE, "killed", "alice")], model.ADMIN))


CROSS_CONTEXT = re.compile(r"instanceof\s+(Array|Object)\b")


def _sources(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _sources(item)]
    if isinstance(value, list):
        return [s for item in value for s in _sources(item)]
    return []


def test_store_side_javascript_never_tests_arrays_with_instanceof(admin, store_config):
    """COUCHDB_FOREIGN_ARRAYS: CouchDB's query server gives each document a JavaScript context
    of its own, so `doc.files instanceof Array` is false there (every catalog block and purge
    batch was refused). Every design document ASO pushes, read back from the store, uses
    Array.isArray instead."""
    keys = ("files_db", "transfers_db", "catalog_db", "stats_db")
    names = {key: f"jsscan_{key}_{uuid.uuid4().hex[:6]}" for key in keys}
    store = dataclasses.replace(store_config.store, **names)
    init_databases(admin, dataclasses.replace(store_config, store=store))
    checked = 0
    try:
        for name in names.values():
            for ddoc in admin.db(name).all_docs("_design/", "_design0"):
                ddoc.pop("_attachments", None)
                for source in _sources(ddoc):
                    checked += 1
                    assert not CROSS_CONTEXT.search(source), (name, ddoc["_id"], source[:200])
    finally:
        for name in names.values():
            store_admin.delete_db(admin, name)
    assert checked > 20  # every view, validation and library of the six design documents


def test_uploading_a_job_retry_renews_a_failed_request_and_says_so(files_db, accounts):
    """aso.upload: the same file again is "already"; a job retry's new file under the LFN of
    a failed request is "renewed" (queued again with the new size and checksum); under a
    request on its way, or without a higher job_retry, it is refused with why."""
    owner, agent = db_as(accounts, "alice", files_db), db_as(accounts, "agent", files_db)
    first = sample_request("alice")
    assert upload(owner, [first]).recorded == [first["_id"]]
    assert upload(owner, [first]).already == [first["_id"]]
    retry = dict(copy.deepcopy(first), job_retry=1, size=first["size"] + 1)
    on_its_way = upload(owner, [retry])
    assert on_its_way.refused == {
        first["_id"]: (
            f"a different file for {first['source_lfn']} is recorded (job retry 0, new): a job "
            "retry may replace a request that failed or was killed, not one on its way or copied"
        )
    }
    doc = owner.get(first["_id"])
    for to in ("submitted", "failed_attempt", "failed"):
        doc = model.transition(doc, [Change(STATE, to, "agent-x")], AGENT)
        doc["_rev"] = agent.put(doc)
    same_retry = upload(owner, [dict(retry, job_retry=0)])
    assert "a new file needs a higher job_retry" in same_retry.refused[first["_id"]]
    renewed = upload(owner, [retry])
    assert renewed.renewed == [first["_id"]] and renewed.ok
    now = owner.get(first["_id"])
    assert (now[STATE], now["size"], now["job_retry"]) == ("new", retry["size"], 1)
    assert now["history"][-1]["reason"] == "job retry 1: a new file under the same LFN"
    assert upload(owner, [retry]).already == [first["_id"]]  # and the retry again is recorded


# --- writes based on another revision than the current one ----------------------------------
@pytest.fixture(scope="module")
def twin_db(admin, store_config) -> Any:
    """A database with the files database's design documents, where a write is made first to
    learn the revision it gets: both stores' revisions are a hash of what is written
    (EMBEDDED_PREDICTABLE_REVS), so the same write in the files database gets the same one."""
    name = f"twin_{uuid.uuid4().hex[:8]}"
    store_admin.create_db(admin, name, designdocs.FILES_SECURITY)
    for ddoc in designdocs.design_documents(store_config):
        store_admin.push_design(admin.db(name), ddoc)
    yield name
    store_admin.delete_db(admin, name)


def is_conflict(item: dict[str, Any]) -> bool:
    """A `_bulk_docs` result that is a conflict: CouchDB's 409, or the validation's own."""
    return item.get("error") == "conflict" or refused_as_conflict(
        item.get("error"), item.get("reason")
    )


def killed_and_predicted(
    accounts: dict[str, Any], files_db: str, twin_db: str
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(a request alice stored, her kill of it, the revision the kill will get): the same
    request and kill written in the twin database first."""
    doc = sample_request("alice")
    doc["_rev"] = db_as(accounts, "alice", files_db).create(doc)
    twin = db_as(accounts, "alice", twin_db)
    assert twin.create({k: v for k, v in doc.items() if k != "_rev"}) == doc["_rev"]
    kill = model.transition(doc, [Change(STATE, "killed", "alice")], OWNER)
    return doc, kill, twin.put(kill)


def own(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if not k.startswith("_")}


FORGERIES = [
    ("a destination in bob's area",
     lambda d: d.update(destination_lfn=f"/store/user/bob/x/{_token()}.root")),
    ("a field off the schema", lambda d: d.update(colour="blue")),
    ("a request done, cleaned and published",
     lambda d: d.update(state="done", cleanup="cleaned", publication="published")),
    ("a request turned into bob's", lambda d: d.update(user="bob")),
]  # fmt: skip


@pytest.mark.parametrize(("case", "forge"), FORGERIES, ids=[f[0] for f in FORGERIES])
def test_a_write_based_on_the_revision_a_kill_of_the_same_batch_will_get_is_refused(
    files_db, accounts, twin_db, case, forge
):
    """Alice's one `_bulk_docs`: her legitimate kill based on R1, and a forged document based
    on R2, the revision the kill gets. The embedded store judged the forged one against R1, the
    validation let a write based on another revision pass, and the store put it on R2 unjudged.
    Now it is a conflict on both stores, and the kill alone is stored."""
    doc, kill, predicted = killed_and_predicted(accounts, files_db, twin_db)
    forged = copy.deepcopy(kill)
    forge(forged)
    forged["_rev"] = predicted
    answer = accounts["alice"].raw("POST", f"/{files_db}/_bulk_docs", body={"docs": [kill, forged]})
    done = [item for item in answer if item.get("ok")]
    refused = [item for item in answer if not item.get("ok")]
    assert [item["rev"] for item in done] == [predicted], answer  # the forged one was on time
    assert len(refused) == 1 and is_conflict(refused[0]), answer
    stored = db_as(accounts, "admin", files_db).get(doc["_id"])
    assert stored["_rev"] == predicted and own(stored) == own(kill)
    with pytest.raises(model.Refusal) as judged:
        storejs.validate_doc_update(forged, doc, {"name": "alice", "roles": ["aso-user"]})
    assert judged.value.reason.startswith("[conflict] the write is based on revision")


def test_a_forged_write_racing_the_owner_s_kill_is_never_stored(files_db, accounts, twin_db):
    """The same attack from several clients at once: forgers send the forged write (based on
    the revision the kill will get, into bob's area) again and again while alice's kill is on
    its way. Whichever the store judges first, each is refused (a conflict before the kill
    lands, the rules once it has) and the stored request is the kill."""
    for _ in range(4):
        doc, kill, predicted = killed_and_predicted(accounts, files_db, twin_db)
        forged = dict(copy.deepcopy(kill), _rev=predicted,
                      destination_lfn=f"/store/user/bob/{_token()}.root")  # fmt: skip
        outcomes = race(accounts["alice"].url, files_db, kill, forged)
        assert outcomes["kill"] == [predicted], outcomes
        assert outcomes["forged"], "no forged write was sent"
        assert all(isinstance(o, Conflict | Forbidden) for o in outcomes["forged"]), outcomes
        stored = db_as(accounts, "admin", files_db).get(doc["_id"])
        assert stored["_rev"] == predicted and own(stored) == own(kill)


def race(
    url: str, files_db: str, kill: dict[str, Any], forged: dict[str, Any], forgers: int = 4
) -> dict[str, list[Any]]:
    """alice's kill, once, and `forgers` clients writing `forged` until the kill is answered
    and a few times after; what each write got (a revision or the error)."""
    start, killed = threading.Barrier(forgers + 1), threading.Event()
    outcomes: dict[str, list[Any]] = {"kill": [], "forged": []}

    def put(body: dict[str, Any], db: Database) -> Any:
        try:
            return db.put(body)
        except StoreError as exc:
            return exc

    def killer() -> None:
        db = Server(url, "alice", PASSWORD).db(files_db)
        start.wait()
        outcomes["kill"].append(put(kill, db))
        killed.set()

    def forger() -> None:
        db = Server(url, "alice", PASSWORD).db(files_db)
        start.wait()
        for after in itertools.count():
            outcomes["forged"].append(put(forged, db))
            if after > 200 or (killed.is_set() and after > 3):
                return

    threads = [threading.Thread(target=killer)]
    threads += [threading.Thread(target=forger) for _ in range(forgers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return outcomes


def _stale(doc: dict[str, Any], accounts: dict[str, Any], files_db: str) -> dict[str, Any]:
    """`doc` stored again (by an agent: a lease renewal), and `doc` as it was: a stale copy."""
    agent = db_as(accounts, "agent", files_db)
    moved = model.transition(doc, [Change(STATE, "submitted", "s-1")], AGENT,
                             lease={"owner": "s-1", "until": 1e10, "job_key": "k"})  # fmt: skip
    agent.put(moved)
    return doc


STALE_WRITES = [
    ("a create of an existing id, another file", "alice",
     lambda doc, stale: dict(own(doc), _id=doc["_id"], size=doc["size"] + 1)),
    ("a legal kill of a revision no longer current", "alice",
     lambda doc, stale: model.transition(stale, [Change(STATE, "killed", "alice")], OWNER)),
    ("an illegal move of an old revision", "agent",
     lambda doc, stale: dict(model.transition(stale, [Change(STATE, "done", "x")], model.ADMIN),
                             size=1)),
    ("a made-up revision", "agent", lambda doc, stale: dict(doc, _rev="9-" + "a" * 32)),
    ("a revision of a document that does not exist", "alice",
     lambda doc, stale: dict(sample_request("alice"), _rev="1-" + "b" * 32)),
    ("a deletion of an old revision", "agent",
     lambda doc, stale: {"_id": doc["_id"], "_rev": stale["_rev"], "_deleted": True,
                         "withdrawn": model.WITHDRAWN}),
]  # fmt: skip


@pytest.mark.parametrize(("case", "who", "make"), STALE_WRITES, ids=[s[0] for s in STALE_WRITES])
def test_every_write_based_on_another_revision_is_a_conflict_to_every_client(
    files_db, accounts, case, who, make
):
    """Whatever it would change, a write by a user or an agent that is not based on the current
    revision is a conflict: CouchDB's 409 before it validates, the validation's "[conflict]"
    refusal on the embedded store, and a Conflict (409 `conflict`) from aso.store either way,
    single or in bulk. Nothing is stored; the JavaScript in QuickJS says the same."""
    doc = sample_request("alice")
    doc["_rev"] = db_as(accounts, "alice", files_db).create(doc)
    stale = _stale(copy.deepcopy(doc), accounts, files_db)
    current = db_as(accounts, "admin", files_db).get(doc["_id"])
    write = make(current, stale)
    before = db_as(accounts, "admin", files_db).get(write["_id"])
    with pytest.raises(model.Refusal) as judged:
        storejs.validate_doc_update(write, before, {"name": who, "roles": ACCOUNT_ROLES[who]})
    assert judged.value.rule == "conflict", judged.value.reason
    db = db_as(accounts, who, files_db)
    with pytest.raises(Conflict) as single:
        db.put(write)
    assert (single.value.status, single.value.error) == (409, "conflict")
    [bulk] = db.bulk_write([write])
    assert bulk.conflict and not bulk.ok, bulk
    assert db_as(accounts, "admin", files_db).get(write["_id"]) == before


@pytest.mark.parametrize("graft", ["a branch of its own", "a branch from the current revision"])
def test_a_replicated_write_cannot_graft_an_unjudged_revision(files_db, accounts, graft):
    """`new_edits=false` (replication) writes a revision the writer names: the stores ask the
    validation with an older revision or none. A user's such write is judged (and refused),
    never grafted: the request keeps its one revision."""
    doc = sample_request("alice")
    doc["_rev"] = db_as(accounts, "alice", files_db).create(doc)
    forged = dict(model.transition(doc, [Change(STATE, "done", "alice")], model.ADMIN),
                  destination_lfn=f"/store/user/bob/{_token()}.root")  # fmt: skip
    current = doc["_rev"].split("-", 1)[1]
    revisions = {"start": 9, "ids": ["c" * 32]}
    if graft != "a branch of its own":
        revisions = {"start": 3, "ids": ["c" * 32, "d" * 32, current]}
    forged.update(_rev=f"{revisions['start']}-{'c' * 32}", _revisions=revisions)
    with contextlib.suppress(StoreError):  # an answer per refused document, or none at all
        answer = accounts["alice"].raw(
            "POST", f"/{files_db}/_bulk_docs", body={"docs": [forged], "new_edits": False}
        )
        assert all(item.get("error") for item in answer), answer
    admin = db_as(accounts, "admin", files_db)
    assert [leaf["_rev"] for leaf in admin.leaves(doc["_id"])] == [doc["_rev"]]
    assert own(admin.get(doc["_id"])) == own(doc)


def test_the_conflict_refusal_is_conflict_only_with_its_prefix():
    """aso.store's reading of the validation's refusals: only "[conflict] " makes a 403 a
    conflict; every other rule stays a refusal."""
    assert refused_as_conflict("forbidden", "[conflict] the write is based on revision ...")
    assert not refused_as_conflict("forbidden", "[owner] user bob may not write ...")
    assert not refused_as_conflict("forbidden", "[conflicts] not this rule")
    assert not refused_as_conflict("unauthorized", "[conflict] not a refusal of the rules")
    assert not refused_as_conflict("forbidden", None)


# --- the request id --------------------------------------------------------------------------
def test_nobody_takes_the_id_of_another_user_s_next_upload(files_db, accounts):
    """Squatting: alice created a request under the id bob's next upload would have (the hash
    of his temporary LFN) with her own files in it; bob's upload was then a conflict. A
    creation's id is the hash of its own source_lfn, whoever creates it."""
    bobs = sample_request("bob")
    squat = dict(sample_request("alice"), _id=bobs["_id"])
    reason = f"[schema] {model.ID_RULE} ({model.request_id(squat['source_lfn'])})"
    for who in ("alice", "operator"):
        with pytest.raises(Forbidden) as refused:
            db_as(accounts, who, files_db).create(squat)
        assert refused.value.reason == reason
        with pytest.raises(model.Refusal) as judged:
            storejs.validate_doc_update(squat, None, {"name": who, "roles": ACCOUNT_ROLES[who]})
        assert judged.value.reason == reason
    assert upload(db_as(accounts, "bob", files_db), [bobs]).recorded == [bobs["_id"]]


def _one_bit_off(digest: str, at: int) -> str:
    at %= len(digest)
    return digest[:at] + format(int(digest[at], 16) ^ 1, "x") + digest[at + 1 :]


LFN_PARTS = st.text(string.ascii_letters + string.digits + "_.+=:@,-", min_size=1, max_size=40)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(parts=st.lists(LFN_PARTS.filter(lambda p: p not in (".", "..")), min_size=1, max_size=10),
       at=st.integers(0, 63))  # fmt: skip
def test_a_creation_s_id_is_the_hash_of_its_source_on_the_store(files_db, accounts, parts, at):
    """validate_doc_update's SHA-256 (lib/sha256.js) against hashlib, through the real
    validation: a creation whose id is its source's hash is stored, one with one bit off is
    refused with the id it must have, by the store and its JavaScript in QuickJS alike."""
    alice = db_as(accounts, "alice", files_db)
    lfn = f"/store/temp/user/alice/{_token()}/" + "/".join(parts)
    doc = sample_request("alice", source_lfn=lfn)
    digest = hashlib.sha256(lfn.encode()).hexdigest()
    assert doc["_id"] == digest
    off = dict(doc, _id=_one_bit_off(digest, at))
    reason = f"[schema] {model.ID_RULE} ({digest})"
    [refused, stored] = alice.bulk_write([off, doc])
    assert (refused.error, refused.reason) == ("forbidden", reason), refused
    assert stored.ok, stored
    with pytest.raises(model.Refusal) as judged:
        storejs.validate_doc_update(off, None, {"name": "alice", "roles": ["aso-user"]})
    assert judged.value.reason == reason


@pytest.fixture(scope="module")
def hashing_db(admin) -> Any:
    """A database whose validation answers every write with lib/sha256.js's hash of its
    `text`: the store's own JavaScript engine hashes what the test sends."""
    name = f"sha256_{uuid.uuid4().hex[:8]}"
    store_admin.create_db(admin, name, designdocs.FILES_SECURITY)
    library = (designdocs.COUCHAPP_DIR / "asyncstageout" / "lib" / "sha256.js").read_text()
    store_admin.push_design(admin.db(name), {
        "_id": "_design/hash",
        "lib": {"sha256": library},
        "validate_doc_update": "function (newDoc) { if (newDoc._deleted) { return; } "
        "throw({forbidden: require('lib/sha256').hex(newDoc.text)}); }",
    })  # fmt: skip
    yield name
    store_admin.delete_db(admin, name)


# Every plane of Unicode but lone surrogates (no UTF-8 has them: the schema refuses them first).
UNICODE = st.characters(exclude_categories=("Cs",))
HASHED = st.one_of(
    st.text(string.printable, max_size=200),
    st.text(st.characters(min_codepoint=0x80, max_codepoint=0xFFFF, exclude_categories=("Cs",)),
            max_size=100),
    st.text(st.characters(min_codepoint=0x10000), max_size=60),
    st.text(UNICODE, max_size=150),
)  # fmt: skip
# Around the block boundaries of SHA-256's padding (55/56 and 63/64 bytes), in 1-4 byte units.
EDGES = [c * n for c in ("a", "é", "€", "😀") for n in range(12, 66)
         if 52 <= len(c.encode()) * n <= 130]  # fmt: skip


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(texts=st.lists(HASHED, min_size=1, max_size=30))
def test_the_store_s_sha256_is_hashlib_s_for_any_text(admin, hashing_db, texts):
    """lib/sha256.js in the store's JavaScript engine (node's vm, CouchDB's QuickJS or
    SpiderMonkey) hashes the UTF-8 bytes of ASCII, multi-byte and astral text exactly as
    Python's hashlib does, padding boundaries included."""
    texts = [*texts, *EDGES]
    docs = [{"_id": f"t{i:04d}", "text": text} for i, text in enumerate(texts)]
    answer = admin.raw("POST", f"/{hashing_db}/_bulk_docs", body={"docs": docs})
    got = {item["id"]: item.get("reason") for item in answer}
    for doc in docs:
        assert got[doc["_id"]] == hashlib.sha256(doc["text"].encode()).hexdigest(), doc


# --- namespaces on every write that sets them ------------------------------------------------
def never_copied(files_db: str, accounts: dict[str, Any], end: str) -> dict[str, Any]:
    """A request of alice's (published into her dataset) that failed or that she killed."""
    doc = sample_request("alice", publish=True, publish_info={"dataset": "/P/alice-a-v1/USER"})
    doc["_rev"] = db_as(accounts, "alice", files_db).create(doc)
    if end == "killed":
        moves = [(OWNER, "alice", "killed")]
    else:
        moves = [(AGENT, "agent", to) for to in ("submitted", "failed_attempt", "failed")]
    for role, who, to in moves:
        doc = model.transition(doc, [Change(STATE, to, f"{who}-1" if role == AGENT else who)], role)
        doc["_rev"] = db_as(accounts, who, files_db).put(doc)
    return doc


ESCAPES = [("bob's dataset", "/P/bob-x/USER"), ("nobody's dataset", "/P/x/USER")]


@pytest.mark.parametrize("end", ["failed", "killed"])
@pytest.mark.parametrize(("case", "dataset"), ESCAPES, ids=[e[0] for e in ESCAPES])
def test_a_job_retry_s_renewal_stays_in_the_owner_s_namespace(
    files_db, accounts, end, case, dataset
):
    """A request never copied, renewed by its owner with a job retry's file (state new,
    job_retry + 1, RENEWABLE fields anew): its publication details may change, its dataset
    may not leave the owner's namespace: the namespace rules judge every write that sets a
    namespaced field, renewals included; agents set none."""
    owner = db_as(accounts, "alice", files_db)
    failed = never_copied(files_db, accounts, end)
    retry = {"job_retry": 1, "size": failed["size"] + 7, "publish_info": {"dataset": dataset}}
    renewal = model.transition(failed, [Change(STATE, "new", "alice", "job retry 1")], OWNER,
                               **retry)  # fmt: skip
    reason = (
        "[namespace] publish_info.dataset must be /<primary>/alice-<processed>/USER (the user's "
        "own datasets)"
    )
    with pytest.raises(Forbidden) as refused:
        owner.put(renewal)
    assert refused.value.reason == reason
    with pytest.raises(model.Refusal) as judged:
        storejs.validate_doc_update(renewal, failed, {"name": "alice", "roles": ["aso-user"]})
    assert judged.value.reason == reason
    assert owner.get(failed["_id"]) == failed
    # The same job retry through upload(): refused with the same reason, nothing renewed.
    upload_retry = dict(own(failed), _id=failed["_id"], **retry)
    upload_retry.update({k: v for k, v in sample_request("alice").items() if k in (
        STATE, CLEANUP, PUBLICATION, "history", "attempts")})  # fmt: skip
    upload_retry["history"] = [dict(upload_retry["history"][0], to="new")]
    report = upload(owner, [upload_retry])
    assert report.refused == {failed["_id"]: f"not renewed: forbidden: {reason}"}
    assert owner.get(failed["_id"]) == failed
    # Agents never set a namespaced field; the owner's own dataset renews.
    with pytest.raises(Forbidden, match=r"\[immutable\] publish_info cannot change"):
        db_as(accounts, "agent", files_db).put(dict(failed, publish_info={"dataset": dataset}))
    mine = dict(renewal, publish_info={"dataset": "/P/alice-b-v2/USER"})
    owner.put(mine)
    assert owner.get(failed["_id"])["publish_info"] == {"dataset": "/P/alice-b-v2/USER"}


SHAPES = [
    ("a directory as the destination",
     lambda d: d.update(destination_lfn="/store/user/alice/"), "doc.destination_lfn"),
    ("an empty part", lambda d: d.update(destination_lfn=f"/store/user/alice//{_token()}.root"),
     "doc.destination_lfn"),
    ("a source whose first part is ..",
     lambda d: d.update(source_lfn=f"/store/../temp/user/alice/{_token()}.root"),
     "doc.source_lfn"),
    ("a source that is /store/..", lambda d: d.update(source_lfn="/store/.."), "doc.source_lfn"),
    ("a parent that is a directory",
     lambda d: d["publish_info"].update(parents=["/store/user/alice/"]),
     "doc.publish_info.parents[0]"),
    ("a primary name .", lambda d: d["publish_info"].update(dataset="/./alice-x/USER"),
     "doc.publish_info.dataset"),
    ("a processed name ..", lambda d: d["publish_info"].update(dataset="/P/../USER"),
     "doc.publish_info.dataset"),
    ("a processed name starting with .",
     lambda d: d["publish_info"].update(dataset="/P/.alice-x/USER"), "doc.publish_info.dataset"),
    ("a primary name starting with -",
     lambda d: d["publish_info"].update(dataset="/-P/alice-x/USER"), "doc.publish_info.dataset"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "edit", "field"), SHAPES, ids=[s[0] for s in SHAPES])
def test_an_lfn_names_a_file_and_a_dataset_has_real_names(files_db, accounts, case, edit, field):
    """An LFN is a file: no trailing "/", no empty part, no . or .. part anywhere (the first
    part after /store/ was not checked); a dataset's primary and processed names start with a
    letter or a digit. Refused by the store (for admins too) and the model alike, in words."""
    doc = sample_request("alice", publish=True, publish_info={"dataset": "/P/alice-a-v1/USER"})
    edit(doc)
    for who in ("alice", "operator"):
        with pytest.raises(Forbidden) as refused:
            db_as(accounts, who, files_db).create(doc)
        assert refused.value.reason.startswith(f"[schema] {field} "), refused.value.reason
    with pytest.raises(model.Refusal) as judged:
        storejs.check_schema(doc)
    assert judged.value.reason == refused.value.reason
    meaning = next(m for p, m in model.PATTERN_MEANINGS.items() if p in judged.value.reason)
    assert meaning in model.in_words(judged.value.reason)
    assert db_as(accounts, "admin", files_db).get(doc["_id"]) is None


def _parents(n: int, chars: int = 120) -> list[str]:
    stem = "/store/mc/RunIII/Prim/AODSIM/"
    return [stem + f"{i:04d}".rjust(chars - len(stem) - 5, "x") + ".root" for i in range(n)]


# What an owner writes for the catalog is bounded (issue 33: ~230 KB of parents per file made a
# 23 MB catalog block that CouchDB refused for every block of the publisher's call).
PUBLISH_BOUNDS = [
    ("too many parents",
     lambda i: i.update(parents=_parents(model.MAX_PARENTS + 1)),
     f"[schema] doc.publish_info.parents has more than {model.MAX_PARENTS} items"),
    ("a parent LFN too long",
     lambda i: i.update(parents=_parents(1, model.MAX_PARENT_CHARS + 1)),
     f"[schema] doc.publish_info.parents[0] is longer than {model.MAX_PARENT_CHARS} characters"),
    ("too many runs",
     lambda i: i.update(lumis={str(r): [1] for r in range(model.MAX_LUMI_RUNS + 1)}),
     f"[schema] doc.publish_info.lumis has more than {model.MAX_LUMI_RUNS} keys"),
    ("too many lumis in a run",
     lambda i: i.update(lumis={"1": list(range(model.MAX_LUMIS_PER_RUN + 1))}),
     f"[schema] doc.publish_info.lumis.1 has more than {model.MAX_LUMIS_PER_RUN} items"),
    ("publish_info too large as a whole",
     lambda i: i.update(parents=_parents(model.MAX_PARENTS, 490),
                        lumis={str(r): list(range(100_000, 101_500)) for r in range(3)}),
     f"[schema] doc.publish_info is larger than {model.MAX_PUBLISH_INFO_CHARS} characters as "
     "JSON"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "edit", "reason"), PUBLISH_BOUNDS,
                         ids=[b[0] for b in PUBLISH_BOUNDS])  # fmt: skip
def test_what_an_owner_writes_for_the_catalog_is_bounded(files_db, accounts, case, edit, reason):
    """Parents (count, each an LFN of bounded length), lumis (runs, lumis per run) and
    publish_info as a whole: refused by the store (admins too) and the model alike, with the
    same reason; well under the document's own bound."""
    doc = sample_request("alice", publish=True, publish_info={"dataset": "/P/alice-a-v1/USER"})
    edit(doc["publish_info"])
    assert model.doc_chars(doc) < model.MAX_DOC_CHARS
    for who in ("alice", "operator"):
        with pytest.raises(Forbidden) as refused:
            db_as(accounts, who, files_db).create(doc)
        assert refused.value.reason == reason, refused.value.reason
    with pytest.raises(model.Refusal) as judged:
        storejs.check_schema(doc)
    assert judged.value.reason == reason


def test_a_real_cms_file_s_publish_info_fits(files_db, accounts):
    """A file of a CRAB job: a few parents of /store/mc/... LFNs, events, a few runs of lumis
    (a merged file: 2,000 lumi sections of 5-digit numbers over 5 runs)."""
    info = {"dataset": "/P/alice-a-v1/USER", "events": 250_000, "parents": _parents(20, 180),
            "lumis": {str(356_000 + r): list(range(10_000, 10_400)) for r in range(5)}}  # fmt: skip
    doc = sample_request("alice", publish=True, publish_info=info)
    storejs.check_schema(doc)
    db_as(accounts, "alice", files_db).create(doc)
    assert db_as(accounts, "admin", files_db).get(doc["_id"])["publish_info"] == info


@pytest.fixture(scope="module")
def separators(admin) -> dict[str, Database]:
    """Users whose names hold a namespace separator: "alice-bob" ("-" ends a dataset's owner)
    and "alice.x" ("." ends a temporary area's owner)."""
    names = ("alice-bob", "alice.x")
    for name in names:
        store_admin.put_user(admin, name, PASSWORD, [model.USER_ROLE])
    return {name: Server(admin.url, name, PASSWORD) for name in names}


OWNED_BY_ALICE = [
    ("alice-bob", {"publish": True, "publish_info": {"dataset": "/P/alice-bob-x/USER"}},
     '[namespace] publish_info.dataset must be /<primary>/alice-bob-<processed>/USER (the '
     "user's own datasets; a dataset belongs to the part of its processed name before the first "
     '"-", so a user whose name holds a "-" owns none)'),
    ("bob", {"publish": True, "publish_info": {"dataset": "/P/alice-bob-x/USER"}},
     "[namespace] publish_info.dataset must be /<primary>/bob-<processed>/USER (the user's own "
     "datasets)"),
    ("alice.x", {"source_lfn": "/store/temp/user/alice.x/{token}.root"},
     "[namespace] source_lfn must be in /store/temp/user/alice.x/ or /store/temp/user/alice.x."
     "<hash>/ (the user's own temporary area; a temporary area belongs to the part of its name "
     'before the first ".", so a user whose name holds a "." owns none)'),
]  # fmt: skip


@pytest.mark.parametrize(("who", "fields", "reason"), OWNED_BY_ALICE,
                         ids=[o[0] for o in OWNED_BY_ALICE])  # fmt: skip
def test_a_dataset_and_a_temporary_area_have_one_owner(
    files_db, accounts, separators, who, fields, reason
):
    """/P/alice-bob-x/USER was accepted for alice and for a user alice-bob; a temporary area
    /store/temp/user/alice.x/ for alice (hash x) and for a user alice.x. Each belongs to the
    name before the first separator, alice, and to no one else; the refusal says why."""
    fields = {k: v.format(token=_token()) if isinstance(v, str) else v for k, v in fields.items()}
    doc = sample_request(who, **fields)
    db = separators[who].db(files_db) if who in separators else db_as(accounts, who, files_db)
    with pytest.raises(Forbidden) as refused:
        db.create(doc)
    assert refused.value.reason == reason
    with pytest.raises(model.Refusal) as judged:
        storejs.validate_doc_update(doc, None, {"name": who, "roles": [model.USER_ROLE]})
    assert judged.value.reason == reason
    assert db_as(accounts, "admin", files_db).get(doc["_id"]) is None
    mine = sample_request("alice", **fields)  # the same dataset or temporary area: alice's
    db_as(accounts, "alice", files_db).create(mine)
    assert db_as(accounts, "admin", files_db).get(mine["_id"])["user"] == "alice"
