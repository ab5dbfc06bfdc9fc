"""The `gfal` transfer service, ASO's embedded default: jobs are recorded in the job table
(aso.transfer.jobstore) and run by gfal worker processes (agents/gfal_worker.py), which make
checksum-verified third-party copies with gfal2 between the sites' storage endpoints. This
module is the client side that the submitter and the monitor use."""

from __future__ import annotations

from collections.abc import Sequence

from aso.transfer.base import JobStatus
from aso.transfer.jobstore import JobTableService, job_status


class GfalService(JobTableService):
    name = "gfal"

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus | None]:
        docs = self.jobs.get_many(job_ids)
        return {job_id: (job_status(doc) if doc else None) for job_id, doc in docs.items()}
