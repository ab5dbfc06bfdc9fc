"""gfal worker: runs the jobs of ASO's embedded `gfal` transfer service.

The submitter records jobs in the job table (aso.transfer.jobstore); workers, any number on any
host, claim them with a lease and make the copies with gfal2: third-party copies between the
sites' storage endpoints, adler32-verified, overwrite as the job asks, each bounded by
`gfal.timeout`, at most `gfal.workers` at once per worker. Progress is written to the job
document file by file; cancel requests found there stop the copies they name.

Restart safety: a worker that dies leaves its jobs leased; when the lease expires another worker
claims them again and goes on with the files that have not ended. A worker started again under
the same instance name (its host's `aso run` or systemd restarts it, only after it has exited)
takes back at once the jobs leased in that name that it does not hold itself: their holder is
dead and its copies have ended with it, which is all a lease's expiry tells the others.
A file found `active` was being copied by the dead worker: its destination is checked first
(complete and verified: done; otherwise removed, then copied again). Two copies of one file
never run at once: a job is run by the one worker holding its lease, which renews it while it
works and stops its copies if it cannot renew it in time. Every copy run is recorded in the
file's `runs` ({worker, start, end}) so that this can be checked, not assumed. A worker that
stops cleanly (SIGTERM: a drained host) stops its copies, hands their files back to be copied
again (not failed attempts) and ends its leases, so that another worker takes its jobs at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from aso import actions, faults, model, sites
from aso.config import Config
from aso.core import holds, turns
from aso.files import Files, open_files
from aso.monitoring.queries import read_holds
from aso.runtime import Agent, Cycle
from aso.store import Conflict, Server, StoreError
from aso.transfer import errors
from aso.transfer.base import ACTIVE, CANCELED, DONE, FAILED, PENDING, TERMINAL
from aso.transfer.gfal_copier import Copier, CopyResult, GfalCopier
from aso.transfer.jobstore import (
    FINISHED,
    QUEUED,
    RUNNING,
    JobStore,
    UnfinishedJob,
    finish_file,
)

log = logging.getLogger("aso.agent.gfal_worker")

RETRY_CLASSES = (errors.CONNECTION, errors.TIMEOUT)
SITE_LOOKS = 4  # sites of stalled copies asked at once whether they answer
SITE_LOOK_TIMEOUT = 5.0  # seconds a site has to answer before it counts as silent
SILENCE_PATH = "/store/user"  # what the hold of a silent site has looked at (any answer passes)
SCAN_PAGE = 250  # jobs of the view read at once when looking for work
SCAN_PAGES = 4  # pages looked at per state and round, at the most
CLAIM_BATCH = 20  # candidate jobs read at once


def sites_of_job(doc: Mapping[str, Any]) -> tuple[str, str]:
    return doc.get("source_site", ""), doc.get("destination_site", "")


def claimable(doc: Mapping[str, Any], now: float, predecessor: str | None = None) -> bool:
    """Whether a worker may claim the job: queued, or running under an expired lease or one
    taken by `predecessor` (an earlier process of the claiming worker's instance name)."""
    lease = doc.get("lease")
    return doc["state"] == QUEUED or (
        doc["state"] == RUNNING
        and (not lease or lease["until"] < now or lease.get("owner") == predecessor)
    )


def end_open_run(entry: dict[str, Any], now: float, **details: Any) -> None:
    """End the file's copy run still open (in `runs`), if any, with `details` (a reason)."""
    if entry.get("runs") and entry["runs"][-1]["end"] is None:
        entry["runs"][-1].update(end=now, **details)


class GfalWorker(Agent):
    """Not a files-database agent: its work is the job table. It runs under the same harness
    as the others (aso/runtime.py Runner: identity, heartbeat, signals, errors); with no work
    kinds, its `cycle` runs every `idle` seconds and takes, renews and runs the jobs."""

    name = "gfal-worker"
    kinds = ()

    def __init__(
        self,
        config: Config,
        instance: str | None = None,
        *,
        copier: Copier | None = None,
        server: Server | None = None,
        files: Files | None = None,
    ):
        super().__init__(config, instance, server=server)
        self.files = files  # asks a stalled copy's sites whether they answer (opened then)
        self.jobs = JobStore(self.server.db(config.store.transfers_db), "gfal")
        self.lease = max(2.0, config.transfer.lease / 2)
        if copier is None:
            copier = GfalCopier(config)
        self.copier = copier
        # As many threads again as slots, for the copies hung on a site that does not answer
        # (`copies_in_use`).
        self.pool = ThreadPoolExecutor(
            max_workers=2 * config.gfal.workers, thread_name_prefix="gfal-copy"
        )
        self.running: dict[tuple[str, str], Future[None]] = {}  # (job, file) → copy
        self.sites_of: dict[str, tuple[str, str]] = {}  # job → (source, destination) site
        self.user_of: dict[str, str] = {}  # job → its user
        self.held_sites: set[str] = set()  # sites a site's hold holds (read each round)
        self.silent_sites: set[str] = set()  # sites of stalled copies that did not answer
        self.silence_held: set[str] = set()  # silent sites whose hold we started
        self.started_at: dict[tuple[str, str], float] = {}  # (job, file) → monotonic start
        self.site_pool = ThreadPoolExecutor(SITE_LOOKS, thread_name_prefix="gfal-site-look")
        self.site_asked: dict[str, float] = {}  # site → monotonic time of the last look
        self.site_looks: dict[str, tuple[float, Future[bool]]] = {}  # site → (asked, answer)
        self.leases: dict[str, float] = {}  # job → lease end we hold
        self.scan_from: dict[str, list[Any] | None] = {}  # state → the key the last look ended at
        self.stop_copies = threading.Event()
        self.lock = threading.Lock()
        self.job_locks: dict[str, threading.Lock] = {}
        self.lost: set[str] = set()  # jobs whose lease we lost: their copies must stop

    @property
    def idle(self) -> float:
        return self.config.gfal.poll_interval

    def cycle(self, ctx: Cycle) -> None:
        ctx.report.update(self.work_once(ctx.now))

    # -- one round ------------------------------------------------------------------------------
    def work_once(self, now: float | None = None) -> dict[str, int]:
        """One round over the job table: renew our leases, start copies of our jobs in the
        free slots, claim new jobs for the rest; returns the counts."""
        now = time.time() if now is None else now
        report = {"claimed": 0, "started": 0, "renewed": 0}
        self.renew_leases(report)
        copying = self.jobs_copying()
        self.sites_of = {j: s for j, s in self.sites_of.items() if j in self.leases or j in copying}
        self.user_of = {j: u for j, u in self.user_of.items() if j in self.sites_of}
        self.read_held_sites()
        self.look_at_stalled_sites()
        free = self.config.gfal.workers - self.copies_in_use()
        # Our own jobs first: their files beyond the free slots wait here for a slot.
        held = [doc for doc in self.jobs.get_many(list(self.leases)).values() if doc]
        for doc in held:
            if free <= 0:
                return report
            started = self.start_files(doc, free)
            report["started"] += started
            free -= started
        if free <= 0:
            return report
        candidates = self.candidates(now)
        for start in range(0, len(candidates), CLAIM_BATCH):
            docs = self.jobs.get_many(candidates[start : start + CLAIM_BATCH])
            for job in docs.values():
                if free <= 0:
                    return report
                if job is None or not claimable(job, now, self.instance):
                    continue  # gone, or claimed by another since the view was read
                if self.slots_for(job.get("user", ""), sites_of_job(job)) <= 0:
                    continue  # this round's earlier claims took its slots
                claimed = self.claim(job, now)
                if claimed is None:
                    continue
                report["claimed"] += 1
                started = self.start_files(claimed, free)
                report["started"] += started
                free -= started
        return report

    def candidates(self, now: float) -> list[str]:
        """The jobs to try claiming, in the users' turns (aso/core/turns.py): those whose
        copies could start here now, from up to SCAN_PAGES pages of each state's jobs. A job
        that could not start is passed over, not waited behind (round 37: a user's jobs that
        her own running copies kept from starting had filled the 50 the worker read, and every
        later job of every user waited until her copies ended)."""
        startable = []
        for job in self.scan(QUEUED) + self.scan(RUNNING):
            # A job leased in our name that this process does not hold was our predecessor's.
            if job.id in self.leases or not claimable(
                {"state": job.state, "lease": job.lease}, now, self.instance
            ):
                continue
            if set(job.sites) & self.silent_sites or self.slots_for(job.user, job.sites) <= 0:
                continue  # none of its copies could start here now: left to others or later
            startable.append((job.id, job.user))
        running = Counter(user or "" for _, user in self.running_ends())
        return turns.fair_order(startable, running)

    def scan(self, state: str) -> list[UnfinishedJob]:
        """Up to SCAN_PAGES pages of the jobs in `state`, from where the last round's look
        stopped: a queue longer than that is looked at whole over a few rounds."""
        jobs: list[UnfinishedJob] = []
        after = self.scan_from.get(state)
        for _ in range(SCAN_PAGES):
            page = self.jobs.unfinished_page(state, after, SCAN_PAGE)
            jobs += page
            after = page[-1].key if len(page) == SCAN_PAGE else None
            if after is None:
                break  # the end: the next round starts at the oldest
        self.scan_from[state] = after
        return jobs

    def claim(self, doc: dict[str, Any], now: float) -> dict[str, Any] | None:
        until = now + self.lease
        claimed = dict(doc, state=RUNNING, lease={"owner": self.instance, "until": until})
        try:
            claimed["_rev"] = self.jobs.db.put(claimed)
        except Conflict:
            return None  # another worker was faster
        self.leases[doc["_id"]] = until
        self.lost.discard(doc["_id"])  # lost once, ours again: its copies may run
        log.info(
            "job %s claimed (%d files, lease until %.0f)", doc["_id"], len(doc["files"]), until
        )
        self.settle_orphans(claimed)
        return claimed

    def settle_orphans(self, doc: dict[str, Any]) -> None:
        """Files a dead worker left `active`: finished, or to be copied again."""
        orphans = [fid for fid, e in doc["files"].items() if e["state"] == ACTIVE]
        for file_id in orphans:
            result = self.copier.resume(doc["files"][file_id], doc["params"])
            self.record(doc["_id"], file_id, result, ended_run=True)
            log.info(
                "job %s file %s left active by a dead worker: %s",
                doc["_id"],
                file_id,
                result.state if result else "copied again",
            )

    def start_files(self, doc: Mapping[str, Any], free: int) -> int:
        """Start the job's pending copies in at most `free` slots, and no more than
        `gfal.per_site` copies from or to one site at once (`running_at`): copies waiting on a
        site that does not answer had held every slot, and the copies between two good sites
        waited behind them (round 29)."""
        sites = sites_of_job(doc)
        self.sites_of[doc["_id"]], self.user_of[doc["_id"]] = sites, doc.get("user", "")
        if set(sites) & self.silent_sites:
            return 0  # its copies would hang as the ones there do
        free = min(free, self.slots_for(doc.get("user", ""), sites))
        started = 0
        for file_id, entry in sorted(doc["files"].items(), key=lambda kv: kv[1]["index"]):
            if started >= free:
                break
            if entry["state"] != PENDING or self.is_running(doc["_id"], file_id):
                continue
            if entry.get("not_before", 0) > time.time():
                continue  # a retry waiting for its delay
            self.start_copy(doc["_id"], file_id)
            started += 1
        return started

    # The table of running copies is written by the loop (a copy starts) and by the copy
    # threads (a copy ends). Walking it while a copy ended raised "dictionary changed size
    # during iteration" in the loop, which stopped the worker (and its jobs until their leases
    # expired): every look at it holds the lock. A copy may end before `submit` returns; the
    # done callback, added after the entry, then removes it at once: an ended copy never keeps
    # a slot.
    def start_copy(self, job_id: str, file_id: str) -> None:
        key = (job_id, file_id)
        future = self.pool.submit(self.run_copy, job_id, file_id)
        with self.lock:
            self.running[key] = future
            self.started_at[key] = time.monotonic()
        future.add_done_callback(lambda _: self._copy_ended(key))

    def _copy_ended(self, key: tuple[str, str]) -> None:
        with self.lock:
            self.running.pop(key, None)
            self.started_at.pop(key, None)

    def is_running(self, job_id: str, file_id: str) -> bool:
        with self.lock:
            return (job_id, file_id) in self.running

    def copies_running(self) -> int:
        with self.lock:
            return len(self.running)

    def running_ends(self) -> list[tuple[tuple[str, str], str | None]]:
        """(source, destination) sites and user of each copy running now."""
        with self.lock:
            return [(self.sites_of.get(job_id, ("", "")), self.user_of.get(job_id))
                    for job_id, _ in self.running]  # fmt: skip

    def copies_in_use(self) -> int:
        """Copies that take one of the `gfal.workers` slots: not those waiting on a site that
        does not answer or that a site's hold holds (up to `gfal.workers` of them, the pool's
        other threads): the copies between good sites had waited behind them."""
        ends = self.running_ends()
        waiting_on = self.held_sites | self.silent_sites
        parked = sum(bool(set(pair) & waiting_on) for pair, _ in ends)
        return len(ends) - min(parked, self.config.gfal.workers)

    def running_at(self, site: str, user: str | None = None) -> int:
        """Copies running from or to `site` (of `user` alone, if given), but those whose other
        end a site's hold holds or does not answer: those wait on that end (rounds 30 and 31:
        copies hung on a dead source had used up the cap of the good destination at their
        other end, whose other copies then waited minutes)."""
        waiting_on = self.held_sites | self.silent_sites
        return sum(
            site in pair and not (set(pair) - {site}) & waiting_on
            for pair, whose in self.running_ends()
            if user is None or whose == user
        )

    def slots_for(self, user: str, sites: tuple[str, str]) -> int:
        """How many more copies of `user`'s job between `sites` may start now:
        `gfal.per_site` at each site, and of those `gfal.per_user` for its user (round 35: one
        user's long copies had taken every slot of three sites, and the others' files waited
        behind them)."""
        per_user = min(self.config.gfal.per_user, self.config.gfal.per_site)
        return min(
            *(self.config.gfal.per_site - self.running_at(site) for site in sites),
            *(per_user - self.running_at(site, user) for site in sites),
        )

    def look_at_stalled_sites(self) -> None:
        """Ask the sites of copies running longer than `gfal.stall_after` whether they answer
        (a stat, in a thread of its own: a frozen storage holds up that thread only), each at
        most every `stall_after` seconds; one that has not answered within SITE_LOOK_TIMEOUT
        is silent until it answers again. A hung copy does not fail for minutes, so no
        breaker would tell (round 31). A site found silent is held (`hold_silent`) and looked
        at until it answers, then released."""
        now, stall = time.monotonic(), self.config.gfal.stall_after
        with self.lock:
            stalled = [self.sites_of.get(job_id, ("", "")) for (job_id, _), t in
                       self.started_at.items() if now - t > stall]  # fmt: skip
        sites = {site for pair in stalled for site in pair if site} | self.silence_held
        was_silent, answered = set(self.silent_sites), set()
        for site, (asked, answer) in list(self.site_looks.items()):
            if answer.done():
                del self.site_looks[site]
                if answer.exception() is None and answer.result():
                    self.silent_sites.discard(site)
                    answered.add(site)
                else:
                    self.silent_sites.add(site)
            elif now - asked > min(SITE_LOOK_TIMEOUT, stall):
                self.silent_sites.add(site)
        self.silent_sites &= sites | set(self.site_looks)
        self.hold_silent(self.silent_sites - was_silent)
        self.release_answering(answered & self.silence_held)
        for site in sites - set(self.site_looks):
            if now - self.site_asked.get(site, -stall) >= stall:
                self.site_asked[site] = now
                self.site_looks[site] = (now, self.site_pool.submit(self.site_answers, site))

    def hold_silent(self, silent: set[str]) -> None:
        """Hold every user's files for each newly silent site (a site's hold, as the breaker's):
        the submitter keeps them back and says why, instead of sending them to hang too."""
        if not silent or not self.config.holds.enabled:
            return
        reason = (
            f"did not answer within {SITE_LOOK_TIMEOUT:g} s while copies from or to it ran "
            f"over {self.config.gfal.stall_after:g} s"
        )
        starts = {
            model.hold_id(site): {
                "site": site, "user": "", "error_class": errors.TIMEOUT, "reason": reason,
                "path": SILENCE_PATH, "needs": 0,
            }
            for site in silent
        }  # fmt: skip
        actions.start_holds(self.db, starts, self.instance, time.time(), self.config.holds)
        self.silence_held |= silent

    def release_answering(self, answering: set[str]) -> None:
        """Release the holds we started for sites that answer again: their files go at once,
        not at the hold checker's next look (a minute or more later)."""
        if answering:
            actions.release_site_holds(
                self.db, answering, self.instance, time.time(), self.config.holds
            )
            self.silence_held -= answering
            self.held_sites -= answering

    def site_answers(self, site: str) -> bool:
        """Whether `site`'s storage answers a stat of its endpoint (whatever it says)."""
        if self.files is None:
            self.files = open_files(self.config)
        try:
            url = sites.endpoint_url(self.config, site).rstrip("/") + "/"
        except sites.SiteError:
            return True
        said = self.files.reachable(url)
        if said is not None:
            log.info("site %s does not answer: %s", site, said)
        return said is None

    def read_held_sites(self) -> None:
        """The sites of our jobs that a site's hold holds (aso/core/holds.py), read once a
        round; none when they cannot be read."""
        sites = {site for pair in self.sites_of.values() for site in pair if site}
        try:
            found = holds.holds_of(read_holds(self.db, [(site, "") for site in sites]))
        except StoreError as exc:
            log.debug("sites' holds not read: %s", exc)
            found = {}
        self.held_sites = {site for (site, _), hold in found.items() if hold.holds}

    def jobs_copying(self) -> set[str]:
        with self.lock:
            return {job_id for job_id, _ in self.running}

    def renew_leases(self, report: dict[str, int]) -> None:
        now = time.time()
        copying = self.jobs_copying()
        for job_id, until in list(self.leases.items()):
            if job_id not in copying and self.maybe_finish(job_id):
                continue
            if until - now > self.lease * 2 / 3:
                continue
            try:
                self.update(job_id, lambda d: self._extend(d, now + self.lease))
                self.leases[job_id] = now + self.lease
                self.lost.discard(job_id)  # renewed after all: its copies may run again
                report["renewed"] += 1
            except Conflict:
                # Another worker holds the job now (our lease ran out): stop our copies of it.
                log.error("job %s: lease lost to another worker; stopping its copies", job_id)
                self.lost.add(job_id)
                self.leases.pop(job_id, None)
            except StoreError as exc:
                if until - now < self.lease / 3:
                    # We may lose the lease: stop our copies before anyone else may start them.
                    log.error(
                        "cannot renew the lease of job %s (%s): stopping its copies", job_id, exc
                    )
                    self.lost.add(job_id)

    def holds(self, doc: Mapping[str, Any]) -> bool:
        """Whether the job's lease is this worker's."""
        return (doc.get("lease") or {}).get("owner") == self.instance

    def _extend(self, doc: dict[str, Any], until: float) -> bool:
        if not self.holds(doc):
            raise Conflict(409, "conflict", "lease taken by another worker")
        doc["lease"] = {"owner": self.instance, "until": until}
        return True

    def maybe_finish(self, job_id: str) -> bool:
        """Close a job whose files have all ended; True if it is closed (or gone)."""

        def finish(doc: dict[str, Any]) -> bool:
            pending = [e for e in doc["files"].values() if e["state"] not in TERMINAL]
            if pending:
                return False
            doc["state"], doc["lease"] = FINISHED, None
            return True

        doc = self.update(job_id, finish)
        if doc is None or doc["state"] == FINISHED:
            self.leases.pop(job_id, None)
            with self.lock:  # no copy of it runs: its write lock is not needed any more
                self.job_locks.pop(job_id, None)
            log.info("job %s finished", job_id)
            return True
        return False

    # -- one copy -----------------------------------------------------------------------------
    def run_copy(self, job_id: str, file_id: str) -> None:
        try:
            current = self.jobs.get(job_id)
            if current is None:
                return
            entry = current["files"][file_id]
            if entry["state"] != PENDING:
                # Started from a job read just before an earlier copy of the file ended.
                return
            if entry.get("ours"):
                # A retry after our own failed run: what is at the destination is ours.
                early = self.copier.resume(entry, current["params"])
            else:
                # Refuse an existing destination before the copy is marked active, so that a
                # destination found after a crash under an `active` file is always ours.
                early = self.copier.precheck(entry, current["params"])
            if early is not None:
                self.record(job_id, file_id, early, ended_run=False)
                log.info(
                    "job %s file %s: %s [%s] %s",
                    job_id,
                    file_id,
                    early.state,
                    early.error_class,
                    early.reason,
                )
                return
            doc = self.update(job_id, lambda d: self._mark_active(d, file_id))
            if doc is None or doc["files"][file_id]["state"] != ACTIVE:
                return
            faults.point("gfal_worker.after_active")
            entry = doc["files"][file_id]
            if file_id in doc.get("cancel", {}):
                result = CopyResult(CANCELED, "canceled before its copy started", "canceled")
            else:
                result = self.copier.copy(
                    entry, doc["params"], lambda: self._cancelled(job_id, file_id)
                )
            if result.state == CANCELED and self.stopped_by_us(job_id, doc, file_id):
                self.hand_back(job_id, file_id)
                return
            if self.retryable(result, entry):
                self.retry_later(job_id, file_id, result)
                return
            self.record(job_id, file_id, result, ended_run=True)
            log.log(
                logging.DEBUG if result.state == DONE else logging.INFO,
                "job %s file %s: %s%s",
                job_id,
                file_id,
                result.state,
                f" [{result.error_class}] {result.reason}" if result.reason else "",
            )
        except Exception:
            log.exception("job %s file %s: copy crashed", job_id, file_id)

    def update(self, job_id: str, mutate: Any) -> dict[str, Any] | None:
        """Our writes to a job, one at a time: copies of one job end together, and racing
        each other would only make conflicts (a cancel from the monitor still may)."""
        with self.lock:
            lock = self.job_locks.setdefault(job_id, threading.Lock())
        with lock:
            return self.jobs.update(job_id, mutate)

    def retryable(self, result: CopyResult, entry: Mapping[str, Any]) -> bool:
        """A storage that refused or dropped the connection may be restarting: try again
        (`gfal.retries` times, `gfal.retry_delay` apart) before the attempt counts as failed."""
        return (
            result.state == FAILED
            and result.error_class in RETRY_CLASSES
            and entry.get("retries", 0) < self.config.gfal.retries
        )

    def retry_later(self, job_id: str, file_id: str, result: CopyResult) -> None:
        def again(doc: dict[str, Any]) -> bool:
            entry = doc["files"][file_id]
            now = time.time()
            end_open_run(entry, now, reason=result.reason)
            entry.update(
                state=PENDING,
                service_state="SUBMITTED",
                ours=True,
                retries=entry.get("retries", 0) + 1,
                not_before=now + self.config.gfal.retry_delay,
                reason=result.reason,
                error_class=result.error_class,
            )
            return True

        self.update(job_id, again)
        log.info(
            "job %s file %s: [%s] %s; trying again in %.0f s",
            job_id,
            file_id,
            result.error_class,
            result.reason,
            self.config.gfal.retry_delay,
        )

    def _mark_active(self, doc: dict[str, Any], file_id: str) -> bool:
        entry = doc["files"][file_id]
        if entry["state"] != PENDING or not self.holds(doc):
            return False
        now = time.time()
        entry.update(state=ACTIVE, service_state="ACTIVE", started=now)
        entry.setdefault("runs", []).append({"worker": self.instance, "start": now, "end": None})
        return True

    def _cancelled(self, job_id: str, file_id: str) -> bool:
        if self.stop_copies.is_set() or job_id in self.lost:
            return True
        doc = self.jobs.get(job_id)
        return bool(doc and file_id in doc.get("cancel", {}))

    def record(
        self, job_id: str, file_id: str, result: CopyResult | None, *, ended_run: bool
    ) -> None:
        def write(doc: dict[str, Any]) -> bool:
            entry = doc["files"][file_id]
            now = time.time()
            if ended_run:
                end_open_run(entry, now)
            if result is None:  # to be copied again
                entry.update(state=PENDING, service_state="SUBMITTED")
            else:
                finish_file(
                    entry,
                    result.state,
                    now,
                    reason=result.reason,
                    error_class=result.error_class,
                    checksum=result.checksum,
                )
            return True

        self.update(job_id, write)

    def stopped_by_us(self, job_id: str, doc: Mapping[str, Any], file_id: str) -> bool:
        """A copy cancelled because this worker is stopping or lost the job's lease, not
        because its owner asked."""
        asked = file_id in doc.get("cancel", {})
        return not asked and (self.stop_copies.is_set() or job_id in self.lost)

    def hand_back(self, job_id: str, file_id: str) -> None:
        """A copy we stopped ourselves is not a failed attempt: the file is to be copied again
        by whoever holds the job next, and what it left at the destination is ours. Written
        only while we hold the lease: a worker that took the job settles the file itself."""

        def back(doc: dict[str, Any]) -> bool:
            entry = doc["files"][file_id]
            if not self.holds(doc) or entry["state"] != ACTIVE:
                return False
            end_open_run(entry, time.time(), reason="stopped by its worker")
            entry.update(state=PENDING, service_state="SUBMITTED", ours=True)
            return True

        self.update(job_id, back)
        log.info("job %s file %s: copy stopped by this worker, to be copied again", job_id, file_id)

    def release_leases(self) -> None:
        """On a clean stop, once our copies have ended: end our leases, so that another worker
        takes our jobs at its next look instead of after the lease (a drained host's jobs)."""

        def release(doc: dict[str, Any]) -> bool:
            if not self.holds(doc):
                return False
            doc["lease"] = None
            return True

        for job_id in list(self.leases):
            try:
                self.update(job_id, release)
                log.info("job %s released: this worker is stopping", job_id)
            except StoreError as exc:
                log.warning("job %s keeps its lease until it expires: %s", job_id, exc)
            self.leases.pop(job_id, None)

    def close(self) -> None:
        self.stop_copies.set()
        self.site_pool.shutdown(wait=False, cancel_futures=True)
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.release_leases()
