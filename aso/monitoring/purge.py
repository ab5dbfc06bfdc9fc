"""Purging finished requests, each counted in the statistics exactly once.

The files database must stay small at any load, and the statistics must not change when a
request leaves it. A request is counted in the statistics database (aso.monitoring.statistics) if
and only if the purge deleted it, and then once, by this protocol:

1. **select** finished requests (`_design/stats/_view/purgeable`: nothing more will happen to
   them, model.is_final) whose last change is older than `analytics.purge_after`;
2. **intend**: write a *pending* batch document into the statistics database listing, for each
   of them, the revision read, its creation time and what it counts for (`counts`: the live
   views' contribution.js, aso/provision/storejs.py contribution). Nothing is counted yet: the
   views add up complete batches only;
3. **delete** the requests at the revisions read, in one bulk write;
4. **settle**: each request of the batch is now either gone (deleted by this try or an earlier
   one of the same batch; or deleted and uploaded again since, a new request with another
   creation time) or still there, changed since it was read (its owner resubmitted it, an
   operator repaired it): such a request is not this batch's; it will be counted when it ends
   again, in a later batch;
5. **complete** the batch with the rows of the gone requests only.

A crash at any step leaves a pending batch; the next cycle completes the pending batches (steps
3 to 5 again, all idempotent) before it selects anything new, so nothing is counted twice or
lost. Two purgers working at once could both settle one request as gone: a lease document
(`lease:purge`, renewed before every batch) makes one purger work at a time.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aso import model
from aso.monitoring import statistics
from aso.store import Conflict, Database

log = logging.getLogger("aso.monitoring.purge")

LEASE_ID = "lease:purge"
LEASE = "analytics_lease"


@dataclass
class PurgeReport:
    purged: int = 0  # requests deleted and counted
    kept: int = 0  # changed since they were read: left for a later batch
    batches: int = 0
    recovered: int = 0  # pending batches of an earlier, interrupted purge completed
    batch_ids: list[str] = field(default_factory=list)

    def add(self, other: PurgeReport) -> None:
        self.purged += other.purged
        self.kept += other.kept
        self.batches += other.batches
        self.recovered += other.recovered
        self.batch_ids += other.batch_ids


# --- the lease ---------------------------------------------------------------------------------
def acquire_lease(stats_db: Database, holder: str, now: float, duration: float) -> bool:
    """Take or renew the purge lease for `duration` seconds; False while another holder's lease
    runs (or when another purger took it at the same moment)."""
    lease = stats_db.get(LEASE_ID)
    if lease and lease["holder"] != holder and lease["until"] > now:
        return False
    doc = {"_id": LEASE_ID, "type": LEASE, "holder": holder, "until": now + duration, "at": now}
    if lease:
        doc["_rev"] = lease["_rev"]
    try:
        stats_db.put(doc)
    except Conflict:
        return False
    return True


def release_lease(stats_db: Database, holder: str) -> None:
    lease = stats_db.get(LEASE_ID)
    if lease and lease["holder"] == holder and lease["until"] > 0:
        with contextlib.suppress(Conflict):  # taken over meanwhile: not ours to release
            stats_db.put(dict(lease, until=0))


# --- the protocol --------------------------------------------------------------------------------
def select(files_db: Database, older_than: float, limit: int) -> list[dict[str, Any]]:
    """Finished requests last changed before `older_than` (oldest first), at most `limit`."""
    rows = files_db.view(
        statistics.DDOC, "purgeable", end_key=older_than, limit=limit, include_docs=True
    ).rows
    docs = [r["doc"] for r in rows if r.get("doc")]
    # The view may lag a change by a moment; the document read is what decides.
    return [d for d in docs if model.is_final(d) and float(d["last_update"]) <= older_than]


# What a request counts for (None while its copy is not over): the live views' function.
Counts = Callable[[Mapping[str, Any]], statistics.Contribution | None]


def intend(
    stats_db: Database,
    docs: Sequence[Mapping[str, Any]],
    *,
    by: str,
    now: float,
    counts: Counts,
) -> dict[str, Any]:
    """Step 2: the pending batch of `docs` (written; returned with its revision)."""
    requests = {}
    for doc in docs:
        contribution = counts(doc)
        requests[doc["_id"]] = {
            "rev": doc["_rev"],
            "created": doc["created"],
            "counts": contribution.to_json() if contribution else None,
        }
    batch = {
        "_id": f"{statistics.BATCH_PREFIX}{now:014.3f}:{uuid.uuid4().hex[:8]}",
        "type": statistics.BATCH,
        "schema": statistics.SCHEMA_VERSION,
        "status": statistics.PENDING,
        "written": round(now, 3),
        "by": by,
        "requests": requests,
        "rows": [],
    }
    batch["_rev"] = stats_db.create(batch)
    return batch


def delete(files_db: Database, batch: Mapping[str, Any]) -> None:
    """Step 3: delete the batch's requests at the revisions read (refusals are settled next),
    and the conflicting branches a CouchDB cluster left beside them: once the winner is
    deleted, such a branch would be the document again (CLUSTER_CONFLICTING_BRANCHES)."""
    present = files_db.get_many(batch["requests"], conflicts=True)
    files_db.withdraw(
        {
            rid: doc["_conflicts"]
            for rid, doc in present.items()
            if doc and doc.get("_conflicts") and doc["_rev"] == batch["requests"][rid]["rev"]
        }
    )
    files_db.bulk_write(
        [
            {"_id": rid, "_rev": entry["rev"], "_deleted": True}
            for rid, entry in batch["requests"].items()
        ]
    )


def settle(files_db: Database, batch: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Step 4: (gone, kept) request ids of the batch."""
    present = files_db.get_many(batch["requests"])
    gone, kept = [], []
    for rid, entry in batch["requests"].items():
        doc = present[rid]
        if doc is None or doc.get("created") != entry["created"]:
            gone.append(rid)  # deleted (by this batch: it alone held the revision read)
        else:
            kept.append(rid)
    return gone, kept


def complete(stats_db: Database, batch: Mapping[str, Any], gone: Sequence[str]) -> dict[str, Any]:
    """Step 5: the batch counts its gone requests; its list of requests becomes a number."""
    tally = statistics.Tally()
    for rid in gone:
        data = batch["requests"][rid]["counts"]
        if data is not None:
            tally.add(statistics.Contribution.from_json(data))
    done = {key: value for key, value in batch.items() if key not in ("requests", "rows", "status")}
    done.update(
        status=statistics.COMPLETE,
        rows=tally.documents(),
        requests={"purged": len(gone), "kept": len(batch["requests"]) - len(gone)},
        completed=round(time.time(), 3),
    )
    done["_rev"] = stats_db.put(done)
    return done


def finish(files_db: Database, stats_db: Database, batch: Mapping[str, Any]) -> PurgeReport:
    """Steps 3 to 5 for a pending batch (a new one, or one an interrupted purge left)."""
    delete(files_db, batch)
    gone, kept = settle(files_db, batch)
    complete(stats_db, batch, gone)
    for rid in kept:
        log.info("request %s changed since batch %s read it: kept for later", rid, batch["_id"])
    log.info("batch %s: %d requests purged and counted", batch["_id"], len(gone))
    return PurgeReport(purged=len(gone), kept=len(kept), batches=1, batch_ids=[batch["_id"]])


def pending_batches(stats_db: Database) -> list[dict[str, Any]]:
    rows = stats_db.view(statistics.DDOC, "pending", include_docs=True).rows
    return [r["doc"] for r in rows if r.get("doc") and r["doc"].get("status") == statistics.PENDING]


def purge(
    files_db: Database,
    stats_db: Database,
    *,
    older_than: float,
    batch_size: int,
    by: str,
    lease: float,
    counts: Counts,
    max_batches: int = 1000,
) -> PurgeReport:
    """Count and delete every finished request last changed before `older_than`, in batches;
    first complete what an interrupted purge left. Returns at once, with nothing done, while
    another purger holds the lease."""
    report = PurgeReport()
    if not acquire_lease(stats_db, by, time.time(), lease):
        log.info("another purger holds the lease; not purging")
        return report
    for batch in pending_batches(stats_db):
        log.warning("completing batch %s left pending by %s", batch["_id"], batch.get("by"))
        report.add(finish(files_db, stats_db, batch))
        report.recovered += 1
    for _ in range(max_batches):
        docs = select(files_db, older_than, batch_size)
        if not docs:
            break
        if not acquire_lease(stats_db, by, time.time(), lease):
            log.warning("purge lease lost to another purger; stopping")
            break
        batch = intend(stats_db, docs, by=by, now=time.time(), counts=counts)
        report.add(finish(files_db, stats_db, batch))
        if len(docs) < batch_size:
            break
    return report
