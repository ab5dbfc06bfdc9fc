"""Monitor (and reporter): follows the jobs of submitted files and writes their outcome back.

One agent does both halves of the original's monitor and reporter, with no file-system hand-off
between them: each cycle it
* cancels at the service the files whose owner asked for a kill (`kill_requested`), and
  those on a site or of a user an operator banned (aso/core/controls.py: such a file's attempt
  ends cancelled, with the ban as its reason; the retry manager gives it a cool-off, and the
  submitter starts it again once the ban is lifted);
* asks the service for the status of all active jobs in bulk (`status_batch` jobs a call) and
  writes every file that ended, in one bulk write: `done` (with the checksum the service saw,
  compared with the request's), or `failed_attempt` with the service's reason text and ASO's
  error class, or `killed` for a cancelled file whose owner asked for it;
* records `done` only a copy confirmed at its destination (aso.core.destination): by the
  service itself when the job had it compare the destination's adler32 with the request's
  (FileStatus.verified: the gfal worker and FTS3 with checksum verification, the default),
  else by a look of its own (aso.files.Confirmer: size and adler32; the simulator's sites
  have no data and confirm anything). A copy reported done that is missing or different there
  is a failed attempt (class checksum_mismatch, with what was found); one whose storage
  cannot be asked stays `submitted` until a look answers;
* deletes the temporary copies of the files it finds `done` that need no publication and
  records each deletion in the same write as the `done` (the cleaner's functions and rules,
  aso/deleter.py: one write fewer per such file); a deletion that has not ended
  within `cleaner.at_done_wait` seconds is left to the cleaner;
* waits, while its lease lasts, for the job of a file the submitter has just recorded
  `submitted` (the intent is written before the job goes to the service); when the lease has
  ended and the service still knows no job of its key (its submitter died, or the service did
  not answer it), puts the file back to `new`.

Nothing gets another attempt while its old job may still run: before a file whose job the
service does not know is put back to `new`, failed as lost or killed, the job is *fenced*
(TransferService.fence): known never to have been made and unable to be made from now on, or
its files ended there, cancelled where they had not. A job the service cannot answer for keeps
its files where they are. The lease only says when to look; the fence is what makes it safe
(docs/design.md, "Leases and fences").

Partition: by job (a job's files are followed by one instance).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal, cast

from aso import faults
from aso.config import Config
from aso.core import request
from aso.core.cleanup import cleanable_at_done, cleanup_recorded
from aso.core.controls import Setting, controls_of, held_back
from aso.core.destination import (
    Finding,
    needs_a_look,
    unchecked,
)
from aso.core.outcome import outcome
from aso.core.request import Doc
from aso.deleter import Deleter, destination_look
from aso.files import Confirmer, Files, open_files
from aso.model import AT_THE_SERVICE, BAN, CLEANUP, STATE, STOPPED
from aso.monitoring.queries import read_controls
from aso.runtime import Agent, Cycle
from aso.sites import SiteError
from aso.store import Server, StoreError
from aso.transfer import errors, open_service
from aso.transfer.base import (
    ABSENT,
    CANCELED,
    ENDED,
    Fence,
    FileStatus,
    JobStatus,
    TransferError,
)
from aso.workqueue import ACTIVE

log = logging.getLogger("aso.agent.monitor")

STATUS_BATCH = 50  # jobs per status call
# Seconds the monitor waits for its looks at destinations (copies the service did not verify);
# a file whose look has not ended stays `submitted` until the next cycle takes the finding.
LOOK_WAIT = 5.0


class Monitor(Agent):
    name = "monitor"
    kinds = (ACTIVE,)

    def __init__(
        self,
        config: Config,
        instance: str | None = None,
        files: Files | None = None,
        *,
        server: Server | None = None,
    ):
        super().__init__(config, instance, server=server)
        self.service = open_service(config, self.server)
        # (job, file) → why its cancel was sent (None: its owner's kill)
        self.cancelled: dict[tuple[str, str], Setting | None] = {}
        files = files or open_files(config)
        self.deleter = Deleter(config, files, self.name)
        self.confirmer = Confirmer(files)

    def partition_key(self, doc: Mapping[str, Any]) -> str:
        return cast(str, (doc.get("transfer") or {}).get("job_id", doc["_id"]))

    def close(self) -> None:
        self.service.close()
        self.deleter.close()
        self.confirmer.close()

    def pause(self, mine: list[dict[str, Any]]) -> tuple[float, bool]:
        """With files at the service: poll it every `transfer.status_interval`, whatever else
        is written meanwhile (a steady pace; the feed woke it after every upload and let it
        sleep up to `agents.poll_interval` plus the feed's margin in between)."""
        if any(doc.get(STATE) in AT_THE_SERVICE for doc in mine):
            return self.config.transfer.status_interval, False
        return super().pause(mine)

    def cycle(self, ctx: Cycle) -> None:
        ctx.counts(
            "done", "failed", "killed", "released", "fenced", "unfenced", "looked",
            "unconfirmed", "cleaned", "cleanup_errors", "conflicts",
        )  # fmt: skip
        updates: list[dict[str, Any]] = []
        confirmed: set[str] = set()  # files whose destination the monitor confirmed
        active = [d for d in ctx.work if d[STATE] in AT_THE_SERVICE and d.get("transfer")]
        following = {(d["transfer"]["job_id"], d["_id"]) for d in active}
        self.cancelled = {k: why for k, why in self.cancelled.items() if k in following}
        self.send_cancels([(d, None) for d in active if d[STATE] == "kill_requested"])
        self.send_cancels(self.banned([d for d in active if d[STATE] != "kill_requested"]))
        try:
            updates += self.poll(active, ctx, confirmed)
        except TransferError as exc:
            log.warning("transfer service unavailable (%s): will ask again", exc)
        self.record(self.clean_at_done(updates, ctx.now, confirmed), ctx)

    def banned(self, docs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Setting | None]]:
        """Files at the service on a site or of a user an operator banned (a drain lets them
        finish), each with its ban. Controls that cannot be read cancel nothing this cycle."""
        if not docs:
            return []
        try:
            found = controls_of(read_controls(self.db))
        except StoreError as exc:
            log.warning("operators' controls not read (%s): no ban's cancel this cycle", exc)
            return []
        held = [(doc, held_back(doc, found)) for doc in docs]
        return [(doc, ban) for doc, ban in held if ban is not None and ban.mode == BAN]

    def send_cancels(self, docs: list[tuple[dict[str, Any], Setting | None]]) -> None:
        """Cancel these files at the service, each once; why: None for its owner's kill, else
        the operator's ban."""
        by_job: dict[str, list[tuple[str, Setting | None]]] = defaultdict(list)
        for doc, why in docs:
            job_id = doc["transfer"]["job_id"]
            if (job_id, doc["_id"]) not in self.cancelled:
                by_job[job_id].append((doc["_id"], why))
        for job_id, files in by_job.items():
            file_ids = [file_id for file_id, _ in files]
            try:
                self.service.cancel(job_id, file_ids)
            except TransferError as exc:
                log.warning("cancel of %d files of job %s failed: %s", len(file_ids), job_id, exc)
                continue
            self.cancelled.update(((job_id, file_id), why) for file_id, why in files)
            whys = {why.says() if why else "the user killed them" for _, why in files}
            log.info(
                "job %s: cancel asked for %d files (%s)", job_id, len(file_ids), "; ".join(whys)
            )

    def poll(
        self, active: list[dict[str, Any]], ctx: Cycle, confirmed: set[str]
    ) -> list[dict[str, Any]]:
        """The files whose transfer ended, as they are to be written; `confirmed` gets the ids
        of those the monitor confirmed at their destination itself."""
        by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for doc in active:
            by_job[doc["transfer"]["job_id"]].append(doc)
        job_ids = sorted(by_job)
        updates = []
        ended: list[tuple[dict[str, Any], FileStatus]] = []
        for start in range(0, len(job_ids), STATUS_BATCH):
            batch = job_ids[start : start + STATUS_BATCH]
            statuses: dict[str, JobStatus | None] = self.service.status(batch)
            faults.point("monitor.after_status")
            for job_id in batch:
                job = statuses.get(job_id)
                if job is None and any(doc.get("lease") for doc in by_job[job_id]):
                    updates += self.not_at_the_service(by_job[job_id], ctx)
                    continue
                if job is None:
                    updates += self.lost(by_job[job_id], ctx)
                    continue
                ended += [(d, job.files[d["_id"]]) for d in by_job[job_id] if d["_id"] in job.files]
                updates += self.not_in_its_job(
                    [d for d in by_job[job_id] if d["_id"] not in job.files], ctx
                )
        findings = self.look([doc for doc, status in ended if needs_a_look(status)], ctx)
        for doc, status in ended:
            ban = self.cancelled.get((doc["transfer"]["job_id"], doc["_id"]))
            if ban is not None and status.state == CANCELED:
                reason = f"cancelled: {ban.says()}"
                status = dataclasses.replace(status, reason=reason, error_class=errors.CANCELED)
            finding = findings.get(doc["_id"])
            args = (status, self.instance, ctx.now, finding)
            updated = ctx.acted_on(outcome, doc, *args)
            if updated is not None:
                updates.append(updated)
                if finding is not None and finding.confirmed:
                    confirmed.add(doc["_id"])
        return updates

    def look(self, docs: list[dict[str, Any]], ctx: Cycle) -> dict[str, Finding]:
        """Look at the destinations of copies the service reported done without verifying
        them (FileStatus.verified: FTS3 without checksum verification at the destination, the
        gfal service without verification, the simulator); one look per file, all sites at
        once. Each file at DEBUG, the counts in the cycle's report."""
        if not docs:
            return {}
        findings: dict[str, Finding] = {}
        looks = []
        for doc in docs:
            try:
                looks.append(destination_look(self.config, doc))
            except SiteError as exc:  # a site the configuration lacks: it cannot be confirmed
                findings[doc["_id"]] = unchecked(str(exc))
        findings.update(self.confirmer.look_all(looks, LOOK_WAIT))
        ctx.count("looked", len(docs))
        ctx.count("unconfirmed", sum(not f.confirmed for f in findings.values()))
        for doc_id, finding in findings.items():
            log.debug(
                "file %s at its destination: %s (%s)", doc_id, finding.verdict, finding.detail
            )
        return findings

    def fenced(self, job_id: str, docs: list[dict[str, Any]], ctx: Cycle) -> Fence | None:
        """The fence of `job_id` for the files of `docs` (TransferService.fence), counted; None
        while it does not hold yet: the files wait."""
        try:
            fence = self.service.fence(job_id, [d["_id"] for d in docs])
        except TransferError as exc:
            log.info("job %s not fenced (%s): its %d files wait", job_id, exc, len(docs))
            fence = None
        ctx.count("fenced" if fence is not None else "unfenced", len(docs))
        if fence is not None:
            log.debug("job %s fenced: %s (%s)", job_id, fence.verdict, fence.detail)
        return fence

    def not_in_its_job(self, docs: list[dict[str, Any]], ctx: Cycle) -> list[dict[str, Any]]:
        """Files the job their document names does not hold (that job cannot copy them): each
        attempt failed as lost, unless another branch of the document names the job that has
        the file (its writer's intent lost CouchDB's order to one whose writer dropped the
        file from its job: CLUSTER_CONFLICTING_BRANCHES)."""

        def lost(doc: dict[str, Any]) -> Doc:
            reason = f"job {doc['transfer']['job_id']} has no file {doc['_id']}"
            return request.job_lost(doc, self.instance, ctx.now, reason, ENDED)

        return self.unless_a_branch_ran(docs, ctx, lost)

    def lost(self, docs: list[dict[str, Any]], ctx: Cycle) -> list[dict[str, Any]]:
        """Files of a job the service does not know although it got it (adopted, or recorded
        under the service's own id): once the job is fenced absent, each attempt failed as
        lost (a kill ends `killed`); a job that exists after all is followed on."""
        job_id = docs[0]["transfer"]["job_id"]
        fence = self.fenced(job_id, docs, ctx)
        if fence is None or fence.verdict != ABSENT:
            return []  # the job exists: its status comes with a later call
        reason = f"the transfer service does not know job {job_id}"
        return self.unless_a_branch_ran(
            docs, ctx, lambda d: request.job_lost(d, self.instance, ctx.now, reason, ABSENT)
        )

    def not_at_the_service(self, docs: list[dict[str, Any]], ctx: Cycle) -> list[dict[str, Any]]:
        """Files of a job the service does not know, whose submitter wrote them `submitted`
        before its call: wait while their lease lasts (the call may be under way); then ask
        the service for the key (it may have named the job otherwise), and once the job is
        fenced absent put them back to `new` (a kill ends `killed`)."""
        now = ctx.now
        lease = docs[0].get("lease") or {}
        if lease.get("until", 0) >= now:
            return []
        found = self.service.lookup(lease["job_key"]) if lease.get("job_key") else None
        if found is not None:
            if found == docs[0]["transfer"]["job_id"]:
                return []  # made since the status call: its status comes next cycle
            return [request.job_recorded(d, found, self.service.name, now) for d in docs]
        fence = self.fenced(docs[0]["transfer"]["job_id"], docs, ctx)
        if fence is None or fence.verdict != ABSENT:
            return []  # the job exists after all: followed from the next status call
        return self.unless_a_branch_ran(
            docs, ctx, lambda d: self.never_began(d, fence.verdict, now, "reached the service")
        )

    def unless_a_branch_ran(
        self, docs: list[dict[str, Any]], ctx: Cycle, go_on: Callable[[dict[str, Any]], Doc]
    ) -> list[dict[str, Any]]:
        """`go_on(doc)` for each file whose job is fenced absent, unless another branch of the
        document named a job the service has (then that job is followed), or may have."""
        updates = []
        for doc in docs:
            branch = self.settle_branches(doc, ctx)
            if branch is None:
                updates.append(go_on(doc))
            elif branch:
                updates.append(branch)
        return updates

    def settle_branches(self, doc: dict[str, Any], ctx: Cycle) -> Doc | Literal[False] | None:
        """CLUSTER_CONFLICTING_BRANCHES: two submitters stored an intent for the file on
        different nodes; the branch the cluster shows may name a job never made while the
        other's job runs. Before the file goes on, each other branch's job is followed
        (the document records it: `job_recorded`) if the service has it, or fenced and the
        branch withdrawn if not. None: no other job (go on); False: wait."""
        try:
            current = self.db.get(doc["_id"], conflicts=True)
            if current is None or current["_rev"] != doc["_rev"] or not current.get("_conflicts"):
                return None
            leaves = self.db.leaves(doc["_id"])
        except StoreError as exc:
            log.info("file %s: branches not read (%s): it waits", doc["_id"], exc)
            return False
        mine = (doc.get("transfer") or {}).get("job_id")
        for leaf in leaves:
            job_id = (leaf.get("transfer") or {}).get("job_id")
            if leaf["_rev"] == doc["_rev"] or not job_id or job_id == mine:
                continue
            try:
                if self.service.status([job_id]).get(job_id) is not None:
                    log.info(
                        "file %s: its branch %s has job %s: followed",
                        doc["_id"],
                        leaf["_rev"],
                        job_id,
                    )
                    return request.job_recorded(doc, job_id, self.service.name, ctx.now)
            except TransferError:
                return False
            fence = self.fenced(job_id, [doc], ctx)
            if fence is None:
                return False
            if fence.verdict != ABSENT:
                return request.job_recorded(doc, job_id, self.service.name, ctx.now)
            with contextlib.suppress(StoreError):  # else withdrawn at the next look
                self.db.withdraw({doc["_id"]: [leaf["_rev"]]})
            log.info(
                "file %s: branch %s withdrawn, its job %s fenced", doc["_id"], leaf["_rev"], job_id
            )
        return None

    def never_began(self, doc: dict[str, Any], fenced: str, now: float, where: str) -> Doc:
        """A file whose job is fenced absent: back to `new`, or `killed` if its owner asked."""
        if doc[STATE] == "kill_requested":
            return request.attempt_ended(
                doc,
                "killed",
                self.instance,
                now,
                outcome="canceled",
                reason=f"{request.KILLED_BEFORE_ITS_JOB} {where}",
                fenced=fenced,
            )
        return request.released(doc, self.instance, now, fenced)

    def clean_at_done(
        self, updates: list[dict[str, Any]], now: float, confirmed: Collection[str] = ()
    ) -> list[dict[str, Any]]:
        """The updates, each file found `done` that needs no publication with its temporary
        copy's deletion recorded (`cleaned`, or `cleanup_error` with its backoff) when the
        deletion ended within `cleaner.at_done_wait` seconds. Should the write then conflict,
        the next cycle finds the copy already gone, which counts as cleaned. `confirmed`: files
        whose destination this cycle confirmed already (the deletion does not look again)."""
        wait = self.config.cleaner.at_done_wait
        cleanable = [d for d in updates if d[STATE] == "done" and cleanable_at_done(d, now)]
        if wait <= 0 or not cleanable:
            return updates
        outcomes = self.deleter.clean_within(cleanable, wait, confirmed)
        settings = self.config.cleaner
        return [
            cleanup_recorded(doc, outcomes[doc["_id"]], self.instance, now, settings)
            if doc["_id"] in outcomes
            else doc
            for doc in updates
        ]

    def record(self, updates: list[dict[str, Any]], ctx: Cycle) -> None:
        """Write the outcomes; count and log each file written."""
        for doc in ctx.write(updates):
            last = doc["history"][-1] if doc["history"] else {}
            key = {
                "done": "done",
                "failed_attempt": "failed",
                "killed": "killed",
                "new": "released",
            }.get(doc[STATE])
            if key and last.get("at") == doc["last_update"]:
                ctx.count(key)
            if key == "done" and last.get("axis") == CLEANUP:
                ctx.count("cleaned" if doc[CLEANUP] == "cleaned" else "cleanup_errors")
            log.debug(
                "file %s (%s): %s%s",
                doc["_id"],
                doc["source_lfn"],
                doc[STATE],
                f" [{doc.get('error_class')}] {doc.get('failure_reason')}"
                if doc[STATE] in STOPPED and doc.get("error_class")
                else "",
            )
