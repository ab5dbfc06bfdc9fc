"""The transfer-service interface: what the submitter and the monitor need from FTS3, from the
embedded gfal2 service or from the simulator, and nothing more.

* `submit(job)`   one job of N file pairs with its parameters and metadata; idempotent on
                  `job.key`, the client-chosen key recorded in the requests before the call, so a
                  resubmitted intent (after a crash) finds the job instead of making a second one;
* `submit_many(jobs)`  several jobs in one go where the service allows it (else one by one);
* `lookup(key)`   the job id of a key, or None if the service never got the job;
* `status(ids)`   the state of many jobs and of their files in one call;
* `cancel(id, files)`  a whole job or some of its files;
* `fence(id, files)`   before those files get another attempt: the job known never to have been
                  made (and unable to be made from now on), or the files ended there, cancelled
                  where they had not; None while a cancel is not confirmed yet.

File states are ASO's five (`pending`, `active`, `done`, `failed`, `canceled`); the service's
own word is kept in `FileStatus.service_state`, the reason text in `reason` and ASO's error
class (aso.transfer.errors) in `error_class`.
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PENDING, ACTIVE, DONE, FAILED, CANCELED = "pending", "active", "done", "failed", "canceled"
FILE_STATES = (PENDING, ACTIVE, DONE, FAILED, CANCELED)
TERMINAL = (DONE, FAILED, CANCELED)

# Job ids made from keys: the same key always names the same job (uuid5 in ASO's namespace).
JOB_NAMESPACE = uuid.UUID("6f1c2a44-3d1e-5b8a-9e57-a50a5e0c0de1")


def job_id_for(key: str) -> str:
    return str(uuid.uuid5(JOB_NAMESPACE, key))


@dataclass(frozen=True)
class FileTransfer:
    """One file pair of a job. `file_id` is the ASO request id."""

    file_id: str
    source: str  # source PFN (URL)
    destination: str  # destination PFN (URL)
    size: int
    adler32: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # An earlier attempt of ours may have left a copy at the destination (its cleanup can fail
    # when the destination server is what failed): settle or replace it, do not refuse it.
    ours: bool = False


@dataclass(frozen=True)
class JobRequest:
    key: str  # deterministic, recorded in the requests before submit()
    files: tuple[FileTransfer, ...]
    user: str
    task: str
    source_site: str
    destination_site: str
    overwrite: bool = False
    verify_checksum: bool = True
    retry: int = 0  # retries inside the service (ASO's retry manager does its own)
    priority: int = 3  # 1 (lowest) .. 5 (highest), as FTS3
    max_time_in_queue: int | None = None  # seconds
    metadata: Mapping[str, Any] = field(default_factory=dict)  # job metadata (issuer, user...)
    credentials: str | None = None  # path of the user's X.509 proxy (fts3 delegation)

    def __post_init__(self) -> None:
        ids = [f.file_id for f in self.files]
        if not ids:
            raise ValueError("a job needs at least one file")
        if len(set(ids)) != len(ids):
            raise ValueError("a job cannot hold the same file twice")


@dataclass
class FileStatus:
    file_id: str
    state: str  # one of FILE_STATES
    service_state: str  # the service's own word (FTS: SUBMITTED, ACTIVE, FINISHED, ...)
    reason: str | None = None
    error_class: str | None = None
    checksum: str | None = None  # adler32 seen at the destination, when done
    started: float | None = None
    ended: float | None = None
    # The service compared the destination's adler32 with the request's before reporting the
    # copy done (the job asked for it). False: the monitor must look at the destination itself.
    verified: bool = False

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


@dataclass
class JobStatus:
    job_id: str
    key: str | None
    files: dict[str, FileStatus]

    @property
    def terminal(self) -> bool:
        return all(f.terminal for f in self.files.values())


# A fence's verdicts (the attempt's `fenced` in the request): no such job can run, or the
# job's files named have ended at the service (done, failed, or cancelled by the fence).
ABSENT, ENDED = "absent", "ended"


@dataclass(frozen=True)
class Fence:
    job_id: str
    verdict: str  # ABSENT or ENDED
    detail: str


class TransferError(Exception):
    """The service cannot be used now (unreachable, overloaded, credentials): retry later."""

    def __init__(self, message: str, error_class: str = "service"):
        super().__init__(message)
        self.error_class = error_class


class JobRefused(TransferError):
    """The service refused this job for good (bad request): its files failed this attempt."""


class TransferService(abc.ABC):
    name: str = "abstract"

    @abc.abstractmethod
    def submit(self, job: JobRequest) -> str:
        """Create the job (or find the one made earlier for `job.key`); returns its id."""

    def submit_many(self, jobs: Sequence[JobRequest]) -> list[str | TransferError]:
        """Submit several jobs; per job its id, or the TransferError (JobRefused included) that
        it met, in input order. One job's failure does not stop the others. Back ends that can
        create many jobs in one call (the job table's bulk write) override this loop."""
        results: list[str | TransferError] = []
        for job in jobs:
            try:
                results.append(self.submit(job))
            except TransferError as exc:
                results.append(exc)
        return results

    def job_id_of(self, job: JobRequest) -> str:
        """The id the service gives `job` (it derives it from the job's key): the submitter
        writes it into the documents before the job goes to the service, so that submitting
        needs no second write. TransferError: the service must be asked, and does not answer."""
        return job_id_for(job.key)

    @abc.abstractmethod
    def lookup(self, key: str) -> str | None:
        """The id of the job made for `key`, or None if the service never got it."""

    @abc.abstractmethod
    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus | None]:
        """Status of each job (None: the service does not know it)."""

    @abc.abstractmethod
    def cancel(self, job_id: str, file_ids: Sequence[str] | None = None) -> None:
        """Cancel the whole job, or only these files of it."""

    def fence(self, job_id: str, file_ids: Sequence[str]) -> Fence | None:
        """Before files of `job_id` get another attempt: make sure that job copies none of
        them from now on. ABSENT: the service never made the job and cannot make it any more
        (`make_absent`); ENDED: the job exists and each of the files has ended there, after a
        cancel where it had not. None: a cancel is asked and not confirmed yet (ask again).
        TransferError: the service cannot tell now; the files wait."""
        job = self.status([job_id]).get(job_id)
        if job is None:
            if self.make_absent(job_id):
                return Fence(job_id, ABSENT, f"job {job_id}: no such job at {self.name}")
            job = self.status([job_id]).get(job_id)
            if job is None:
                raise TransferError(f"job {job_id} exists at {self.name} and cannot be read yet")
        running = [f for f in file_ids if f in job.files and not job.files[f].terminal]
        if running:
            self.cancel(job_id, running)
            job = self.status([job_id]).get(job_id)
            if job is None or any(not job.files[f].terminal for f in running):
                return None
        ends = ", ".join(f"{f} {job.files[f].state}" for f in file_ids if f in job.files)
        return Fence(job_id, ENDED, f"job {job_id} at {self.name}: {ends or 'none of the files'}")

    def make_absent(self, job_id: str) -> bool:
        """The service does not know `job_id`: make sure it never will (True), or find that it
        does after all (False). A service whose answer is authoritative and whose jobs are
        only made by submissions that ended (the submitter's call window is inside the lease)
        has nothing to do."""
        return True

    def close(self) -> None:  # noqa: B027 - optional for back ends without resources
        """Release connections and threads."""
