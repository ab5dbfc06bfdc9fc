"""The `sim` transfer service: no data moves.

Jobs are kept in the job table (aso.transfer.jobstore) like the gfal service's; the fate of each
file is drawn when it is asked for, from a random generator seeded with (sim.seed, job, file),
so every process that asks sees the same outcome: a start, a duration from `sim.distribution`
with mean `sim.mean_duration` (one longer than `sim.timeout` fails as a timeout), a failure
with probability `sim.link_failure_rates["SRC>DST"]` (else `sim.failure_rate`) and a class
drawn from `sim.failure_classes`, and failures for the files in flight at a site during one of
`sim.outages` (seconds after the simulation's epoch, recorded once in the job table so that all
processes share it): an outage of a `site` (its storage is down: connection refused; with
`class` timeout frozen, quota full, or with a `user` and class permission refusing that user)
or of a `link` ("SRC>DST", shell wildcards allowed, e.g. "T2_SM_Site001>*": the service fails
it). `fault_at` tells the hold checker what a look at a simulated site finds. A quota with
`bytes` is a size limit instead of a time the site is full (aso/transfer/sim_quota.py): the
copies that end there are decided through its ledger, in `status`, and `free_space` reports
what is left of it.

Since a file's copy is a function of its job document, `copies(doc)` gives what the service
did with each file (start and end, a cancel included): the simulator checks from it that no
file was ever copied twice at the same time.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from aso.config import SimConfig
from aso.store import Conflict, Database
from aso.transfer import errors
from aso.transfer.base import (
    ACTIVE,
    CANCELED,
    DONE,
    FAILED,
    PENDING,
    FileStatus,
    JobStatus,
)
from aso.transfer.jobstore import JobTableService
from aso.transfer.sim_quota import Landing, Ledgers, byte_quotas, copy_key, is_byte_quota

EPOCH_DOC = "sim:epoch"


@dataclass(frozen=True)
class Fate:
    start: float
    end: float
    error_class: str | None
    reason: str | None


def fault_of(outage: Mapping[str, Any]) -> tuple[str, str]:
    """(error class, reason) of a copy an outage at a site fails: down (connection refused,
    the default), frozen (a timeout), full (quota) or forbidding a user (permission)."""
    site, error_class = outage.get("site"), outage.get("class", errors.CONNECTION)
    reasons = {
        errors.CONNECTION: f"simulated outage of {site}: connection refused",
        errors.TIMEOUT: f"simulated frozen {site}: no answer within the copy's timeout",
        errors.QUOTA: f"simulated full {site}: no space left on device"
        + (f" (quota of {outage['bytes']} bytes)" if is_byte_quota(outage) else ""),
        errors.PERMISSION: f"simulated {site} refusing {outage.get('user')}: permission denied",
    }
    return error_class, reasons.get(error_class, f"simulated fault of {site} ({error_class})")


def _whole_site(outage: Mapping[str, Any]) -> bool:
    """An outage of a whole site (down or frozen) fails copies from it too; a full or
    forbidding destination only copies to it."""
    return outage.get("class", errors.CONNECTION) in (errors.CONNECTION, errors.TIMEOUT) and (
        outage.get("user") is None
    )


def _rng(seed: int, *parts: str) -> random.Random:
    digest = hashlib.sha256("\0".join([str(seed), *parts]).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def draw_duration(rng: random.Random, config: SimConfig) -> float:
    mean = config.mean_duration
    if config.distribution == "fixed":
        return mean
    if config.distribution == "lognormal":
        sigma = 1.0
        return rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma)
    return rng.expovariate(1.0 / mean)


def draw_error_class(rng: random.Random, weights: Mapping[str, float]) -> str:
    classes = sorted(weights)
    return rng.choices(classes, weights=[weights[c] for c in classes])[0]


class SimService(JobTableService):
    name = "sim"

    def __init__(self, db: Database, config: SimConfig, clock: Callable[[], float] = time.time):
        super().__init__(db, clock)
        self.db = db
        self.config = config
        self._epoch: float | None = None
        self.ledgers = Ledgers(db)

    # -- the shared epoch -------------------------------------------------------------------
    @property
    def epoch(self) -> float:
        if self._epoch is None:
            doc = self.db.get(EPOCH_DOC)
            if doc is None:
                with contextlib.suppress(Conflict):
                    self.db.create({"_id": EPOCH_DOC, "type": "sim_epoch", "epoch": self.clock()})
                doc = self.db.get(EPOCH_DOC)
            assert doc is not None
            self._epoch = float(doc["epoch"])
        return self._epoch

    # -- the interface ------------------------------------------------------------------------
    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus | None]:
        now = self.clock()
        docs = self.jobs.get_many(job_ids)
        fates = {
            job_id: {file_id: self.fate(doc, file_id) for file_id in doc["files"]}
            for job_id, doc in docs.items()
            if doc
        }
        self._land(docs, fates, now)
        return {
            job_id: (self._status(doc, fates[job_id], now) if doc else None)
            for job_id, doc in docs.items()
        }

    # -- destinations with a size limit ------------------------------------------------------
    def _land(
        self,
        docs: Mapping[str, Mapping[str, Any] | None],
        fates: dict[str, dict[str, Fate]],
        now: float,
    ) -> None:
        """Decide the copies that ended by `now` at a destination with a byte quota in force
        when they ended: those its ledger refuses fail there (class quota) instead.
        TransferError when a ledger cannot be settled (the monitor asks again)."""
        quotas = byte_quotas(self.config.outages)
        if not quotas:
            return
        landing: dict[int, list[tuple[str, str, Landing]]] = {}
        for job_id, by_file in fates.items():
            doc = cast(Mapping[str, Any], docs[job_id])  # fates are drawn for the jobs found
            for file_id, fate in by_file.items():
                index = self._quota_of(quotas, doc, file_id, fate, now)
                if index is not None:
                    size = int(doc["files"][file_id].get("size") or 0)
                    copy = Landing(copy_key(job_id, file_id), size, fate.end)
                    landing.setdefault(index, []).append((job_id, file_id, copy))
        for index, copies in landing.items():
            refused = self.ledgers.settle(quotas[index], [copy for _, _, copy in copies])
            for job_id, file_id, copy in copies:
                if copy.key in refused:
                    fate = fates[job_id][file_id]
                    fates[job_id][file_id] = Fate(fate.start, fate.end, *fault_of(quotas[index]))

    def _quota_of(
        self,
        quotas: Sequence[Mapping[str, Any]],
        doc: Mapping[str, Any],
        file_id: str,
        fate: Fate,
        now: float,
    ) -> int | None:
        """The byte quota that decides this copy: one that would land by `now`, not cancelled
        before, at a destination whose limit was in force when it ended; None: no quota does."""
        if fate.error_class is not None or fate.end > now:
            return None
        canceled_at = (doc.get("cancel") or {}).get(file_id)
        if canceled_at is not None and canceled_at < fate.end:
            return None
        for index, quota in enumerate(quotas):
            if quota.get("site") == doc["destination_site"] and self._in_force(quota, fate.end):
                return index
        return None

    def _in_force(self, quota: Mapping[str, Any], at: float) -> bool:
        return (
            self.epoch + float(quota.get("start", 0))
            <= at
            < self.epoch + float(quota.get("end", 0))
        )

    def free_space(self, site: str, now: float | None = None) -> int | None:
        """Bytes free at `site` where a byte quota is in force at `now` (default: the clock's
        time, read after the epoch, which the first look may set), its limit less what landed
        since its start; None elsewhere: the simulated storage does not say."""
        quotas = [q for q in byte_quotas(self.config.outages) if q.get("site") == site]
        if not quotas:
            return None
        now = max(self.epoch, self.clock() if now is None else now)
        for quota in quotas:
            if self._in_force(quota, now):
                return max(0, int(quota["bytes"]) - self.ledgers.used(quota))
        return None

    # -- fates ---------------------------------------------------------------------------------
    def fate(self, doc: Mapping[str, Any], file_id: str) -> Fate:
        # Drawn from the request and its attempt number where the job records it: one seed,
        # the same durations and failures for each attempt of each file, however the files were
        # batched into jobs (job ids are new each run); else from the job and the file.
        attempt = ((doc.get("files") or {}).get(file_id) or {}).get("attempt")
        parts = (file_id, f"attempt {attempt}") if attempt is not None else (doc["_id"], file_id)
        rng = _rng(self.config.seed, *parts)
        start = float(doc["created"])
        end = start + draw_duration(rng, self.config)
        link = f"{doc['source_site']}>{doc['destination_site']}"
        rate = self.config.link_failure_rates.get(link, self.config.failure_rate)
        outage = self._outage(doc, start, end)
        if outage is not None:
            return outage
        if self.config.timeout and end - start > self.config.timeout:
            # What FTS does to a transfer that outlasts its timeout; it also bounds the
            # exponential distribution's tail.
            return Fate(
                start,
                start + self.config.timeout,
                errors.TIMEOUT,
                f"simulated transfer timeout after {self.config.timeout:g} s on {link}",
            )
        if rng.random() < rate:
            error_class = draw_error_class(rng, self.config.failure_classes)
            at = start + rng.random() * (end - start)
            return Fate(start, at, error_class, f"simulated failure ({error_class}) on {link}")
        return Fate(start, end, None, None)

    def _outage(self, doc: Mapping[str, Any], start: float, end: float) -> Fate | None:
        """The failure of a file in flight during an outage of its sites or its link."""
        link = f"{doc['source_site']}>{doc['destination_site']}"
        for outage in self.config.outages:
            if is_byte_quota(outage):
                continue  # a size limit fails only what does not fit (`_land`)
            o_start = self.epoch + float(outage.get("start", 0))
            o_end = self.epoch + float(outage.get("end", 0))
            if not (o_start < end and start < o_end):
                continue
            at = max(start, o_start)
            site = outage.get("site")
            if site is not None and self._hits(outage, doc["destination_site"], doc.get("user")):
                return Fate(start, at, *fault_of(outage))
            if site is not None and site == doc["source_site"] and _whole_site(outage):
                return Fate(start, at, *fault_of(outage))
            pattern = outage.get("link")
            if pattern is not None and fnmatch.fnmatchcase(link, pattern):
                return Fate(
                    start, at, errors.SERVICE, f"simulated failure of link {link} at the service"
                )
        return None

    @staticmethod
    def _hits(outage: Mapping[str, Any], destination: str, user: str | None) -> bool:
        """Whether an outage at a site fails a copy to it (a user's fault: that user's only)."""
        return outage.get("site") == destination and outage.get("user") in (None, user)

    def fault_at(self, site: str, user: str, now: float) -> str | None:
        """What a look at `site` (for `user`'s files; "" for everyone's) finds at `now`: the
        reason of an outage in force there, or None (it answers, with room and permission).
        A size limit is not found by a look: its free space says it (`free_space`)."""
        for outage in self.config.outages:
            if is_byte_quota(outage):
                continue
            o_start = self.epoch + float(outage.get("start", 0))
            o_end = self.epoch + float(outage.get("end", 0))
            whose = outage.get("user")
            if o_start <= now < o_end and outage.get("site") == site and whose in (None, user):
                return fault_of(outage)[1]
        return None

    def copies(self, doc: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
        """File id → (start, end) of its copy in this job, as the service ran it (a cancel
        ends it early; one canceled before its start never ran and is left out)."""
        runs = {}
        for file_id in doc["files"]:
            fate = self.fate(doc, file_id)
            end = fate.end
            canceled_at = doc.get("cancel", {}).get(file_id)
            if canceled_at is not None and canceled_at < fate.end:
                end = max(canceled_at, fate.start)
            if end > fate.start:
                runs[file_id] = (fate.start, end)
        return runs

    def _status(self, doc: Mapping[str, Any], fates: Mapping[str, Fate], now: float) -> JobStatus:
        files = {}
        for file_id, entry in doc["files"].items():
            fate = fates[file_id]
            canceled_at = doc.get("cancel", {}).get(file_id)
            files[file_id] = self._file_status(file_id, entry, fate, canceled_at, now)
        return JobStatus(job_id=doc["_id"], key=doc.get("key"), files=files)

    @staticmethod
    def _file_status(
        file_id: str, entry: Mapping[str, Any], fate: Fate, canceled_at: float | None, now: float
    ) -> FileStatus:
        if canceled_at is not None and canceled_at < fate.end and now >= canceled_at:
            return FileStatus(
                file_id,
                CANCELED,
                "CANCELED",
                "canceled by the client",
                errors.CANCELED,
                started=fate.start,
                ended=max(canceled_at, fate.start),
            )
        if now < fate.start:
            return FileStatus(file_id, PENDING, "SUBMITTED")
        if now < fate.end:
            return FileStatus(file_id, ACTIVE, "ACTIVE", started=fate.start)
        if fate.error_class:
            return FileStatus(
                file_id,
                FAILED,
                "FAILED",
                fate.reason,
                fate.error_class,
                started=fate.start,
                ended=fate.end,
            )
        return FileStatus(
            file_id, DONE, "FINISHED", checksum=entry["adler32"], started=fate.start, ended=fate.end
        )
