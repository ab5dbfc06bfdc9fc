"""Transfer services behind one small interface (aso.transfer.base): gfal (embedded default),
fts3 (production) and sim (the simulator). `open_service(config)` picks the configured one,
counted and timed for the metrics (aso.metrics: aso_transfer_service_*)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aso.config import Config
from aso.metrics import SERVICE_ERRORS, Timed
from aso.store import Server
from aso.transfer.base import Fence, JobRequest, JobStatus, TransferError, TransferService


def open_service(config: Config, server: Server | None = None) -> TransferService:
    """The transfer service of `transfer.backend`, as the agents use it."""
    return Measured(_backend(config, server))


def _backend(config: Config, server: Server | None) -> TransferService:
    backend = config.transfer.backend
    if backend == "fts3":
        from aso.transfer.fts3 import Fts3Service

        return Fts3Service(config)
    server = server or Server.from_config(config, account="agent")
    jobs_db = server.db(config.store.transfers_db)
    if backend == "sim":
        from aso.transfer.sim import SimService

        return SimService(jobs_db, config.sim)
    from aso.transfer.gfal_service import GfalService

    return GfalService(jobs_db)


class Measured(TransferService):
    """A transfer service whose calls are counted and timed; anything else is the service's."""

    def __init__(self, service: TransferService):
        self.service = service
        self.name = service.name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.service, attribute)

    def submit(self, job: JobRequest) -> str:
        with Timed(self.name, "submit"):
            return self.service.submit(job)

    def submit_many(self, jobs: Sequence[JobRequest]) -> list[str | TransferError]:
        with Timed(self.name, "submit_many"):
            results = self.service.submit_many(jobs)
        for result in results:
            if isinstance(result, TransferError):  # one job refused: the call itself went through
                SERVICE_ERRORS.labels(self.name, "submit_many", result.error_class).inc()
        return results

    def job_id_of(self, job: JobRequest) -> str:
        return self.service.job_id_of(job)

    def lookup(self, key: str) -> str | None:
        with Timed(self.name, "lookup"):
            return self.service.lookup(key)

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus | None]:
        with Timed(self.name, "status"):
            return self.service.status(job_ids)

    def cancel(self, job_id: str, file_ids: Sequence[str] | None = None) -> None:
        with Timed(self.name, "cancel"):
            self.service.cancel(job_id, file_ids)

    def fence(self, job_id: str, file_ids: Sequence[str]) -> Fence | None:
        with Timed(self.name, "fence"):
            return self.service.fence(job_id, file_ids)

    def close(self) -> None:
        self.service.close()
