"""Submitter: turns `new` requests into transfer jobs, and failed ones whose cool-off is over.

What it decides is aso/core/submission.py's (plain functions over documents): which files are
ready, which go now and in which jobs, with the per-link and per-site caps honoured. Then:
* the intent, *before* the job goes to the service, in one write per file: `submitted`, with
  the job's id (which the service derives from the job key: `TransferService.job_id_of`), the
  new attempt and a lease (owner, until, job key). A document whose write conflicts (someone
  else acted) simply drops out of its job.
* then the job goes to the service under that key (idempotent there). Nothing more is written
  unless the service refuses the job (`failed_attempt`) or names it otherwise than expected.
A cycle does this for a batch of jobs at once (FILES_PER_BATCH files): one bulk write of
intents, then the jobs to the service (`submit_many`: one bulk write of the job table for the
gfal and sim services).

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

import contextlib
import dataclasses
import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from aso import actions, faults, metrics, model, sites
from aso.config import Config
from aso.core import admission, holds, request
from aso.core.controls import Setting, controls_of, held_back
from aso.core.submission import (
    batches_of,
    caps_for,
    deadline_reason,
    file_transfer,
    job_request,
    link_of,
    past_deadline,
    plan_jobs,
    ready_to_submit,
)
from aso.files import Files, open_files
from aso.model import IN_FLIGHT, STATE
from aso.monitoring.queries import read_controls, read_holds
from aso.runtime import Agent, Cycle
from aso.store import Server, StoreError, rev_order
from aso.transfer import errors, open_service
from aso.transfer.base import FileTransfer, JobRefused, JobRequest, TransferError
from aso.workqueue import ACTIVE, SUBMIT

log = logging.getLogger("aso.agent.submitter")

# Seconds of lease a submission must have left (more than its call may take; at most half the
# lease, so short test leases work).
SUBMIT_MARGIN = 120.0
# Files whose jobs are intended, submitted and marked together (one bulk write each way).
FILES_PER_BATCH = 1000
SPACE_LOOKS = 4  # destinations asked for their free space at once
SPACE_WAIT = 5.0  # seconds a cycle waits for those answers
FRESH = 10.0  # seconds a destination's answer is recent enough to hold files on


class Submitter(Agent):
    name = "submitter"
    kinds = (SUBMIT, ACTIVE)
    waiting = ("held_back", "held", "deferred", "conflicts")

    def __init__(
        self, config: Config, instance: str | None = None, *, server: Server | None = None
    ):
        super().__init__(config, instance, server=server)
        self.service = open_service(config, self.server)
        self.started = time.time()
        self.rooms = admission.Rooms(config.holds.space_refresh)
        self.files: Files | None = None  # opened at the first admission
        self.space_pool = ThreadPoolExecutor(SPACE_LOOKS, thread_name_prefix="space")
        self.space_looks: dict[admission.Key, Future[int | None]] = {}

    def partition_key(self, doc: Mapping[str, Any]) -> str:
        return link_of(doc)

    def close(self) -> None:
        self.service.close()
        self.space_pool.shutdown(wait=False, cancel_futures=True)

    def cycle(self, ctx: Cycle) -> None:
        ctx.counts(
            "jobs", "submitted", "conflicts", "refused", "deferred", "set_aside", "held_back",
            "held", "hold_failed", "expired",
        )  # fmt: skip
        ctx.count("leases_shortened", self.shorten_predecessors_leases(ctx))
        # Held files wait on their hold, not on their cool-off: a release lets them go at once.
        ready = [
            d
            for d in ctx.work
            if ready_to_submit(d, ctx.now) or holds.held_request(d, self.config.holds)
        ]
        new = self.not_held(self.not_held_back(self.not_expired(ready, ctx), ctx), ctx)
        if not new:
            return
        # Links are mine alone; sites are shared: count site load over everyone's files.
        in_flight = [d for d in ctx.everything.values() if d[STATE] in IN_FLIGHT]
        new = self.admitted(new, in_flight, ctx)
        caps = caps_for(self.config, ctx.partition.size)
        plans = plan_jobs(new, in_flight, caps, self.config.transfer.max_files_per_job)
        self.rooms.commit(doc for plan in plans for doc in plan)
        for batch in batches_of(plans, FILES_PER_BATCH):
            self.submit_jobs(batch, ctx)

    def admitted(
        self, ready: list[dict[str, Any]], in_flight: list[dict[str, Any]], ctx: Cycle
    ) -> list[dict[str, Any]]:
        """The files ready to start that fit the room their destination reports for their
        user (aso/core/admission.py); the others wait held: the hold of their destination and
        user starts, with the figures, and the hold checker releases it once there is room."""
        settings = self.config.holds
        if not ready or not settings.enabled or not settings.admission:
            return ready
        self.ask_for_room(ready, in_flight, ctx.now)
        fits, refused = admission.admit(ready, self.rooms.known)
        old = [k for r in refused if ctx.now - self.rooms.asked[k := (r.site, r.user)] > FRESH]
        if old:  # files are held on what the destination says now (a hold released meanwhile)
            self.rooms.forget(old)
            self.ask_for_room(ready, in_flight, ctx.now)
            fits, refused = admission.admit(ready, self.rooms.known)
        if refused:
            self.start_quota_holds(refused, ctx)
            ctx.count("held", sum(len(r.files) for r in refused))
        return fits

    def ask_for_room(
        self, ready: list[dict[str, Any]], in_flight: list[dict[str, Any]], now: float
    ) -> None:
        """Learn the room of the destinations and users of `ready` not asked for
        `holds.space_refresh` seconds: each asked in a thread, those asked this cycle waited
        for at most SPACE_WAIT seconds in all (a frozen storage holds up only its own thread;
        until it answers, its files are admitted as a storage that reports nothing)."""
        first: dict[admission.Key, dict[str, Any]] = {}
        for doc in ready:
            first.setdefault(admission.key_of(doc), doc)
        asked = []
        for key in self.rooms.stale(first, now):
            if key not in self.space_looks:
                self.space_looks[key] = self.space_pool.submit(self.free_space, first[key])
                asked.append(self.space_looks[key])
        # Only this cycle's questions are waited for (round 32: a frozen destination's looks,
        # still pending, made every cycle wait 5 s).
        wait(asked, timeout=SPACE_WAIT)
        bytes_to = admission.on_its_way(in_flight)
        for key, look in list(self.space_looks.items()):
            if look.done():
                del self.space_looks[key]
                free = None if look.exception() else look.result()
                self.rooms.learn(key, free, bytes_to.get(key, 0), now)

    def free_space(self, doc: Mapping[str, Any]) -> int | None:
        """The bytes free where `doc` would be written, as its destination reports them."""
        if self.files is None:
            self.files = open_files(self.config)
        try:
            url = sites.pfn(self.config, doc["destination"], doc["destination_lfn"])
        except sites.SiteError:
            return None
        return self.files.free_space(url)

    def start_quota_holds(self, refused: list[admission.Refused], ctx: Cycle) -> None:
        """Start (or widen) the hold of each destination and user whose files do not fit."""
        starts = {
            model.hold_id(r.site, r.user): {
                "site": r.site, "user": r.user, "error_class": errors.QUOTA,
                "reason": r.reason(), "path": r.path, "needs": r.needs, "free": r.free,
            }
            for r in refused
        }  # fmt: skip
        actions.start_holds(self.db, starts, self.instance, ctx.now, self.config.holds)

    def not_expired(self, ready: list[dict[str, Any]], ctx: Cycle) -> list[dict[str, Any]]:
        """The files waiting to start within their deadline (`transfer.deadline` from their
        creation); the others fail, class expired, whatever else holds them."""
        deadline = self.config.transfer.deadline
        late = [d for d in ready if past_deadline(d, deadline, ctx.now)]
        if not late:
            return ready
        ended = [request.stopped_waiting(d, self.instance, ctx.now, deadline_reason(d, deadline),
                                         errors.EXPIRED) for d in late]  # fmt: skip
        ctx.count("expired", len(ctx.write(ended)))
        gone = {d["_id"] for d in late}
        return [d for d in ready if d["_id"] not in gone]

    def not_held_back(self, ready: list[dict[str, Any]], ctx: Cycle) -> list[dict[str, Any]]:
        """The files ready to start that no operator's control holds back (a banned or draining
        site in their direction, a banned user); the others wait as they are. Controls that
        cannot be read hold back everything: a ban may be in force."""
        if not ready:
            return ready  # nothing to hold back: no read of the controls
        try:
            found = controls_of(read_controls(self.db))
        except StoreError as exc:
            log.warning("operators' controls not read (%s): nothing submitted", exc)
            return []
        metrics.CONTROLS.clear()
        for control in found.all():
            labels = (control.kind, control.name, control.mode, control.direction)
            metrics.CONTROLS.labels(*labels).set(1)
        metrics.HELD_BACK.clear()
        if not found:
            return ready
        free: list[dict[str, Any]] = []
        held: Counter[Setting] = Counter()
        for doc in ready:
            holding = held_back(doc, found)
            if holding is None:
                free.append(doc)
                continue
            held[holding] += 1
            log.debug("file %s held back: %s", doc["_id"], holding.says())
        for control, files in held.items():
            metrics.HELD_BACK.labels(control.kind, control.name, control.mode).set(files)
        ctx.count("held_back", sum(held.values()))
        return free

    def not_held(self, ready: list[dict[str, Any]], ctx: Cycle) -> list[dict[str, Any]]:
        """The files ready to start that no hold keeps back (their destination refused their
        user for room or permission: they wait until the hold ends); the files of a hold that
        was cancelled or passed its deadline fail with it. Holds that cannot be read keep
        back nothing: a full destination refuses the copy again, which holds it again."""
        metrics.HELD.clear()
        if not ready or not self.config.holds.enabled:
            return ready
        try:
            pairs = {key for d in ready for key in holds.hold_keys(d)}
            found = holds.holds_of(read_holds(self.db, pairs))
        except StoreError as exc:
            log.warning("holds not read (%s): none keeps files back this cycle", exc)
            return [d for d in ready if ready_to_submit(d, ctx.now)]
        free, ending, held = [], [], Counter[tuple[str, str]]()
        for doc in ready:
            hold = holds.holding(doc, found)
            if hold is not None:
                held[hold.site, hold.error_class] += 1
                log.debug("file %s held: %s", doc["_id"], hold.says())
                continue
            ended = holds.ended_holding(doc, found)
            if ended is None:
                if ready_to_submit(doc, ctx.now) or holds.released(doc, found):
                    free.append(doc)
                continue
            why = holds.failure_reason(ended)
            ending.append(
                request.stopped_waiting(doc, self.instance, ctx.now, why, ended.error_class)
            )
        for (site, error_class), files in held.items():
            metrics.HELD.labels(site, error_class).set(files)
        ctx.count("held", sum(held.values()))
        ctx.count("hold_failed", len(ctx.write(ending)))
        return free

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
            "%d files leased by this instance before its restart: leases end at +%.0f s",
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
        intended = self.uncontested(self.intend(jobs, ids, ctx))
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
        goes on with its job to be set aside at once (its reason instead of its
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

    def uncontested(
        self, intended: dict[str, list[dict[str, Any]]]
    ) -> dict[str, list[dict[str, Any]]]:
        """The intents whose document has no other live branch that a job may be copying
        (CLUSTER_CONFLICTING_BRANCHES). A cluster takes an intent at its quorum on top of a
        revision another agent stored below it (202) and withdrew too late: two branches, each
        with its submitter's job, copied one file twice at once. Read back after the write (a
        quorum read after a quorum write: of two such submitters the later sees the other), a
        file whose other branch is at the service, or done, drops out of its job; its intent
        stays for the monitor to settle at lease end (the other job followed, or fenced), or is
        withdrawn if the other branch beats it."""
        ids = [doc["_id"] for docs in intended.values() for doc in docs]
        if not ids:
            return intended
        try:
            leaves = self.db.leaves_many(ids)
        except StoreError as exc:
            log.warning("intents not read back (%s): %d files left to lease expiry", exc, len(ids))
            return {}
        kept: dict[str, list[dict[str, Any]]] = {}
        for key, docs in intended.items():
            for doc in docs:
                others = [leaf for leaf in leaves[doc["_id"]] if leaf["_rev"] != doc["_rev"]]
                # A job this branch followed already (an attempt of its own: the monitor's
                # `job_recorded`) has ended; a branch left naming it copies nothing more.
                ours = {a.get("job_id") for a in doc.get("attempts") or []}
                busy = [
                    leaf
                    for leaf in others
                    if leaf.get(STATE) in (*IN_FLIGHT, "done")
                    and (leaf.get("transfer") or {}).get("job_id") not in ours
                ]
                if not busy:
                    kept.setdefault(key, []).append(doc)
                    continue
                best = max([doc, *others], key=lambda d: rev_order(d["_rev"]))
                if best["_rev"] != doc["_rev"]:
                    with contextlib.suppress(StoreError):  # else the monitor settles it
                        self.db.withdraw({doc["_id"]: [doc["_rev"]]})
                log.info(
                    "file %s: another branch %s is %s: not submitted in job %s",
                    doc["_id"],
                    busy[0]["_rev"],
                    busy[0].get(STATE),
                    key,
                )
        return kept

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
