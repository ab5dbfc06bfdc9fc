"""The `gfal` transfer service, ASO's embedded default: jobs are recorded in the job table
(aso.transfer.jobstore) and run by gfal worker processes (agents/gfal_worker.py), which make
checksum-verified third-party copies with gfal2 between the sites' storage endpoints. This
module is the client side that the submitter and the monitor use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aso.transfer.base import JobStatus
from aso.transfer.jobstore import JobTableService, job_status


class GfalService(JobTableService):
    name = "gfal"

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus | None]:
        docs = self.jobs.get_many(job_ids)
        return {
            job_id: (job_status(doc, verified(doc)) if doc else None)
            for job_id, doc in docs.items()
        }


def verified(doc: Mapping[str, Any]) -> bool:
    """The worker's copies of a job that asked for checksum verification are confirmed at the
    destination: gfal2 compared the adler32 of the source, the destination and the request
    (aso.gfal2client.transfer_parameters), and a copy settled after a crash was compared with the
    request's size and adler32 (GfalCopier.resume). Without it, the monitor looks itself."""
    return bool(doc.get("params", {}).get("verify_checksum"))
