"""`aso db migrate`: the documents still in a state that only earlier versions of 0.1.0 wrote,
rewritten once as today's equivalent (docs/usage.md, "Upgrading a store").

The store's validation no longer knows those states, so the migration writes with the admin
account, which the validation judges by the schema alone: what it writes is in today's states,
and no validation hole is left for anyone else. Each document is mapped so that the agents
finish it as they finish today's:

* `acquired` (an earlier submitter's intent, written before its job went to the service, with a
  lease naming the job key) → `submitted`, under the id the key gives the job
  (aso.transfer.base.job_id_for), with a new attempt and the lease kept: the monitor follows
  the job if the service has it under that id; else, once the lease has ended, it asks the
  service for the key and records the job it finds, or fences the job and puts the file back
  to `new` (agents/monitor.py, `not_at_the_service`), as for any `submitted` file whose job the
  service never got. Without a job key no job was ever asked for: `new`.
* `kill_requested` with no job recorded (an `acquired` file its owner killed): the job of its
  key recorded the same way, lease kept, so that the monitor cancels it or, finding none, ends
  the file `killed`; without a key, `killed` at once.
* `publishing` (an earlier publisher's block name, recorded before its catalog call) →
  `pending`, the block's name kept in the history entry: the publisher makes the block again,
  and the catalog answers that it holds it already, or that it holds the files in another
  block of the dataset (the publisher records them published there before), or takes it.

Idempotent: a migrated document is in none of those states; a second run finds nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aso import model
from aso.core import request
from aso.model import ADMIN, PUBLICATION, STATE, Change
from aso.store import Database
from aso.transfer.base import job_id_for

ACQUIRED = "acquired"  # state axis, earlier submitters
PUBLISHING = "publishing"  # publication axis, earlier publishers
KILL_REQUESTED = "kill_requested"
BY = "aso-db-migrate"  # the history entries' `by`
PAGE = 1000  # documents read and written at once

# What was done to a document (the counts `aso db migrate` prints).
TO_SUBMITTED = "acquired → submitted (its job followed or released by the monitor)"
TO_NEW = "acquired → new (no job key: no job was asked for)"
JOB_RECORDED = "kill_requested: the job of its key recorded (cancelled by the monitor)"
TO_KILLED = "kill_requested → killed (no job key: no job was asked for)"
TO_PENDING = "publishing → pending (the publisher finds its block in the catalog, or makes it)"
OUTCOMES = (TO_SUBMITTED, TO_NEW, JOB_RECORDED, TO_KILLED, TO_PENDING)


def migrated(doc: Mapping[str, Any], service: str, now: float) -> tuple[list[str], request.Doc]:
    """What is done to `doc` (OUTCOMES; none: nothing to migrate) and the document to write.
    `service`: the transfer service's name (`transfer.backend`), for the job recorded."""
    done: list[str] = []
    new = dict(doc)
    lease = new.get("lease") or {}
    key = lease.get("job_key")
    if new.get(STATE) == ACQUIRED:
        reason = f"migrated from {ACQUIRED}, the intent of an earlier submitter"
        if key:
            fields = {**request.job_fields(new, job_id_for(key), service, now), "lease": lease}
            new = _moved(new, STATE, "submitted", reason, now, **fields)
            done.append(TO_SUBMITTED)
        else:
            new = _moved(new, STATE, "new", f"{reason}, with no job key", now, lease=None)
            done.append(TO_NEW)
    elif new.get(STATE) == KILL_REQUESTED and not new.get("transfer"):
        if key:
            fields = {**request.job_fields(new, job_id_for(key), service, now), "lease": lease}
            new = model.transition(new, [], ADMIN, at=now, **fields)
            done.append(JOB_RECORDED)
        else:
            reason = f"{request.KILLED_BEFORE_ITS_JOB} was submitted (no job key)"
            new = _moved(new, STATE, "killed", reason, now, lease=None)
            done.append(TO_KILLED)
    if new.get(PUBLICATION) == PUBLISHING:
        block = new.get("publication_block")
        reason = f"migrated from {PUBLISHING} in block {block}, an earlier publisher's"
        new = _moved(new, PUBLICATION, "pending", reason, now, publication_block=None)
        done.append(TO_PENDING)
    return done, new


def _moved(
    doc: Mapping[str, Any], axis: str, to: str, reason: str, now: float, **fields: Any
) -> request.Doc:
    return model.transition(doc, [Change(axis, to, BY, reason)], ADMIN, at=now, **fields)


def candidates(db: Database) -> list[str]:
    """The ids of the documents that may need migrating, from the by_state view (key [state,
    cleanup, publication]): every `acquired` and `kill_requested` one, and every `publishing`
    one whatever its state and cleanup."""
    ranges = [([ACQUIRED], [ACQUIRED, {}]), ([KILL_REQUESTED], [KILL_REQUESTED, {}])]
    rows = [
        row
        for start, end in ranges
        for row in db.view(
            "asyncstageout", "by_state", start_key=start, end_key=end, reduce=False
        ).rows
    ]
    keys = [
        [state, cleanup, PUBLISHING]
        for state in (*model.STATES[STATE], ACQUIRED)
        for cleanup in model.STATES[model.CLEANUP]
    ]
    rows += db.view("asyncstageout", "by_state", keys=keys, reduce=False).rows
    return list(dict.fromkeys(row["id"] for row in rows))


@dataclass
class Migration:
    """What `migrate` did: documents per outcome, and those it could not write."""

    looked_at: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    refused: dict[str, str] = field(default_factory=dict)  # id → why

    @property
    def written(self) -> int:
        return sum(self.counts.values())


def pages(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), PAGE):
        yield ids[start : start + PAGE]


def migrate(
    db: Database,
    service: str,
    ids: list[str],
    now: Callable[[], float] = model.now,
    advance: Callable[[int], None] = lambda n: None,
) -> Migration:
    """Migrate the documents of `ids` (`candidates`), a page at a time, with `db` an admin's;
    `advance(n)` after each page. A document written meanwhile is read again and decided
    again (Database.write_decided)."""
    report = Migration(looked_at=len(ids))
    outcomes: dict[str, list[str]] = {}  # id → what was done to it, as last decided

    def decide(doc: dict[str, Any]) -> dict[str, Any] | None:
        done, new = migrated(doc, service, now())
        outcomes[doc["_id"]] = done
        return new if done else None

    for page in pages(ids):
        found = [doc for doc in db.get_many(page).values() if doc is not None]
        outcome = db.write_decided(found, decide)
        for doc in outcome.written:
            report.counts.update(outcomes[doc["_id"]])
        for result in outcome.refused:
            report.refused[result.id] = f"{result.error}: {result.reason}"
        for doc_id in outcome.conflicted:
            report.refused[doc_id] = "written by others at each try: run it again"
        advance(len(page))
    return report
