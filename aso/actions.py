"""What users do to their requests: kill and resubmit, task by task (or job by job); and what
operators set: a site banned, draining or allowed, a user banned or allowed (`set_control`,
its meaning aso/core/controls.py's).

Both go through the owner's transitions of the model, which the store's validate_doc_update
enforces: a kill is immediate for a file with nothing in flight (`new`, `retry`,
`failed_attempt` → `killed`) and a request for the agents otherwise (`submitted` →
`kill_requested`: the monitor cancels the transfer, then marks it killed); a resubmission puts
`failed` and `killed` files back to `new`. A write that conflicts (an agent moved the file
meanwhile) is read again and decided again, so a kill racing the submitter still lands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aso import model
from aso.config import HoldsConfig
from aso.core import controls, holds
from aso.model import STATE, Change
from aso.monitoring import queries
from aso.store import Conflict, Database, StoreError

log = logging.getLogger("aso.actions")

KILL = {
    "new": "killed",
    "retry": "killed",
    "failed_attempt": "killed",
    "submitted": "kill_requested",
}
RESUBMIT = {"failed": "new", "killed": "new"}
REPUBLISH = {"publication_failed": "pending"}
ROUNDS = 5  # reads again after conflicts, at most
DOCS_PAGE = 500  # requests read at once (the front end gives at most 1,000 documents a read)


@dataclass
class ActionReport:
    changed: dict[str, str] = field(default_factory=dict)  # id → new state
    unchanged: dict[str, str] = field(default_factory=dict)  # id → state (nothing to do)
    refused: dict[str, str] = field(default_factory=dict)  # id → reason

    @property
    def ok(self) -> bool:
        return not self.refused


def task_requests(db: Database, task: str, job: str | None = None) -> list[dict[str, Any]]:
    """Every request of the task (or of one job), read in pages: the front end gives at most
    1,000 documents a read, and a kill of a larger task had stopped at its first 1,000 files
    (round 39)."""
    pages = queries.task_row_pages(db, task, job, DOCS_PAGE, include_docs=True)
    return [row["doc"] for rows in pages for row in rows if row.get("doc")]


def _transition_all(
    db: Database,
    docs: list[dict[str, Any]],
    targets: Mapping[str, str],
    by: str,
    reason: str,
    axis: str = STATE,
) -> ActionReport:
    def decide(doc: dict[str, Any]) -> dict[str, Any] | None:
        target = targets.get(doc[axis])
        if target is None:
            return None
        return model.transition(doc, [Change(axis, target, by, reason)], model.OWNER)

    outcome = db.write_decided(docs, decide, ROUNDS)
    report = ActionReport()
    report.changed.update((d["_id"], d[axis]) for d in outcome.written)
    report.unchanged.update((d["_id"], d[axis]) for d in outcome.declined)
    report.refused.update((r.id, f"{r.error}: {r.reason}") for r in outcome.refused)
    report.refused.update((i, "deleted meanwhile") for i in outcome.gone)
    report.refused.update(
        (i, f"conflict: changed by agents {ROUNDS} times in a row; try again")
        for i in outcome.conflicted
    )
    return report


def kill(db: Database, task: str, job: str | None, by: str) -> ActionReport:
    return _transition_all(db, task_requests(db, task, job), KILL, by, "killed by the user")


DISCARDED = (
    "its temporary copy was deleted after it failed (cleaner.failed_grace): only a job retry's"
    " new file can be resubmitted"
)


def resubmit(db: Database, task: str, job: str | None, by: str) -> ActionReport:
    """Failed and killed files back to `new`; one whose temporary copy the cleaner discarded
    is refused (the store refuses it too), with why."""
    docs = task_requests(db, task, job)
    gone = {d["_id"] for d in docs if d[STATE] in RESUBMIT and d[model.CLEANUP] == "cleaned"}
    report = _transition_all(
        db, [d for d in docs if d["_id"] not in gone], RESUBMIT, by, "resubmitted by the user"
    )
    report.refused.update((i, DISCARDED) for i in sorted(gone))
    return report


def republish(db: Database, task: str, job: str | None, by: str) -> ActionReport:
    """`aso publish --retry`: files whose publication failed go back to the publisher."""
    return _transition_all(
        db,
        task_requests(db, task, job),
        REPUBLISH,
        by,
        "publication retried by the user",
        axis=model.PUBLICATION,
    )


ACTIONS: dict[str, Callable[[Database, str, str | None, str], ActionReport]] = {
    "kill": kill,
    "resubmit": resubmit,
    "publish --retry": republish,
}


# --- operators' controls -----------------------------------------------------------------------
def set_control(
    db: Database,
    kind: str,
    name: str,
    mode: str,
    reason: str,
    by: str,
    at: float,
    direction: str = model.BOTH,
) -> dict[str, Any]:
    """Set a site's or user's control (an operator's write: the store refuses anyone else's),
    keeping every earlier setting in its history; the document as written."""
    for _ in range(ROUNDS):
        current = db.get(model.control_id(kind, name))
        doc = controls.changed(current, kind, name, mode, reason, by, at, direction)
        try:
            doc["_rev"] = db.put(doc)
        except Conflict:
            continue  # another operator's write meanwhile: on top of theirs
        return doc
    raise Conflict(409, "conflict", f"{kind} {name}: changed by others {ROUNDS} times in a row")


# --- holds -------------------------------------------------------------------------------------
def start_holds(
    db: Database,
    starts: Mapping[str, Mapping[str, Any]],
    by: str,
    now: float,
    config: HoldsConfig,
) -> int:
    """Start (or widen) holds, `starts` by hold id with `holds.started`'s figures (the retry
    manager's from held files, the submitter's from its admission): one write each, read
    again and decided again when someone else wrote it meanwhile; the holds written. A store
    that does not answer writes none: their files wait a cycle."""

    def decide(current: dict[str, Any]) -> dict[str, Any] | None:
        found = current if "_rev" in current else None
        return holds.started(found, **starts[current["_id"]], by=by, now=now, config=config)

    try:
        outcome = db.write_decided([{"_id": key} for key in starts], decide)
    except StoreError as exc:
        log.warning("holds not written (%s): their files wait a cycle", exc)
        return 0
    for doc in outcome.written:
        log.info("hold %s: %s", doc["_id"], holds.hold_of(doc).says())
    for refused in outcome.refused:
        log.warning("hold %s not written: %s", refused.id, refused.reason)
    return len(outcome.written)


def release_site_holds(
    db: Database, sites: Iterable[str], by: str, now: float, config: HoldsConfig
) -> int:
    """End the sites' holds in force, each site having just answered a look: the hold checker's
    own rule (`holds.checked`: a site's hold passes when its storage answers), applied by
    whoever saw it answer; the holds released."""
    answered = holds.Look(None, None, probed=True)

    def decide(current: dict[str, Any]) -> dict[str, Any] | None:
        return holds.checked(current, answered, by, now, config)

    try:
        found = db.get_many([model.hold_id(site) for site in sites])
        outcome = db.write_decided([doc for doc in found.values() if doc], decide)
    except StoreError as exc:
        log.warning("sites' holds not released (%s): the hold checker will", exc)
        return 0
    for doc in outcome.written:
        log.info("hold %s %s: %s", doc["_id"], doc["state"], doc["history"][-1]["reason"])
    return len(outcome.written)


class NotHeld(ValueError):
    """The hold asked for does not hold (there is none, or it was released or ended)."""


def end_hold(
    db: Database, site: str, user: str, state: str, reason: str, by: str, at: float
) -> dict[str, Any]:
    """Release or cancel the hold of `user`'s files at `site` (no `user`: the site's hold of
    everyone's), its user's write or an operator's (the store refuses anyone else); the
    document as written."""
    for _ in range(ROUNDS):
        current = db.get(model.hold_id(site, user))
        if current is None or current.get("state") != model.HOLD_ACTIVE:
            said = "no hold" if current is None else f"the hold is {current.get('state')}"
            whose = f"{user}'s" if user else "every user's"
            raise NotHeld(f"{whose} files at {site} are not held: {said}")
        doc = holds.ended(current, state, reason, by, at, by_owner=True)
        try:
            doc["_rev"] = db.put(doc)
        except Conflict:
            continue  # the hold checker's or another's write meanwhile: decide again
        return doc
    raise Conflict(409, "conflict", f"hold of {user} at {site}: changed {ROUNDS} times in a row")
