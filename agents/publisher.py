"""Publisher: puts finished output files into the catalog, block by block.

Done files waiting for publication are grouped by (user, dataset). A block is closed when it
holds `publisher.max_files_per_block` files, when its oldest file has waited
`publisher.block_closure_timeout` seconds since its copy ended, or when the user's task is over
(no request of it still on its way). Publishing a block is crash-safe and idempotent:

1. the block's name is derived from its content (dataset + LFNs, aso.catalog.base.block_name)
   and recorded on its files first (`publication` → `publishing`, `publication_block`), all of
   them or none (a file that changed meanwhile sends the others back to `pending`);
2. the block goes to the catalog; a block already there with the same files is not inserted
   again (a crash between the catalog call and step 3 is repaired by publishing again);
3. the files become `published`.
A failed publication is retried up to `publisher.max_attempts` times with backoff
(`publication_error`), then the files end `publication_failed` with the reason, which
`aso publish --retry TASK` resets. Partition: by (user, dataset).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from aso import model
from aso.catalog import open_catalog
from aso.catalog.base import (
    Block,
    BlockConflict,
    CatalogError,
    CatalogFile,
    block_name,
    content_message,
)
from aso.config import Config
from aso.core import request
from aso.model import ON_ITS_WAY, PUBLICATION, STATE
from aso.runtime import Agent, Cycle, set_aside_reason
from aso.workqueue import PUBLISH

log = logging.getLogger("aso.agent.publisher")

WAITING = "pending"
PUBLISHING = "publishing"
ERROR = "publication_error"


def dataset_of(doc: Mapping[str, Any]) -> str:
    return cast(str, (doc.get("publish_info") or {}).get("dataset", ""))


def done_at(doc: Mapping[str, Any]) -> float:
    """When the file's copy ended (its `done` transition)."""
    ended: float = max(
        (h["at"] for h in doc.get("history", []) if h["axis"] == STATE and h["to"] == "done"),
        default=doc["last_update"],
    )
    return ended


def failures_since_reset(doc: Mapping[str, Any]) -> int:
    """Failed publications since the owner last reset the file (`aso publish --retry`)."""
    pub = [h for h in doc.get("history", []) if h["axis"] == PUBLICATION]
    reset = max((h["at"] for h in pub if h["from"] == "publication_failed"), default=0.0)
    return sum(1 for h in pub if h["to"] == ERROR and h["at"] >= reset)


def catalog_file(doc: Mapping[str, Any]) -> CatalogFile:
    info = doc.get("publish_info") or {}
    return CatalogFile(
        lfn=doc["destination_lfn"],
        size=doc["size"],
        adler32=doc["checksum"]["adler32"],
        events=info.get("events", 0),
        lumis=info.get("lumis", {}),
        parents=tuple(info.get("parents", [])),
    )


def make_block(docs: Sequence[Mapping[str, Any]], name: str | None = None) -> Block:
    first = docs[0]
    dataset = dataset_of(first)
    return Block(
        name=name or block_name(dataset, [d["destination_lfn"] for d in docs]),
        dataset=dataset,
        user=first["user"],
        origin_site=first["destination"],
        files=tuple(catalog_file(d) for d in docs),
    )


def close_blocks(
    waiting: list[dict[str, Any]], now: float, max_files: int, timeout: float, task_over: Any
) -> list[list[dict[str, Any]]]:
    """The blocks to publish now out of one (user, dataset)'s waiting files, oldest first."""
    ordered = sorted(waiting, key=lambda d: (done_at(d), d["_id"]))
    blocks = []
    while len(ordered) >= max_files:
        blocks.append(ordered[:max_files])
        ordered = ordered[max_files:]
    if ordered and (
        now - done_at(ordered[0]) >= timeout
        or all(task_over(task) for task in {d["task"] for d in ordered})
    ):
        blocks.append(ordered)
    return blocks


class Publisher(Agent):
    name = "publisher"
    kinds = (PUBLISH,)

    def __init__(self, config: Config, instance: str | None = None, catalog: Any = None):
        super().__init__(config, instance)
        self.catalog = catalog or open_catalog(config, self.server)
        # Requests on their way, by task, as the `_changes` feed last showed them.
        self.on_its_way: dict[str, set[str]] = defaultdict(set)

    observes = True

    def observe(self, doc: Mapping[str, Any]) -> None:
        """Every document of the feed. A request's creation comes before its copy ends in the
        feed, so when a task's file is seen done, every request of the task recorded before
        it has been seen too: the feed's view of a task is never behind the files at hand."""
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

    def close(self) -> None:
        self.catalog.close()

    def cycle(self, ctx: Cycle) -> None:
        now = ctx.now
        ctx.counts("blocks", "published", "errors", "failed", "conflicts")
        docs = [d for d in ctx.work if d.get(STATE) == "done"]
        # 1. blocks recorded earlier and not finished (a crash), and failed ones now due again
        recorded: dict[str, list[dict[str, Any]]] = defaultdict(list)
        freed: list[dict[str, Any]] = []  # files of blocks abandoned half-way, pending again
        for doc in docs:
            if doc[PUBLICATION] == PUBLISHING or (
                doc[PUBLICATION] == ERROR and (doc.get("publication_retry_after") or 0) <= now
            ):
                recorded[doc["publication_block"]].append(doc)
        for name, block_docs in recorded.items():
            retrying = [d for d in block_docs if d[PUBLICATION] == ERROR]
            if retrying:
                again, failed = self._advance(
                    retrying,
                    ERROR,
                    ctx,
                    lambda d: request.block_retried(d, self.instance, now),
                    name,
                )
                if failed:
                    continue  # a file changed under us: the block is taken up next cycle
                block_docs = [d for d in block_docs if d[PUBLICATION] == PUBLISHING] + again
            if make_block(block_docs).name == name:  # the whole block
                self.publish(block_docs, name, ctx)
            elif self.left_behind(block_docs, now):
                freed.extend(self.settle_remainder(name, block_docs, ctx))
        # 2. new blocks from the waiting files
        waiting: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for doc in [d for d in docs if d[PUBLICATION] == WAITING] + freed:
            waiting[(doc["user"], dataset_of(doc))].append(doc)
        tasks: dict[str, bool] = {}
        for group in waiting.values():
            for block_docs in close_blocks(
                group,
                now,
                self.config.publisher.max_files_per_block,
                self.config.publisher.block_closure_timeout,
                lambda task: tasks.setdefault(task, self.task_over(task)),
            ):
                intended = self.record_intent(block_docs, ctx)
                if intended:
                    self.publish(intended, intended[0]["publication_block"], ctx)

    def task_over(self, task: str) -> bool:
        """No request of the task is still on its way: neither in the feed this agent has
        read (the requests since it started) nor in the task's index (those before; a fresh
        read). The index alone once called a task over while 99 of its 100 files were still
        on their way (embedded store, agents writing; not reproduced since), and the feed
        alone knows nothing from before the agent started."""
        if self.on_its_way.get(task):
            return False
        rows = self.db.view("asyncstageout", "by_task", start_key=[task], end_key=[task, {}]).rows
        return not any(row["value"]["state"] in ON_ITS_WAY for row in rows)

    def record_intent(self, docs: list[dict[str, Any]], ctx: Cycle) -> list[dict[str, Any]]:
        name = make_block(docs).name
        by, now = self.instance, ctx.now
        written, failed = self._advance(
            docs, WAITING, ctx, lambda d: request.block_recorded(d, by, now, name)
        )
        if failed and written:
            # All or none: a block's name stands for exactly its files.
            self.abandon(written, name, ctx)
            return []
        return written

    def abandon(
        self,
        docs: list[dict[str, Any]],
        name: str,
        ctx: Cycle,
        reason: str = "block abandoned: a file changed",
    ) -> list[dict[str, Any]]:
        """Files of a block that will not be published as recorded go back to `pending`."""
        by, now = self.instance, ctx.now
        written, _ = self._advance(
            docs, PUBLISHING, ctx, lambda d: request.block_abandoned(d, by, now, reason), name
        )
        return written

    def left_behind(self, docs: list[dict[str, Any]], now: float) -> bool:
        """A part of a block is a crash's remainder if this instance recorded it (before a
        restart), or if its recorder has had a heartbeat expiry to finish it. Otherwise it is
        most likely another publisher's block still being recorded, seen half-way (two
        instances both act on a dataset while their membership settles): hands off."""
        intents = [
            h
            for d in docs
            for h in d.get("history", [])
            if h["axis"] == PUBLICATION and h["to"] == PUBLISHING
        ]
        if not intents:
            return True
        latest = max(intents, key=lambda h: h["at"])
        left: bool = (
            latest["by"] == self.instance
            or now - latest["at"] > self.config.agents.heartbeat_expiry
        )
        return left

    def settle_remainder(
        self, name: str, docs: list[dict[str, Any]], ctx: Cycle
    ) -> list[dict[str, Any]]:
        """`docs` are `publishing` in block `name` but are not all of it (a block's name is
        derived from exactly its files' LFNs): what is left of the block after a crash or a
        file that changed. They are `published` if the catalog holds the block with them, and
        go back to `pending` (returned) if it holds no such block: abandoned half-way."""
        try:
            stored = self.catalog.block_files(name)
        except CatalogError as exc:
            log.warning("block %s: remainder of %d files not settled: %s", name, len(docs), exc)
            return []
        lfns = sorted(d["destination_lfn"] for d in docs)
        if stored is None:
            log.info("block %s was never published: %d files back to pending", name, len(docs))
            return self.abandon(docs, name, ctx)
        if set(lfns) <= set(stored):
            self.mark_published(docs, name, ctx, inserted=False)
        else:
            self.failed(docs, BlockConflict(content_message(name, stored, lfns)), ctx)
        return []

    def publish(self, docs: list[dict[str, Any]], name: str, ctx: Cycle) -> None:
        """Docs all `publishing` with block `name`: to the catalog, then `published`."""
        block = make_block(docs, name)
        try:
            inserted = self.catalog.publish_block(block)
        except BlockConflict as exc:
            if not self.settle_published_elsewhere(docs, name, exc, ctx):
                self.failed(docs, exc, ctx)
            return
        except CatalogError as exc:
            self.failed(docs, exc, ctx)
            return
        except Exception as exc:
            # An error of ours or of the catalog's client on this block: a publication error
            # like any other (tried again after the backoff, given up after max_attempts),
            # with the reason in the documents, so that it cannot stop the publisher.
            self.failed(docs, CatalogError(set_aside_reason(self.name, docs[0], exc)), ctx)
            return
        self.mark_published(docs, name, ctx, inserted)

    def settle_published_elsewhere(
        self,
        docs: list[dict[str, Any]],
        name: str,
        exc: BlockConflict,
        ctx: Cycle,
    ) -> bool:
        """Files the catalog already holds in another block of their dataset were published
        there (by another publisher that acted on them at the same time, or before a crash):
        they are `published` in that block, and the rest of this block goes back to `pending`
        to be blocked again. The catalog is the truth; calling such a file failed would tell
        its owner the opposite of what the catalog says. False: not that case (a file is in
        another dataset's block, a real conflict)."""
        dataset = dataset_of(docs[0])
        elsewhere = exc.elsewhere
        if not elsewhere or any(b.split("#", 1)[0] != dataset for b in elsewhere.values()):
            return False
        by_block: dict[str, list[dict[str, Any]]] = defaultdict(list)
        rest: list[dict[str, Any]] = []
        for doc in docs:
            other = elsewhere.get(doc["destination_lfn"])
            (by_block[other] if other else rest).append(doc)
        for other, published in by_block.items():
            why = f"in block {other} (published there by another publisher)"

            def there(d: dict[str, Any], other: str = other, why: str = why) -> dict[str, Any]:
                return request.published(d, self.instance, ctx.now, other, why)

            written, _ = self._advance(published, PUBLISHING, ctx, there, name)
            ctx.count("published", len(written))
            log.info(
                "block %s: %d files were already in block %s: published there",
                name,
                len(written),
                other,
            )
        if rest:
            self.abandon(rest, name, ctx, "block abandoned: some files were elsewhere")
        return True

    def mark_published(
        self,
        docs: list[dict[str, Any]],
        name: str,
        ctx: Cycle,
        inserted: bool,
    ) -> None:
        by, why, now = self.instance, f"in block {name}", ctx.now
        written, _ = self._advance(
            docs, PUBLISHING, ctx, lambda d: request.published(d, by, now, name, why), name
        )
        ctx.count("blocks", 1)
        ctx.count("published", len(written))
        log.info(
            "block %s (%s, %d files) %s the catalog",
            name,
            dataset_of(docs[0]),
            len(written),
            "inserted in" if inserted else "was already in",
        )

    def failed(self, docs: list[dict[str, Any]], exc: CatalogError, ctx: Cycle) -> None:
        """`publication_error` with a next try after a backoff; `publication_failed` once the
        attempts are spent or the catalog's answer cannot change."""
        settings = self.config.publisher
        name = docs[0]["publication_block"]
        reason = str(exc)[:4096]

        by, now = self.instance, ctx.now

        def attempt(doc: Mapping[str, Any]) -> dict[str, Any]:
            attempts = failures_since_reset(doc) + 1
            delay = min(settings.max_delay, settings.base_delay * 2 ** (attempts - 1))
            retry_after = round(now + delay, 3)
            return request.publication_failed_attempt(doc, by, now, reason, attempts, retry_after)

        written, _ = self._advance(docs, PUBLISHING, ctx, attempt, name)
        give_up = [
            d
            for d in written
            if d["publication_attempts"] >= settings.max_attempts or not exc.retryable
        ]
        failed, _ = self._advance(
            give_up, ERROR, ctx, lambda d: request.publication_given_up(d, by, now, reason), name
        )
        ctx.count("errors", len(written) - len(failed))
        ctx.count("failed", len(failed))
        kind = "conflict" if isinstance(exc, BlockConflict) else "error"
        log.warning(
            "block %s of %d files not published (%s%s): %s",
            name,
            len(docs),
            kind,
            ", given up" if failed else "",
            exc,
        )

    def _advance(
        self,
        docs: list[dict[str, Any]],
        source: str,
        ctx: Cycle,
        change: Callable[[dict[str, Any]], dict[str, Any]],
        block: str | None = None,
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """Make `change` (an operation of aso.core.request) to files whose publication is at
        `source`; returns (the files as written, the ids not changed). A file written meanwhile
        by another agent (the cleaner, on its own axis) is read again and changed if it is still
        done, at `source` and (when given) in block `block`: losing such a race would split a
        block."""

        def decide(doc: dict[str, Any]) -> dict[str, Any] | None:
            if doc.get(STATE) != "done" or doc.get(PUBLICATION) != source:
                return None
            if block is not None and doc.get("publication_block") != block:
                return None
            return change(doc)

        outcome = self.db.write_decided(docs, decide)
        ctx.count("conflicts", len(outcome.not_written))
        ctx.wrote(outcome.written)
        return outcome.written, outcome.not_written
