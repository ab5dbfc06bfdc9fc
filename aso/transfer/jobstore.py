"""The job table of ASO's own transfer services (gfal and sim), kept in the document store.

FTS3 keeps its jobs itself; the embedded services keep theirs here, in `store.transfers_db`, so
that any process (submitter, monitor, gfal worker, on any host) sees the same jobs and a
restart forgets nothing. One document per job, its id made from the client's key
(`base.job_id_for`), which makes `create` idempotent: a second submission of a key finds the
first job. Per-file progress lives in the job document; cancel requests are recorded in it too.

A job whose document nobody can find is *fenced* before its files get another attempt
(`JobStore.fence`): a document written at its id, at the quorum, that says no file of this job
may run after that time. A job written below a cluster's quorum may still be on one node and
come back as a conflicting branch of the fence (CLUSTER_CONFLICTING_BRANCHES); every reader
therefore sees a job through `merged`, which applies a fence found on any branch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from aso.store import Conflict, Contested, Database, StoreError, rev_order
from aso.transfer.base import (
    CANCELED,
    DONE,
    FAILED,
    PENDING,
    TERMINAL,
    FileStatus,
    JobRequest,
    JobStatus,
    TransferError,
    TransferService,
    job_id_for,
)

log = logging.getLogger("aso.transfer.jobs")

JOB_TYPE = "transfer_job"
QUEUED, RUNNING, FINISHED = "queued", "running", "finished"
SECURITY = {
    "admins": {"names": [], "roles": []},
    "members": {"names": [], "roles": ["aso-agent", "aso-admin"]},
}


def new_job_document(job: JobRequest, service: str, now: float) -> dict[str, Any]:
    return {
        "_id": job_id_for(job.key),
        "type": JOB_TYPE,
        "service": service,
        "key": job.key,
        "state": QUEUED,
        "created": now,
        "user": job.user,
        "task": job.task,
        "source_site": job.source_site,
        "destination_site": job.destination_site,
        "params": {
            "overwrite": job.overwrite,
            "verify_checksum": job.verify_checksum,
            "retry": job.retry,
            "priority": job.priority,
            "max_time_in_queue": job.max_time_in_queue,
        },
        "metadata": dict(job.metadata),
        "files": {
            f.file_id: {
                "index": i,
                "source": f.source,
                "destination": f.destination,
                "size": f.size,
                "adler32": f.adler32,
                "state": PENDING,
                "service_state": "SUBMITTED",
                "reason": None,
                "error_class": None,
                "checksum": None,
                "started": None,
                "ended": None,
                **({"ours": True} if f.ours else {}),
                **({"attempt": f.metadata["attempt"]} if "attempt" in f.metadata else {}),
            }
            for i, f in enumerate(job.files)
        },
        "cancel": {},  # file_id → time the cancel was asked
        "lease": None,  # {"owner", "until"}: the worker running it
    }


def fence_document(job_id: str, service: str, now: float) -> dict[str, Any]:
    """What stands at a job's id once the job is known never to have been made: no file, no
    work (`finished`), and the time from which no file of the job may run (`fenced`)."""
    return {
        "_id": job_id,
        "type": JOB_TYPE,
        "service": service,
        "key": None,
        "state": FINISHED,
        "created": now,
        "fenced": now,
        "files": {},
        "cancel": {},
        "lease": None,
    }


def is_fence(doc: Mapping[str, Any]) -> bool:
    """A fence alone: no job was found where it stands."""
    return doc.get("fenced") is not None and not doc.get("files")


def merged(leaves: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """One job from the live branches of its document (one, unless a cluster stored a job and
    its fence on different nodes: CLUSTER_CONFLICTING_BRANCHES). The job is the winner, or the
    earliest job branch when a fence won; every cancel of any branch holds, and a fence on any
    branch cancels every file from its time: a file not started is canceled there and then,
    one under way is stopped by its worker. The `_rev` is the winner's, to write on."""
    if not leaves:
        return None
    winner = max(leaves, key=lambda leaf: rev_order(leaf["_rev"]))
    jobs = [leaf for leaf in leaves if not is_fence(leaf)]
    base = winner if not is_fence(winner) or not jobs else min(jobs, key=lambda j: j["created"])
    job = {k: v for k, v in base.items() if k != "_conflicts"}
    job["_rev"] = winner["_rev"]
    job["files"] = {fid: dict(entry) for fid, entry in base.get("files", {}).items()}
    cancel: dict[str, float] = {}
    for leaf in leaves:
        for file_id, at in (leaf.get("cancel") or {}).items():
            cancel[file_id] = min(at, cancel.get(file_id, at))
    fences = [leaf["fenced"] for leaf in leaves if leaf.get("fenced") is not None]
    if fences:
        fenced = job["fenced"] = min(fences)
        for file_id, entry in job["files"].items():
            cancel[file_id] = min(fenced, cancel.get(file_id, fenced))
            if entry["state"] == PENDING:
                finish_file(entry, CANCELED, fenced, reason="job fenced", error_class="canceled")
    job["cancel"] = cancel
    return job


def file_status(file_id: str, entry: Mapping[str, Any], verified: bool = False) -> FileStatus:
    return FileStatus(
        file_id=file_id,
        state=entry["state"],
        service_state=entry["service_state"],
        reason=entry.get("reason"),
        error_class=entry.get("error_class"),
        checksum=entry.get("checksum"),
        started=entry.get("started"),
        ended=entry.get("ended"),
        verified=verified and entry["state"] == DONE,
    )


@dataclass(frozen=True)
class UnfinishedJob:
    """A row of the `unfinished` view: enough of a job to decide whether to claim it."""

    key: list[Any]
    id: str
    state: str
    user: str
    sites: tuple[str, str]  # (source, destination)
    lease: dict[str, Any] | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> UnfinishedJob:
        user, source, destination, until, owner = row["value"]
        lease = {"until": until, "owner": owner} if until else None
        return cls(row["key"], row["id"], row["key"][1], user, (source, destination), lease)


class JobStore:
    def __init__(self, db: Database, service: str):
        self.db = db
        self.service = service

    def create(self, job: JobRequest) -> str:
        """Record the job; the id of the existing one if the key was submitted before."""
        doc = new_job_document(job, self.service, time.time())
        try:
            self.db.create(doc)
            log.debug("job %s (key %s) created with %d files", doc["_id"], job.key, len(job.files))
        except Conflict:
            log.info("job %s (key %s) exists: not created again", doc["_id"], job.key)
        return cast(str, doc["_id"])

    def create_many(self, jobs: Sequence[JobRequest]) -> list[str]:
        """Record many jobs in one bulk write (the submitter's batch); a job whose key was
        submitted before keeps its existing document (the conflict is its idempotence)."""
        now = time.time()
        docs = [new_job_document(job, self.service, now) for job in jobs]
        for doc, result in zip(docs, self.db.bulk_write(docs), strict=True):
            if result.ok:
                log.debug(
                    "job %s (key %s) created with %d files",
                    doc["_id"],
                    doc["key"],
                    len(doc["files"]),
                )
            elif result.conflict:
                log.info("job %s (key %s) exists: not created again", doc["_id"], doc["key"])
            else:
                raise result.as_error(self.db.name)
        return [doc["_id"] for doc in docs]

    def exists(self, key: str) -> str | None:
        job_id = job_id_for(key)
        doc = self.get(job_id)
        return job_id if doc is not None and not is_fence(doc) else None

    def get(self, job_id: str) -> dict[str, Any] | None:
        """The job (`merged` over its branches), or None."""
        return self._merged(self.db.get(job_id, conflicts=True))

    def get_many(self, job_ids: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        """Each job (`merged` over its branches) or None; a fence alone is None: no job."""
        found = self.db.get_many(job_ids, conflicts=True)
        jobs = {job_id: self._merged(doc) for job_id, doc in found.items()}
        return {
            job_id: None if job is None or is_fence(job) else job for job_id, job in jobs.items()
        }

    def _merged(self, doc: dict[str, Any] | None) -> dict[str, Any] | None:
        """A job document read with its `_conflicts`, as `merged` over all its branches."""
        if doc is None:
            return None
        return merged(self.db.leaves(doc["_id"]) if doc.get("_conflicts") else [doc])

    def fence(self, job_id: str, now: float, tries: int = 3) -> bool:
        """Make sure the job `job_id` never runs a file if no job of that id exists: True when a
        fence stands at its id, written at the quorum (a write of the job below the quorum
        that comes back later is a branch the fence cancels: `merged`); False when the job
        exists (its files are followed, or cancelled, as the job's). TransferError: the
        store did not take the fence at the quorum, or kept changing it; ask again later.
        (CLUSTER_READ_MAY_MISS: a job a read did not find is fenced, never taken as absent.)"""
        for _ in range(tries):
            try:
                doc = self.get(job_id)
                if doc is not None and not is_fence(doc):
                    return False
                if doc is None:
                    self.db.create(fence_document(job_id, self.service, now))
                else:  # a fence of an earlier look, maybe below the quorum: at the quorum now
                    self.db.put({**doc, "confirmed": now})
                log.info("job %s: no such job; fenced", job_id)
                return True
            except Contested as exc:
                raise TransferError(f"fence of job {job_id} stored below the quorum") from exc
            except Conflict:
                continue  # written meanwhile: look again
            except StoreError as exc:
                raise TransferError(f"job {job_id} not fenced: {exc}") from exc
        raise TransferError(f"job {job_id} kept changing while it was fenced")

    def update(
        self, job_id: str, mutate: Callable[[dict[str, Any]], bool], attempts: int = 20
    ) -> dict[str, Any] | None:
        """Read-modify-write of one job; `mutate` returns False when there is nothing to write.
        Conflicts (the worker and a cancel racing) are resolved by reading again."""
        for _ in range(attempts):
            doc = self.get(job_id)
            if doc is None:
                return None
            if not mutate(doc):
                return doc
            try:
                doc["_rev"] = self.db.put(doc)
                return doc
            except Conflict:
                continue
        raise Conflict(409, "conflict", f"job {job_id} kept changing under {attempts} updates")

    def request_cancel(self, job_id: str, file_ids: Iterable[str] | None, now: float) -> None:
        def mark(doc: dict[str, Any]) -> bool:
            wanted = list(doc["files"]) if file_ids is None else list(file_ids)
            changed = False
            for file_id in wanted:
                entry = doc["files"].get(file_id)
                if entry and entry["state"] not in TERMINAL and file_id not in doc["cancel"]:
                    doc["cancel"][file_id] = now
                    changed = True
            return changed

        self.update(job_id, mark)

    def unfinished_page(
        self, state: str, after: list[Any] | None = None, limit: int = 250
    ) -> list[UnfinishedJob]:
        """Up to `limit` jobs of ours in `state`, oldest first, from after the key `after`
        (None: from the first), as the view shows them (no document read)."""
        rows = self.db.view(
            "jobs",
            "unfinished",
            start_key=after if after is not None else [self.service, state],
            end_key=[self.service, state, {}],
            limit=limit + (after is not None),
        ).rows
        jobs = [UnfinishedJob.of(row) for row in rows if row["key"] != after]
        return jobs[:limit]


def job_status(doc: Mapping[str, Any], verified: bool = False) -> JobStatus:
    """A job's status; `verified`: its service compared each copy done with the request's
    adler32 (FileStatus.verified)."""
    return JobStatus(
        job_id=doc["_id"],
        key=doc.get("key"),
        files={fid: file_status(fid, entry, verified) for fid, entry in doc["files"].items()},
    )


def finish_file(
    entry: dict[str, Any],
    state: str,
    now: float,
    *,
    reason: str | None = None,
    error_class: str | None = None,
    checksum: str | None = None,
    service_state: str | None = None,
) -> None:
    """Record the end of one file's transfer in its job entry."""
    entry["state"] = state
    entry["service_state"] = (
        service_state or {DONE: "FINISHED", FAILED: "FAILED", CANCELED: "CANCELED"}[state]
    )
    entry["reason"] = reason
    entry["error_class"] = error_class
    entry["checksum"] = checksum
    entry["ended"] = now


class JobTableService(TransferService):
    """A transfer service whose jobs live in the job table (the gfal back end, whose workers
    run them, and the simulator, which computes their fates): submitting, looking up and
    cancelling are the table's; each says how it reads a job's status."""

    def __init__(self, db: Database, clock: Callable[[], float] = time.time):
        self.jobs = JobStore(db, self.name)
        self.clock = clock

    def submit(self, job: JobRequest) -> str:
        return self.jobs.create(job)

    def submit_many(self, jobs: Sequence[JobRequest]) -> list[str | TransferError]:
        return list(self.jobs.create_many(jobs))

    def lookup(self, key: str) -> str | None:
        return self.jobs.exists(key)

    def cancel(self, job_id: str, file_ids: Sequence[str] | None = None) -> None:
        self.jobs.request_cancel(job_id, file_ids, self.clock())

    def make_absent(self, job_id: str) -> bool:
        return self.jobs.fence(job_id, self.clock())
