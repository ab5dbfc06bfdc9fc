"""Submitter: turns `new` requests into transfer jobs, and failed ones whose cool-off is over.

Core logic (plain functions over documents):
* `ready_to_submit`: `new` files, and `retry` files whose `retry_after` has passed (the retry
  manager once wrote them back to `new`: one write per failed attempt more).
* `plan_jobs`: which new files go now, and in which jobs. Files are grouped by
  (user, group, role, source, destination); per-link and per-site caps on files in flight are
  honoured (protecting storage is why ASO exists); inside a link, users take turns (fair
  share) and each user's files go by priority, then age; jobs hold at most
  `transfer.max_files_per_job` files.
* the intent, *before* the job goes to the service, in one write per file: `submitted`, with
  the job's id (which the service derives from the job key: `TransferService.job_id_of`), the
  new attempt and a lease (owner, until, job key). A document whose write conflicts (someone
  else acted) simply drops out of its job.
* then the job goes to the service under that key (idempotent there). Nothing more is written
  unless the service refuses the job (`failed_attempt`) or names it otherwise than expected.
A cycle does this for a batch of jobs at once (FILES_PER_BATCH files): one bulk write of
intents, then the jobs to the service (`submit_many`: one bulk write of the job table for the
gfal and sim services). (Earlier versions wrote the intent, `acquired`, and `submitted` apart.)

Crash safety: a submitter killed after the intent leaves `submitted` documents whose job may
not exist; the monitor finds no job for them and waits while their lease lasts, then asks the
service for the key and, when it never got the job, puts the files back to `new`. A submitter
never submits with less lease left than the service's call may take, so the monitor cannot
release a file whose job is still being created. A submitter started again under the same
instance name (its host's `aso run` restarts it) knows that the leases it holds from before its
start belong to its dead predecessor: it shortens them to end SUBMIT_MARGIN after its own start
(by then any call its predecessor made has ended), so the monitor settles those files minutes
earlier than the full lease would have let it.

Partition: by link (source → destination), so a link's cap is kept by one instance; a site's cap
is shared out between the live instances.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aso import faults, sites
from aso.config import Config
from aso.core import request
from aso.model import IN_FLIGHT, STATE, TO_SUBMIT
from aso.runtime import Agent, Cycle
from aso.transfer import errors, open_service
from aso.transfer.base import FileTransfer, JobRefused, JobRequest, TransferError
from aso.workqueue import ACTIVE, LEASE, SUBMIT

log = logging.getLogger("aso.agent.submitter")

# Seconds of lease a submission must have left (more than its call may take; at most half the
# lease, so short test leases work).
SUBMIT_MARGIN = 120.0
# Files whose jobs are acquired, submitted and marked together (one bulk write each way).
FILES_PER_BATCH = 1000


def batches_of(
    plans: list[list[Mapping[str, Any]]], files: int
) -> Iterable[list[list[Mapping[str, Any]]]]:
    """Jobs in batches of about `files` files (a job is never split)."""
    batch: list[list[Mapping[str, Any]]] = []
    count = 0
    for plan in plans:
        batch.append(plan)
        count += len(plan)
        if count >= files:
            yield batch
            batch, count = [], 0
    if batch:
        yield batch


def ready_to_submit(doc: Mapping[str, Any], now: float) -> bool:
    """A file to submit now: `new`, or `retry` with its cool-off over."""
    state = doc[STATE]
    return state in TO_SUBMIT and (state == "new" or (doc.get("retry_after") or 0) <= now)


def link_of(doc: Mapping[str, Any]) -> str:
    return f"{doc['source']}>{doc['destination']}"


def group_of(doc: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
    return (
        doc["user"],
        doc.get("group", ""),
        doc.get("role", ""),
        doc["source"],
        doc["destination"],
    )


@dataclass
class Caps:
    per_link: int
    per_site: dict[str, int]  # site → cap for this instance
    default_site: int

    def site(self, name: str) -> int:
        return self.per_site.get(name, self.default_site)


def caps_for(config: Config, instances: int) -> Caps:
    """This instance's caps: a link is wholly one instance's; a site's cap is shared out."""

    def share(cap: int) -> int:
        return max(1, cap // instances)

    per_site = {
        name: share(site.max_active or config.transfer.max_active_per_site)
        for name, site in config.sites.items()
    }
    return Caps(
        config.transfer.max_active_per_link, per_site, share(config.transfer.max_active_per_site)
    )


def count_in_flight(docs: Iterable[Mapping[str, Any]]) -> tuple[dict[str, int], dict[str, int]]:
    per_link: dict[str, int] = defaultdict(int)
    per_site: dict[str, int] = defaultdict(int)
    for doc in docs:
        if doc.get(STATE) in IN_FLIGHT:
            per_link[link_of(doc)] += 1
            per_site[doc["source"]] += 1
            per_site[doc["destination"]] += 1
    return per_link, per_site


def fair_order(docs: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Users take turns; each user's files by priority (high first), then age (old first)."""
    by_user: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for doc in docs:
        by_user[doc["user"]].append(doc)
    queues = [
        sorted(files, key=lambda d: (-d.get("priority", 0), d["created"], d["_id"]))
        for _, files in sorted(by_user.items())
    ]
    ordered = []
    while any(queues):
        for queue in queues:
            if queue:
                ordered.append(queue.pop(0))
    return ordered


def plan_jobs(
    new: Sequence[Mapping[str, Any]],
    in_flight: Iterable[Mapping[str, Any]],
    caps: Caps,
    max_files: int,
) -> list[list[Mapping[str, Any]]]:
    """Groups of files to submit now, one group per job."""
    link_busy, site_busy = count_in_flight(in_flight)
    by_link: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for doc in new:
        by_link[link_of(doc)].append(doc)
    # Links whose oldest file has waited longest go first for the shared site capacity.
    order = sorted(by_link, key=lambda link: min(d["created"] for d in by_link[link]))
    chosen: dict[tuple[str, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for link in order:
        for doc in fair_order(by_link[link]):
            src, dst = doc["source"], doc["destination"]
            if (
                link_busy[link] >= caps.per_link
                or site_busy[src] >= caps.site(src)
                or site_busy[dst] >= caps.site(dst)
            ):
                break
            link_busy[link] += 1
            site_busy[src] += 1
            site_busy[dst] += 1
            chosen[group_of(doc)].append(doc)
    jobs = []
    for files in chosen.values():
        for start in range(0, len(files), max_files):
            jobs.append(files[start : start + max_files])
    return jobs


def may_have_left_a_copy(doc: Mapping[str, Any]) -> bool:
    """An earlier attempt got as far as copying (it did not fail on an existing destination),
    so whatever is at the destination now is a leftover of ours, whose removal failed with the
    attempt (typically: the destination server was what failed)."""
    return any(
        a.get("error_class") not in (None, errors.DESTINATION_EXISTS)
        for a in doc.get("attempts", [])
    )


def file_transfer(config: Config, doc: Mapping[str, Any]) -> FileTransfer:
    """The copy of one request, as the transfer service gets it (raises SiteError for a site
    this host's catalogue lacks)."""
    return FileTransfer(
        doc["_id"],
        *sites.transfer_urls(
            config, doc["source"], doc["destination"], doc["source_lfn"], doc["destination_lfn"]
        ),
        size=doc["size"],
        adler32=doc["checksum"]["adler32"],
        # Which attempt of the request this copy is: the job table records it (the simulator
        # draws a file's fate from it, so one seed gives the same fates whatever the batching).
        metadata={
            "request_id": doc["_id"],
            "lfn": doc["destination_lfn"],
            "attempt": len(doc.get("attempts") or []),
        },
        ours=may_have_left_a_copy(doc),
    )


def job_request(
    config: Config, key: str, docs: Sequence[Mapping[str, Any]], files: tuple[FileTransfer, ...]
) -> JobRequest:
    """The job of `docs` (whose copies are `files`) under `key`."""
    first = docs[0]
    transfer = config.transfer
    return JobRequest(
        key=key,
        files=files,
        user=first["user"],
        task=first["task"],
        source_site=first["source"],
        destination_site=first["destination"],
        overwrite=transfer.overwrite,
        verify_checksum=transfer.verify_checksum,
        priority=transfer.priority,
        max_time_in_queue=transfer.max_time_in_queue,
        metadata={
            "issuer": "ASO",
            "user": first["user"],
            "task": first["task"],
            "aso_key": key,
            "group": first.get("group", ""),
            "role": first.get("role", ""),
        },
    )


class Submitter(Agent):
    name = "submitter"
    kinds = (SUBMIT, LEASE, ACTIVE)

    def __init__(self, config: Config, instance: str | None = None):
        super().__init__(config, instance)
        self.service = open_service(config, self.server)
        self.started = time.time()

    def partition_key(self, doc: Mapping[str, Any]) -> str:
        return link_of(doc)

    def close(self) -> None:
        self.service.close()

    def cycle(self, ctx: Cycle) -> None:
        ctx.counts("jobs", "submitted", "conflicts", "refused", "deferred", "set_aside")
        ctx.count("leases_shortened", self.shorten_predecessors_leases(ctx))
        new = [d for d in ctx.work if ready_to_submit(d, ctx.now)]
        if not new:
            return
        caps = caps_for(self.config, ctx.partition.size)
        # Links are mine alone; sites are shared: count site load over everyone's files.
        in_flight = [d for d in ctx.everything.values() if d[STATE] in IN_FLIGHT]
        plans = plan_jobs(new, in_flight, caps, self.config.transfer.max_files_per_job)
        for batch in batches_of(plans, FILES_PER_BATCH):
            self.submit_jobs(batch, ctx)

    def shorten_predecessors_leases(self, ctx: Cycle) -> int:
        """Leases of this instance's name taken before this process started: end them
        SUBMIT_MARGIN after our start (see the module's doc). Returns how many were shortened."""
        margin = min(SUBMIT_MARGIN, self.config.transfer.lease / 2)
        end = self.started + margin
        stale = [
            d
            for d in ctx.work
            if d[STATE] in IN_FLIGHT
            and (lease := d.get("lease") or {}).get("owner") == self.instance
            and lease["until"] - self.config.transfer.lease < self.started
            and lease["until"] > end
        ]
        if not stale:
            return 0
        written = ctx.write([request.lease_shortened(d, end) for d in stale])
        log.info(
            "%d files acquired by this instance before its restart: leases end at +%.0f s",
            len(written),
            margin,
        )
        return len(written)

    def submit_jobs(self, plans: list[list[Mapping[str, Any]]], ctx: Cycle) -> None:
        """Intent for every job of the batch in one bulk write (`submitted`, with the job's id
        and a lease), then the jobs to the service in one call where it can take many: two
        round trips for the batch, and one write per file."""
        plans, made = self.screen(plans, ctx)
        jobs = self.job_requests(
            {f"{self.instance}:{uuid.uuid4()}": list(docs) for docs in plans}, made, ctx
        )
        requests = {key: job for key, (_, job) in jobs.items()}
        try:
            ids = {key: self.service.job_id_of(job) for key, job in requests.items()}
        except TransferError as exc:
            log.warning("the transfer service did not answer (%s): submitting later", exc)
            ctx.count("deferred", sum(len(job.files) for job in requests.values()))
            return
        intended = self.intend(jobs, ids, ctx)
        if not intended:
            return
        faults.point("submitter.after_intent")
        margin = min(SUBMIT_MARGIN, self.config.transfer.lease / 2)
        ready = {}
        for key, docs in intended.items():
            lease_left = docs[0]["lease"]["until"] - ctx.clock()
            if lease_left < margin:
                log.warning(
                    "job %s: only %.0f s of lease left; leaving it to lease expiry", key, lease_left
                )
                continue
            # A file whose intent conflicted dropped out: the job is what was written.
            written = {doc["_id"] for doc in docs}
            job = requests[key]
            ready[key] = dataclasses.replace(
                job, files=tuple(f for f in job.files if f.file_id in written)
            )
        outcomes = self.service.submit_many(list(ready.values()))
        faults.point("submitter.after_submit")
        renamed = []
        for key, outcome in zip(ready, outcomes, strict=True):
            docs = intended[key]
            if isinstance(outcome, JobRefused):
                self.refused(docs, str(outcome), outcome.error_class, ctx)
            elif isinstance(outcome, TransferError):
                # The service is unreachable: when the lease ends the monitor asks it for this
                # key, and it either finds the job or puts the files back to `new`.
                log.warning(
                    "job %s for %d files not submitted (%s): left to lease expiry",
                    key,
                    len(docs),
                    outcome,
                )
                ctx.count("deferred", len(docs))
            else:
                ctx.count("jobs")
                ctx.count("submitted", len(docs))
                self.log_job(outcome, docs)
                if outcome != ids[key]:
                    # The service named the job otherwise than its key says: record its id.
                    log.warning("job %s: the service named it %s, not %s", key, outcome, ids[key])
                    now = ctx.clock()
                    service = self.service.name
                    renamed += [request.job_recorded(d, outcome, service, now) for d in docs]
        ctx.write(renamed)

    def screen(
        self, plans: list[list[Mapping[str, Any]]], ctx: Cycle
    ) -> tuple[list[list[Mapping[str, Any]]], dict[str, FileTransfer | str]]:
        """The copy of every file of the plans, made before anything is written. A file this
        submitter cannot make a transfer of (a site its catalogue lacks, or any error of ours)
        stays `new` for the next cycle, `agents.set_aside_after` - 1 times in a row; then it
        goes on with its job to be acquired and set aside at once (its reason instead of its
        copy): an unknown site once crash-looped the submitter and held up the files of the
        same cycle for minutes."""
        made: dict[str, FileTransfer | str] = {}
        screened = []
        for docs in plans:
            kept = []
            for doc in docs:
                try:
                    made[doc["_id"]] = file_transfer(self.config, doc)
                    ctx.errors.succeeded(doc)
                except Exception as exc:
                    reason = ctx.errors.failed(doc, exc)
                    if reason is None:
                        continue  # left as it is: tried again next cycle
                    made[doc["_id"]] = reason
                kept.append(doc)
            if kept:
                screened.append(kept)
        return screened, made

    def job_requests(
        self,
        jobs: dict[str, list[Mapping[str, Any]]],
        made: dict[str, FileTransfer | str],
        ctx: Cycle,
    ) -> dict[str, tuple[list[Mapping[str, Any]], JobRequest]]:
        """Each job's documents and request, by key; a file screened out is set aside
        (`failed_attempt`, class `unprocessable`, with the reason; the retry manager makes it
        `failed`) and drops out of its job."""
        requests, aside, now = {}, [], ctx.clock()
        for key, docs in jobs.items():
            files = []
            for doc in list(docs):
                copy = made[doc["_id"]]
                if isinstance(copy, FileTransfer):
                    files.append(copy)
                    continue
                aside.append(request.set_aside(doc, self.instance, now, copy))
                docs.remove(doc)
            if docs:
                requests[key] = (docs, job_request(self.config, key, docs, tuple(files)))
        # One bulk write for all of them: a link to an unknown site may be a thousand files.
        ctx.count("set_aside", len(ctx.write(aside)))
        return requests

    def intend(
        self,
        jobs: dict[str, tuple[list[Mapping[str, Any]], JobRequest]],
        ids: dict[str, str],
        ctx: Cycle,
    ) -> dict[str, list[dict[str, Any]]]:
        """Record every job's intent (`submitted`, with its job's id, a new attempt and a lease
        naming the job key); returns the documents written, by job key (a conflicting
        document drops out of its job)."""
        now, service = ctx.clock(), self.service.name
        updated = []
        for key, (docs, _) in jobs.items():
            lease = {
                "owner": self.instance,
                "until": now + self.config.transfer.lease,
                "job_key": key,
            }
            updated += [
                request.submitted(d, ids[key], service, self.instance, now, lease) for d in docs
            ]
        by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for doc in ctx.write(updated):
            by_key[doc["lease"]["job_key"]].append(doc)
        return {key: by_key[key] for key in jobs if by_key.get(key)}

    def log_job(self, job_id: str, docs: list[dict[str, Any]]) -> None:
        log.debug(
            "job %s submitted to %s: %d files (%s → %s, user %s, task %s)",
            job_id,
            self.service.name,
            len(docs),
            docs[0]["source"],
            docs[0]["destination"],
            docs[0]["user"],
            docs[0]["task"],
        )
        for doc in docs:
            log.debug("file %s (%s) submitted in job %s", doc["_id"], doc["source_lfn"], job_id)

    def refused(
        self, docs: list[dict[str, Any]], reason: str, error_class: str, ctx: Cycle
    ) -> None:
        ctx.count("refused", len(self.failed_attempt(docs, reason, error_class, ctx)))
        log.warning("job of %d files refused by %s: %s", len(docs), self.service.name, reason)

    def failed_attempt(
        self, docs: list[dict[str, Any]], reason: str, error_class: str, ctx: Cycle
    ) -> list[dict[str, Any]]:
        """Files whose job the service refused: `failed_attempt`, with why."""
        now = ctx.clock()
        updated = [
            request.attempt_refused(d, self.instance, now, reason, error_class) for d in docs
        ]
        return ctx.write(updated)
