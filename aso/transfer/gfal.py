"""The `gfal` transfer service, ASO's embedded default: jobs are recorded in the job table
(aso.transfer.jobstore) and run by gfal worker processes (agents/gfal_worker.py), which make
checksum-verified third-party copies with gfal2 between the sites' storage endpoints. This
module is the client side that the submitter and the monitor use."""

from __future__ import annotations

import time
from collections.abc import Sequence

from aso.store import Database
from aso.transfer.base import JobRequest, JobStatus, TransferError, TransferService
from aso.transfer.jobstore import JobStore, job_status


class GfalService(TransferService):
    name = "gfal"

    def __init__(self, db: Database):
        self.jobs = JobStore(db, self.name)

    def submit(self, job: JobRequest) -> str:
        return self.jobs.create(job)

    def submit_many(self, jobs: Sequence[JobRequest]) -> list[str | TransferError]:
        return list(self.jobs.create_many(jobs))

    def lookup(self, key: str) -> str | None:
        return self.jobs.exists(key)

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus | None]:
        docs = self.jobs.get_many(job_ids)
        return {job_id: (job_status(doc) if doc else None) for job_id, doc in docs.items()}

    def cancel(self, job_id: str, file_ids: Sequence[str] | None = None) -> None:
        self.jobs.request_cancel(job_id, file_ids, time.time())
