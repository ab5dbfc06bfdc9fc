"""Hold checker: looks again, on a backoff, at the destinations that hold a user's files for want
of room or permission (aso/core/holds.py), and ends each hold by itself when its destination
passes (released: the submitter takes its files again) or when its deadline has passed
(expired: the submitter fails its files).

A look at a user's hold asks the destination's storage for its free space where it reports it
(XRootD's space query) and, for a permission or where no free space is reported, writes a small
probe file in the held directory and deletes it again (aso/files.py), with the credentials the
copies use; a look at a site's hold asks whether the storage answers at all. Looks run at once,
each bounded by `holds.look_timeout`.

The agent has no work kinds: every `holds.interval` seconds the first live instance reads the
holds and looks at those due. Each hold is written read-decide-write (a release by its user or
an operator meanwhile wins: the look is decided again on the fresh document).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from aso import model, sites
from aso.config import Config
from aso.core import holds
from aso.files import Files, open_files
from aso.monitoring.queries import all_holds
from aso.runtime import Cycle, PeriodicAgent
from aso.store import Server, StoreError

log = logging.getLogger("aso.agent.hold_checker")
LOOKS_AT_ONCE = 8  # destinations looked at at once


class HoldChecker(PeriodicAgent):
    name = "hold-checker"
    kinds = ()

    def __init__(
        self,
        config: Config,
        instance: str | None = None,
        files: Files | None = None,
        *,
        server: Server | None = None,
    ):
        super().__init__(config, instance, server=server)
        self.files = files or open_files(config)
        self.pool = ThreadPoolExecutor(max_workers=LOOKS_AT_ONCE, thread_name_prefix="hold-look")
        self.pending: dict[str, Future[holds.Look]] = {}  # hold id → its look under way

    @property
    def interval(self) -> float:
        return self.config.holds.interval

    def cycle(self, ctx: Cycle) -> None:
        report = ctx.counts("holds", "looked", "released", "expired", "still_held")
        if not self.take_turn(ctx.partition):
            return
        active = [d for d in all_holds(self.db) if d["state"] == model.HOLD_ACTIVE]
        report["holds"] = len(active)
        due = {
            doc["_id"]: hold
            for doc in active
            if holds.due(hold := holds.hold_of(doc), ctx.now)
            or ctx.now - hold.since > self.config.holds.deadline
        }
        looks = self.look_all(due)
        ctx.alive()
        report["looked"] = len(looks)
        if not looks:
            return

        def decide(current: dict[str, Any]) -> dict[str, Any] | None:
            return holds.checked(
                current, looks[current["_id"]], self.instance, ctx.now, self.config.holds
            )

        try:
            outcome = self.db.write_decided([d for d in active if d["_id"] in looks], decide)
        except StoreError as exc:
            log.warning("hold checks not written (%s): looked at again next cycle", exc)
            return
        for doc in outcome.written:
            state = doc["state"]
            report["still_held" if state == model.HOLD_ACTIVE else state] += 1
            if state == model.HOLD_ACTIVE:
                log.debug("hold %s still: %s", doc["_id"], holds.hold_of(doc).says())
            else:
                log.info("hold %s %s: %s", doc["_id"], state, doc["history"][-1]["reason"])
        log.info(
            "holds: %d in force, %d looked at: %d released, %d expired, %d still held",
            report["holds"], report["looked"], report["released"], report["expired"],
            report["still_held"],
        )  # fmt: skip

    def look_all(self, due: dict[str, holds.Hold]) -> dict[str, holds.Look]:
        """Look at every hold due at once, each for at most `holds.look_timeout` seconds: a
        storage that does not answer in time is a look that did not pass (its call goes on in
        its thread until the storage client's own timeout; that hold is not looked at again
        before it ends)."""
        timeout = self.config.holds.look_timeout
        futures = {
            key: self.pool.submit(self.look, hold)
            for key, hold in due.items()
            if key not in self.pending or self.pending[key].done()
        }
        self.pending.update(futures)
        wait(futures.values(), timeout=timeout)
        looks = {}
        for key, future in futures.items():
            if not future.done():
                looks[key] = holds.Look(None, f"no answer within {timeout:g} s", probed=True)
            elif future.exception() is not None:
                looks[key] = holds.Look(None, f"not looked at: {future.exception()}", probed=True)
            else:
                looks[key] = future.result()
        return looks

    def look(self, hold: holds.Hold) -> holds.Look:
        """What the hold's destination says now: for a site's hold whether it answers at all;
        for a user's, its free space, and a probe write when that does not settle it. A storage
        that fails to answer is a look that did not pass."""
        try:
            directory = sites.pfn(self.config, hold.site, hold.path)
        except sites.SiteError as exc:
            return holds.Look(None, f"cannot be checked: {exc}", probed=True)
        if not hold.user:
            return holds.Look(None, self.files.reachable(directory), probed=True)
        try:
            free = self.files.free_space(directory)
        except Exception as exc:  # a storage's error is a look that did not pass
            free = None
            log.debug("free space at %s not known: %s", directory, exc)
        if not holds.needs_probe(hold, free):
            return holds.Look(free)
        try:
            error = self.files.probe(directory)
        except Exception as exc:
            error = str(exc)
        return holds.Look(free, error, probed=True)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
