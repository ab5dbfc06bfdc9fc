"""Cleaner: deletes a file's temporary copy at the source once the file is safe.

For each `done` request whose cleanup is pending (or failed before and due again) and whose
publication is over (not required, published or given up: model.WORK's "clean"; a file waiting
for its block is cleaned by the publisher, with the same functions, in the write that records
it published: one write for both; a file that needs no publication is cleaned by the
monitor in the write that records it `done`, when the deletion ends within
`cleaner.at_done_wait` seconds):
1. the temporary copy must be inside the source site's temp area (`sites.temp_pfn` refuses
   anything else: the cleaner never touches a user's files) and inside the owner's own
   temporary area (lib/owner.js `inTempArea`: never another user's output);
2. the destination copy must be confirmed: there, with the request's size and adler32;
3. only then the temporary copy is deleted with gfal2 (already gone counts as deleted).
The outcome is written in one bulk write per cycle: `cleaned`, or `cleanup_error` with the
reason, a count of attempts and the time of the next try (backoff `cleaner.base_delay` · 2^n,
capped at `cleaner.max_delay`). Deletions run `cleaner.max_per_site` at a time per source
site in each process that deletes (the cleaner's, the publisher's, the monitor's). Partition:
by source site.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, cast

from aso import model
from aso.config import Config
from aso.core import request
from aso.core.cleanup import cleanup_recorded, discardable, due
from aso.deleter import Deleter
from aso.files import Files, open_files
from aso.model import CLEANUP
from aso.runtime import Agent, Cycle
from aso.store import Server
from aso.workqueue import CLEAN, DISCARD, FIRST, RETRY, QueueView

log = logging.getLogger("aso.agent.cleaner")


class Cleaner(Agent):
    name = "cleaner"
    kinds = (CLEAN,)

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
        self.deleter = Deleter(config, self.files, self.name)
        self.next_discard = 0.0  # monotonic time of the next look for failed files' copies

    def partition_key(self, doc: Mapping[str, Any]) -> str:
        return cast(str, doc["source"])

    def due_without_work(self) -> bool:
        return time.monotonic() >= self.next_discard

    def cycle(self, ctx: Cycle) -> None:
        ctx.counts("cleaned", "cleanup_errors", "conflicts")
        if self.due_without_work():
            self.next_discard = time.monotonic() + self.config.cleaner.discard_interval
            ctx.counts("discarded")
            self.clean(ctx, self.about_to_discard(self.past_their_grace(ctx), ctx), "discarded")
        work = sorted((d for d in ctx.work if due(d, ctx.now)), key=lambda d: d["last_update"])
        self.clean(ctx, work[: self.config.cleaner.batch], "cleaned")

    def past_their_grace(self, ctx: Cycle) -> list[dict[str, Any]]:
        """This instance's files never copied whose temporary copy outlived
        `cleaner.failed_grace`, and those whose last try's backoff is over (the queue view's
        "discard": each range holds only rows due, so no number of rows not due yet, a
        user's whose deletions keep failing say, keeps the others waiting)."""
        settings, queue = self.config.cleaner, QueueView(self.db)
        limit = settings.batch * ctx.partition.size
        found = queue.keyed_before(DISCARD, ctx.now, limit, RETRY) + queue.keyed_before(
            DISCARD, ctx.now - settings.failed_grace, limit, FIRST
        )
        mine = [d for d in found if ctx.partition.mine(self.partition_key(d))]
        return [d for d in mine if discardable(d, ctx.now, settings.failed_grace)][: settings.batch]

    def about_to_discard(self, docs: list[dict[str, Any]], ctx: Cycle) -> list[dict[str, Any]]:
        """The files whose discard is recorded as under way (`discarding`) before any is
        deleted: a resubmission or a job retry's renewal is refused from then until its
        outcome is written (one that came first wins: its file is not deleted)."""
        if not docs:
            return []
        seen = {d["_id"]: (d[model.STATE], d[CLEANUP]) for d in docs}

        def decide(doc: dict[str, Any]) -> dict[str, Any] | None:
            if (doc.get(model.STATE), doc.get(CLEANUP)) != seen[doc["_id"]]:
                return None
            return request.discarding(doc, ctx.now)

        outcome = self.db.write_decided(docs, decide)
        ctx.count("conflicts", len(outcome.not_written))
        return outcome.written

    def clean(self, ctx: Cycle, work: list[dict[str, Any]], counted: str) -> None:
        """Delete the temporary copies of `work` and record each outcome (`counted` names the
        count of those deleted)."""
        if not work:
            return
        now, report = ctx.now, ctx.counts(counted)
        outcomes = self.deleter.clean_all(work)
        seen = {doc["_id"]: (doc[model.STATE], doc[CLEANUP]) for doc in work}

        def decide(doc: dict[str, Any]) -> dict[str, Any] | None:
            # Read again after a conflict (a user's `aso publish --retry` or resubmission, the
            # publisher): the outcome still holds while the file's state and cleanup are where
            # this cycle found them.
            if (doc.get(model.STATE), doc.get(CLEANUP)) != seen[doc["_id"]]:
                return None
            return cleanup_recorded(
                doc, outcomes[doc["_id"]], self.instance, now, self.config.cleaner
            )

        outcome = self.db.write_decided(work, decide)
        report["conflicts"] += len(outcome.not_written)
        for doc in outcome.written:
            report[counted if doc[CLEANUP] == "cleaned" else "cleanup_errors"] += 1
            log.debug(
                "file %s: temporary copy %s at %s: %s",
                doc["_id"],
                doc["source_lfn"],
                doc["source"],
                outcomes[doc["_id"]].reason,
            )
        ctx.note_written(outcome.written)

    def close(self) -> None:
        self.deleter.close()
