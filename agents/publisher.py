"""Publisher: puts finished output files into the catalog, block by block.

Done files waiting for publication are grouped by (user, dataset). A block is closed when it
holds `publisher.max_files_per_block` files or `publisher.max_block_bytes` of file entries (a
block over the store's document size limit would be refused), when its oldest file has waited
`publisher.block_closure_timeout` seconds since its copy ended, or when the user's task is over
(no request of it still on its way): aso/core/publication.py decides. Publishing a block is
crash-safe and idempotent with one write per file, because the catalog is the record of what
was published:

0. every file of a closed block is confirmed at its destination first (aso.core.destination,
   aso.files.Confirmer: there, with the request's size and adler32; one look per file, all
   sites at once): the document is a claim (a request may be created `done` by its owner), the
   storage is the truth. A file that is missing or different is not published
   (`publication_failed` at once, naming what was found); one whose storage cannot be asked
   gets a publication error, with the backoff below; the rest of the block goes on without
   them;
1. the block's name is derived from its content (dataset + LFNs, aso.catalog.base.block_name)
   and the block goes to the catalog; a block already there with the same files is not
   inserted again;
2. the files become `published` with the block's name, in one bulk write per cycle; the same
   write records their temporary copies deleted (`cleaned`, or `cleanup_error` for the cleaner
   to try again), which the publisher does just before with the cleaner's own functions
   (aso/deleter.py; the destination was confirmed in step 0, and is not looked at twice).
   The cleaner takes a file only once its publication is over, so a published file costs one
   write for both axes.

A crash between the two leaves the files waiting: the next cycle makes the same block (the
catalog answers "already there") or one with more files, which the catalog refuses for the
files it holds in another block of the dataset: those are `published` there and the rest wait
for the next block. A failed publication is retried up to
`publisher.max_attempts` times with backoff (`publication_error`, waiting again once the backoff
is over); the last failure, or one that cannot heal, ends the files `publication_failed` with
the reason in one write, which `aso publish --retry TASK` resets. Partition: by (user,
dataset).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from typing import Any, cast

from aso import model
from aso.catalog import open_catalog
from aso.catalog.base import (
    Block,
    BlockConflict,
    CatalogError,
)
from aso.config import Config
from aso.core import request
from aso.core.cleanup import cleanup_recorded
from aso.core.cleanup import due as cleanup_due
from aso.core.destination import DIFFERENT, UNANSWERED, Finding, not_published_reason, unchecked
from aso.core.publication import (
    ERROR,
    WAITING,
    close_blocks,
    dataset_of,
    failures_since_reset,
    make_block,
)
from aso.deleter import Deleter, destination_look
from aso.files import MISSING, Confirmer, Files, open_files
from aso.model import CLEANUP, ON_ITS_WAY, PUBLICATION, STATE
from aso.runtime import Agent, Cycle, set_aside_reason
from aso.sites import SiteError
from aso.store import Server
from aso.workqueue import ON_ITS_WAY_KINDS, PUBLISH

log = logging.getLogger("aso.agent.publisher")

# The files of a cycle's blocks are written `published` in bulk every this many files or seconds.
FLUSH_FILES, FLUSH_SECONDS = 500, 5.0
# Seconds the publisher waits for the looks at a cycle's destinations. A look that has not ended
# by then (a large file's checksum reads the whole file; an XRootD checksum request stalled for
# 120 s once in a benchmark) leaves its file waiting, unwritten, for a later cycle.
LOOK_WAIT = 10.0


def what_was_found(findings: Mapping[str, Finding], docs: list[dict[str, Any]]) -> Counter[str]:
    """How many of `docs` were missing, different or could not be checked (for the log)."""
    counts: Counter[str] = Counter()
    for doc in docs:
        finding = findings[doc["_id"]]
        if finding.verdict == DIFFERENT:
            counts["missing" if finding.detail == MISSING else "different"] += 1
        else:
            counts["not checked"] += 1
    return counts


class Publisher(Agent):
    name = "publisher"
    kinds = (PUBLISH,)

    def __init__(
        self,
        config: Config,
        instance: str | None = None,
        catalog: Any = None,
        files: Files | None = None,
        *,
        server: Server | None = None,
    ):
        super().__init__(config, instance, server=server)
        self.catalog = catalog or open_catalog(config, self.server)
        files = files or open_files(config)
        self.deleter = Deleter(config, files, self.name)
        self.confirmer = Confirmer(files)
        # Requests on their way, by task: those the queue view held when the work set started,
        # kept current by the `_changes` feed since.
        self.on_its_way: dict[str, set[str]] = defaultdict(set)

    observes = True
    observed_kinds = ON_ITS_WAY_KINDS

    def forget(self) -> None:
        self.on_its_way.clear()

    def observe(self, doc: Mapping[str, Any]) -> None:
        """Every document of the feed, and the requests on their way when the work set
        started. A request's creation comes before its copy ends in the feed, so when a
        task's file is seen done, every request of the task recorded before it has been seen
        too: this view of a task is never behind the files at hand."""
        task = doc.get("task")
        if doc.get("type") != model.REQUEST_TYPE or not task:
            return
        if doc.get(STATE) in ON_ITS_WAY:
            self.on_its_way[task].add(doc["_id"])
        elif task in self.on_its_way:
            self.on_its_way[task].discard(doc["_id"])
            if not self.on_its_way[task]:
                del self.on_its_way[task]

    def partition_key(self, doc: Mapping[str, Any]) -> str:
        return f"{doc['user']}:{dataset_of(doc)}"

    def pause(self, mine: list[dict[str, Any]]) -> tuple[float, bool]:
        # Between cycles, the blocks published lately are looked at again (two publishers'
        # blocks sharing a file: the catalog's checks may have missed each other's at first).
        self.settle_catalog()
        return super().pause(mine)

    def settle_catalog(self) -> None:
        try:
            self.catalog.settle()
        except Exception as exc:  # the catalog's client: the next look tries again
            log.warning("blocks published lately not looked at again: %s", exc)

    def close(self) -> None:
        self.catalog.close()
        self.deleter.close()
        self.confirmer.close()

    def cycle(self, ctx: Cycle) -> None:
        now, by = ctx.now, self.instance
        self.settle_catalog()
        ctx.counts(
            "blocks", "published", "unconfirmed", "looking", "cleaned", "cleanup_errors", "errors",
            "failed", "conflicts",
        )  # fmt: skip
        docs = [d for d in ctx.work if d.get(STATE) == "done"]
        # Failed publications whose backoff is over wait for a block again.
        due = [
            d
            for d in docs
            if d[PUBLICATION] == ERROR and (d.get("publication_retry_after") or 0) <= now
        ]
        again, _ = self._advance(due, ERROR, ctx, lambda d: request.publication_retried(d, by, now))
        waiting: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for doc in [d for d in docs if d[PUBLICATION] == WAITING] + again:
            waiting[(doc["user"], dataset_of(doc))].append(doc)
        settings = self.config.publisher
        blocks = [
            block_docs
            for group in waiting.values()
            for block_docs in close_blocks(
                group,
                now,
                settings.max_files_per_block,
                settings.block_closure_timeout,
                self.task_over,
                settings.max_block_bytes,
            )
        ]
        blocks = self.confirmed(blocks, ctx)
        published: list[tuple[dict[str, Any], str, str]] = []  # (file, its block, why)
        flushed = time.monotonic()
        # Blocks go to the catalog together (the embedded catalog takes a call in four
        # requests; one block at a time, a cycle of 300 blocks took a minute at 20x design).
        per_call = settings.blocks_per_call
        for start in range(0, len(blocks), per_call):
            published += self.publish(blocks[start : start + per_call], ctx)
            # A long cycle (a backlog of blocks) writes its files as it goes: their owners do
            # not wait for the last block.
            if len(published) >= FLUSH_FILES or time.monotonic() - flushed >= FLUSH_SECONDS:
                self.mark_published(published, ctx)
                published, flushed = [], time.monotonic()
        self.mark_published(published, ctx)

    def task_over(self, task: str) -> bool:
        """No request of the task is still on its way, as the queue view (when the work set
        started) and the feed (since) showed them. Without a store read: a fresh read of the
        task index here waited for the embedded store to index every change since the last
        one (151 s in a cycle at 16x design, the publication's latency with it)."""
        return not self.on_its_way.get(task)

    def confirmed(
        self, blocks: list[list[dict[str, Any]]], ctx: Cycle
    ) -> list[list[dict[str, Any]]]:
        """The blocks, each with only its files confirmed at their destination: there, with the
        request's size and adler32 (one look per file, all sites at once). The others are not
        published: a file missing or different there, or whose storage answered with an error,
        gets a publication error naming what was found, tried again after the backoff like a
        catalog's failure (given up after `publisher.max_attempts`); a file whose look has not
        answered yet waits as it is for a later cycle, which takes the look's finding. The rest
        of a block goes on without them."""
        docs = [doc for block in blocks for doc in block]
        if not docs:
            return blocks
        findings = self.look(docs)
        later = {doc["_id"] for doc in docs if findings[doc["_id"]].verdict == UNANSWERED}
        refused = [
            doc for doc in docs if doc["_id"] not in later and not findings[doc["_id"]].confirmed
        ]
        ctx.count("looking", len(later))
        if refused:
            self.refuse(refused, findings, ctx)
        left_out = later | {doc["_id"] for doc in refused}
        if not left_out:
            return blocks
        return [
            kept for block in blocks if (kept := [d for d in block if d["_id"] not in left_out])
        ]

    def refuse(
        self, docs: list[dict[str, Any]], findings: Mapping[str, Finding], ctx: Cycle
    ) -> None:
        """Files not confirmed at their destination: their publication errors, each with what
        was found. A file the storage disproves (missing, another size or adler32) fails at
        once: trying again cannot make it appear, and each try would cost a look and writes
        (a user's false claims had the publisher rewrite 10,000 of them, ten writes each); its
        owner resets it (`aso publish --retry`) once the file is there. A storage that could
        not be asked is tried again after the backoff."""
        reasons = {doc["_id"]: not_published_reason(doc, findings[doc["_id"]]) for doc in docs}
        for doc in docs:
            log.debug("file %s: %s", doc["_id"], reasons[doc["_id"]])
        ctx.count("unconfirmed", len(docs))
        given_up = self.record_errors(
            docs, reasons, None, lambda doc: findings[doc["_id"]].verdict != DIFFERENT, ctx
        )
        found = what_was_found(findings, docs)
        log.warning(
            "%d files not published, not confirmed at their destination (%s)%s",
            len(docs),
            ", ".join(f"{n} {what}" for what, n in sorted(found.items())),
            f", {given_up} given up" if given_up else "",
        )

    def look(self, docs: list[dict[str, Any]]) -> dict[str, Finding]:
        """What a look at each file's destination found, by id."""
        findings: dict[str, Finding] = {}
        looks = []
        for doc in docs:
            try:
                looks.append(destination_look(self.config, doc))
            except SiteError as exc:  # a site the configuration lacks: nothing to ask
                findings[doc["_id"]] = unchecked(str(exc))
        return {**self.confirmer.look_all(looks, LOOK_WAIT), **findings}

    def publish(
        self, blocks: list[list[dict[str, Any]]], ctx: Cycle
    ) -> list[tuple[dict[str, Any], str, str]]:
        """Blocks (each its files) to the catalog in one call; the files the catalog holds
        now, each with its block and why (their `published` is written for the whole cycle at
        once). A failure is written at once."""
        made = [make_block(docs) for docs in blocks]
        outcomes = self.outcomes(made)
        published: list[tuple[dict[str, Any], str, str]] = []
        for docs, block, outcome in zip(blocks, made, outcomes, strict=True):
            published += self.settle(docs, block, outcome, ctx)
        return published

    def outcomes(self, blocks: list[Block]) -> list[bool | Exception]:
        """The catalog's answer for each block. A call that fails as a whole is made again block
        by block, so that each block gets its own outcome: one block's failure is never
        another's (one user's oversized block had failed every block of the call)."""
        try:
            return cast(list[bool | Exception], self.catalog.publish_blocks(blocks))
        except Exception as exc:  # the catalog's client failed the call as a whole
            if len(blocks) == 1:
                return [exc]
            log.warning("a catalog call of %d blocks failed (%s): block by block", len(blocks), exc)
            return [self.outcomes([block])[0] for block in blocks]

    def settle(
        self, docs: list[dict[str, Any]], block: Block, outcome: bool | Exception, ctx: Cycle
    ) -> list[tuple[dict[str, Any], str, str]]:
        """What the catalog answered for one block: its files, published in it (or in the
        blocks that already held them), or their failure written."""
        if isinstance(outcome, BlockConflict):
            settled = self.published_elsewhere(docs, outcome)
            if settled is None:
                self.failed(docs, block.name, outcome, ctx)
                return []
            return settled
        if isinstance(outcome, CatalogError):
            self.failed(docs, block.name, outcome, ctx)
            return []
        if isinstance(outcome, Exception):
            # An error of ours or of the catalog's client on this block: a publication error
            # like any other (tried again after the backoff, given up after max_attempts),
            # with the reason in the documents, so that it cannot stop the publisher.
            reason = set_aside_reason(self.name, docs[0], outcome)
            self.failed(docs, block.name, CatalogError(reason), ctx)
            return []
        inserted = outcome
        ctx.count("blocks", 1)
        log.debug(
            "block %s (%s, %d files) %s the catalog",
            block.name,
            dataset_of(docs[0]),
            len(docs),
            "inserted in" if inserted else "was already in",
        )
        return [(doc, block.name, f"in block {block.name}") for doc in docs]

    def published_elsewhere(
        self, docs: list[dict[str, Any]], exc: BlockConflict
    ) -> list[tuple[dict[str, Any], str, str]] | None:
        """Files the catalog already holds in another block of their dataset were published
        there (by another publisher that acted on them at the same time, or before a crash):
        they are `published` in that block; the rest wait for the next block. The catalog is
        the truth; calling such a file failed would tell its owner the opposite of what the
        catalog says. None: not that case (a file is in another dataset's block, a real
        conflict)."""
        dataset = dataset_of(docs[0])
        elsewhere = exc.elsewhere
        if not elsewhere or any(b.split("#", 1)[0] != dataset for b in elsewhere.values()):
            return None
        settled = []
        for doc in docs:
            other = elsewhere.get(doc["destination_lfn"])
            if other:
                settled.append((doc, other, f"in block {other} (published there before)"))
        log.debug("%d files of %s were already in other blocks", len(settled), dataset)
        return settled

    def mark_published(self, done: list[tuple[dict[str, Any], str, str]], ctx: Cycle) -> None:
        """The cycle's published files, their temporary copies deleted first, in one bulk
        write. A file written meanwhile (a user's reset, another publisher) is read again and
        marked if it still waits: the catalog holds it whatever its document says; its
        deletion is recorded if its cleanup is still where this cycle found it (else the
        cleaner finds the copy already gone)."""
        if not done:
            return
        by, now = self.instance, ctx.now
        where = {doc["_id"]: (block, why) for doc, block, why in done}
        to_clean = [doc for doc, _, _ in done if cleanup_due(doc, now)]
        # Every file of a cycle's blocks was confirmed at its destination before the catalog
        # call (`confirmed`): the deletion does not look again.
        deleted = self.deleter.clean_all(to_clean, confirmed={doc["_id"] for doc in to_clean})
        seen = {doc["_id"]: doc[CLEANUP] for doc in to_clean}
        recorded: dict[str, bool] = {}  # file → its deletion recorded in the write (cleaned?)

        def decide(doc: dict[str, Any]) -> dict[str, Any] | None:
            recorded.pop(doc["_id"], None)
            if doc.get(STATE) != "done" or doc.get(PUBLICATION) not in (WAITING, ERROR):
                return None
            block, why = where[doc["_id"]]
            new = request.published(doc, by, now, block, why)
            outcome = deleted.get(doc["_id"])
            if outcome is not None and doc.get(CLEANUP) == seen[doc["_id"]]:
                new = cleanup_recorded(new, outcome, by, now, self.config.cleaner)
                recorded[doc["_id"]] = outcome.cleaned
            return new

        outcome = self.db.write_decided([doc for doc, _, _ in done], decide)
        ctx.count("conflicts", len(outcome.not_written))
        ctx.count("published", len(outcome.written))
        for doc in outcome.written:
            if doc["_id"] in recorded:
                ctx.count("cleaned" if recorded[doc["_id"]] else "cleanup_errors", 1)
        ctx.note_written(outcome.written)

    def failed(self, docs: list[dict[str, Any]], name: str, exc: CatalogError, ctx: Cycle) -> None:
        """A block the catalog refused or failed: its files' publication errors."""
        reason = str(exc)[: request.MAX_REASON]
        given_up = self.record_errors(
            docs, {doc["_id"]: reason for doc in docs}, name, lambda _: exc.retryable, ctx
        )
        kind = "conflict" if isinstance(exc, BlockConflict) else "error"
        log.warning(
            "block %s of %d files not published (%s%s): %s",
            name,
            len(docs),
            kind,
            ", given up" if given_up else "",
            exc,
        )

    def record_errors(
        self,
        docs: list[dict[str, Any]],
        reasons: Mapping[str, str],
        block: str | None,
        retryable: Callable[[Mapping[str, Any]], bool],
        ctx: Cycle,
    ) -> int:
        """`publication_error` (each file with its reason) with a next try after a backoff;
        `publication_failed` in the same one write when its error cannot heal (`retryable`
        says, file by file) or this was the last of `publisher.max_attempts`. Returns how many
        were given up."""
        settings = self.config.publisher
        by, now = self.instance, ctx.now

        def attempt(doc: Mapping[str, Any]) -> dict[str, Any]:
            attempts = failures_since_reset(doc) + 1
            reason = reasons[doc["_id"]]
            if not retryable(doc) or attempts >= settings.max_attempts:
                return request.publication_refused(doc, by, now, reason, attempts, block)
            delay = min(settings.max_delay, settings.base_delay * 2 ** (attempts - 1))
            retry_after = round(now + delay, 3)
            return request.publication_failed_attempt(
                doc, by, now, reason, attempts, retry_after, block
            )

        written, _ = self._advance(
            [d for d in docs if d[PUBLICATION] == WAITING], WAITING, ctx, attempt
        )
        failed = sum(1 for d in written if d[PUBLICATION] == "publication_failed")
        ctx.count("errors", len(written) - failed)
        ctx.count("failed", failed)
        return failed

    def _advance(
        self,
        docs: list[dict[str, Any]],
        source: str,
        ctx: Cycle,
        change: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """Make `change` (an operation of aso.core.request) to files whose publication is at
        `source`; returns (the files as written, the ids not changed). A file written meanwhile
        by another agent or its owner is read again and changed if it is still
        done and at `source`."""

        def decide(doc: dict[str, Any]) -> dict[str, Any] | None:
            if doc.get(STATE) != "done" or doc.get(PUBLICATION) != source:
                return None
            return change(doc)

        if not docs:
            return [], []
        outcome = self.db.write_decided(docs, decide)
        ctx.count("conflicts", len(outcome.not_written))
        ctx.note_written(outcome.written)
        return outcome.written, outcome.not_written
