"""The job table of ASO's own transfer services (gfal and sim), kept in the document store.

FTS3 keeps its jobs itself; the embedded services keep theirs here, in `store.transfers_db`, so
that any process (submitter, monitor, gfal worker, on any host) sees the same jobs and a
restart forgets nothing. One document per job, its id made from the client's key
(`base.job_id_for`), which makes `create` idempotent: a second submission of a key finds the
first job. Per-file progress lives in the job document; cancel requests are recorded in it too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from aso.store import Conflict, Database
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
JOBS_DDOC = {
    "_id": "_design/jobs",
    "views": {
        "unfinished": {
            # Jobs a worker may have to run: [service, state, created].
            "map": "function (doc) { if (doc.type === 'transfer_job' && doc.state !== "
            "'finished') { emit([doc.service, doc.state, doc.created], null); } }",
        }
    },
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
        return job_id if self.db.get(job_id) is not None else None

    def get_many(self, job_ids: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        return self.db.get_many(job_ids)

    def update(
        self, job_id: str, mutate: Callable[[dict[str, Any]], bool], attempts: int = 20
    ) -> dict[str, Any] | None:
        """Read-modify-write of one job; `mutate` returns False when there is nothing to write.
        Conflicts (the worker and a cancel racing) are resolved by reading again."""
        for _ in range(attempts):
            doc = self.db.get(job_id)
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

    def unfinished(
        self, states: tuple[str, ...] = (QUEUED, RUNNING), limit: int = 100
    ) -> list[dict[str, Any]]:
        docs: list[dict[str, Any]] = []
        for state in states:
            rows = self.db.view(
                "jobs",
                "unfinished",
                start_key=[self.service, state],
                end_key=[self.service, state, {}],
                limit=limit,
                include_docs=True,
            ).rows
            docs.extend(row["doc"] for row in rows if row.get("doc"))
        return docs


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
