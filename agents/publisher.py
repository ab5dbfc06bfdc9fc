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
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from aso import model
from aso.catalog import open_catalog
from aso.catalog.base import Block, BlockConflict, CatalogError, CatalogFile, block_name
from aso.config import Config
from aso.model import AGENT, PUBLICATION, STATE, Change
from aso.runtime import Agent, Membership
from aso.workqueue import PUBLISH

log = logging.getLogger("aso.agent.publisher")

WAITING, PUBLISHING, ERROR = "pending", "publishing", "publication_error"
ON_ITS_WAY = ("new", "acquired", "submitted", "failed_attempt", "retry", "kill_requested")


def dataset_of(doc: Mapping[str, Any]) -> str:
    return (doc.get("publish_info") or {}).get("dataset", "")


def done_at(doc: Mapping[str, Any]) -> float:
    """When the file's copy ended (its `done` transition)."""
    return max(
        (h["at"] for h in doc.get("history", []) if h["axis"] == STATE and h["to"] == "done"),
        default=doc["last_update"],
    )


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


def make_block(docs: list[Mapping[str, Any]], name: str | None = None) -> Block:
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

    def partition_key(self, doc: Mapping[str, Any]) -> str:
        return f"{doc['user']}:{dataset_of(doc)}"

    def close(self) -> None:
        self.catalog.close()

    def cycle(
        self,
        mine: list[dict[str, Any]],
        membership: Membership,
        everything: Mapping[str, dict[str, Any]],
    ) -> dict[str, Any]:
        now = time.time()
        report = {"blocks": 0, "published": 0, "errors": 0, "failed": 0, "conflicts": 0}
        docs = [d for d in mine if d.get(STATE) == "done"]
        # 1. blocks recorded earlier and not finished (a crash), and failed ones now due again
        recorded: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for doc in docs:
            if doc[PUBLICATION] == PUBLISHING or (
                doc[PUBLICATION] == ERROR and (doc.get("publication_retry_after") or 0) <= now
            ):
                recorded[doc["publication_block"]].append(doc)
        for name, block_docs in recorded.items():
            retrying = [d for d in block_docs if d[PUBLICATION] == ERROR]
            if retrying:
                again, failed = self._write(
                    [self._moved(d, PUBLISHING, now) for d in retrying], report
                )
                if failed:
                    continue  # a file changed under us: the block is taken up next cycle
                block_docs = [d for d in block_docs if d[PUBLICATION] == PUBLISHING] + again
            self.publish(block_docs, name, report, now)
        # 2. new blocks from the waiting files
        waiting: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for doc in docs:
            if doc[PUBLICATION] == WAITING:
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
                intended = self.record_intent(block_docs, report, now)
                if intended:
                    self.publish(intended, intended[0]["publication_block"], report, now)
        return report

    def task_over(self, task: str) -> bool:
        """No request of the task is still on its way. A fresh read: a stale index lacks the
        newest requests and would call a task over too early."""
        rows = self.db.view("asyncstageout", "by_task", start_key=[task], end_key=[task, {}]).rows
        return not any(row["value"]["state"] in ON_ITS_WAY for row in rows)

    def record_intent(
        self, docs: list[dict[str, Any]], report: dict[str, int], now: float
    ) -> list[dict[str, Any]]:
        name = make_block(docs).name
        updates = [self._moved(d, PUBLISHING, now, publication_block=name) for d in docs]
        written, failed = self._write(updates, report)
        if failed and written:
            # All or none: a block's name stands for exactly its files.
            back = [
                self._moved(
                    d, WAITING, now, "block abandoned: a file changed", publication_block=None
                )
                for d in written
            ]
            self._write(back, report)
            return []
        return written

    def _moved(
        self, doc: dict[str, Any], to: str, now: float, reason: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        return model.transition(
            doc, [Change(PUBLICATION, to, self.instance, reason)], AGENT, at=now, **fields
        )

    def publish(
        self, docs: list[dict[str, Any]], name: str, report: dict[str, int], now: float
    ) -> None:
        """Docs all `publishing` with block `name`: to the catalog, then `published`."""
        block = make_block(docs, name)
        try:
            inserted = self.catalog.publish_block(block)
        except CatalogError as exc:
            self.failed(docs, exc, report, now)
            return
        written, _ = self._write(
            [
                self._moved(
                    d,
                    "published",
                    now,
                    f"in block {name}",
                    publication_error=None,
                    publication_retry_after=None,
                )
                for d in docs
            ],
            report,
        )
        report["blocks"] += 1
        report["published"] += len(written)
        log.info(
            "block %s (%s, %d files) %s the catalog",
            name,
            block.dataset,
            len(written),
            "inserted in" if inserted else "was already in",
        )

    def failed(
        self, docs: list[dict[str, Any]], exc: CatalogError, report: dict[str, int], now: float
    ) -> None:
        """`publication_error` with a next try after a backoff; `publication_failed` once the
        attempts are spent or the catalog's answer cannot change."""
        settings = self.config.publisher
        errored, give_up = [], []
        for doc in docs:
            attempts = failures_since_reset(doc) + 1
            delay = min(settings.max_delay, settings.base_delay * 2 ** (attempts - 1))
            errored.append(
                self._moved(
                    doc,
                    ERROR,
                    now,
                    str(exc)[:4096],
                    publication_attempts=attempts,
                    publication_error=str(exc)[:4096],
                    publication_retry_after=round(now + delay, 3),
                )
            )
            if attempts >= settings.max_attempts or not exc.retryable:
                give_up.append(doc["_id"])
        written, _ = self._write(errored, report)
        final = [
            self._moved(d, "publication_failed", now, str(exc)[:4096], publication_retry_after=None)
            for d in written
            if d["_id"] in give_up
        ]
        failed, _ = self._write(final, report)
        report["errors"] += len(written) - len(failed)
        report["failed"] += len(failed)
        kind = "conflict" if isinstance(exc, BlockConflict) else "error"
        log.warning(
            "block %s of %d files not published (%s%s): %s",
            docs[0].get("publication_block"),
            len(docs),
            kind,
            ", given up" if failed else "",
            exc,
        )

    def _write(
        self, updates: list[dict[str, Any]], report: dict[str, int]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if not updates:
            return [], []
        written, failed = [], []
        for doc, result in zip(updates, self.db.bulk_write(updates), strict=True):
            if result.ok:
                written.append(dict(doc, _rev=result.rev))
            else:
                failed.append(doc)
                report["conflicts"] += 1
        self.written(written)
        return written, failed
