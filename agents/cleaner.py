"""Cleaner: deletes a file's temporary copy at the source once the file is safe.

For each `done` request whose cleanup is pending (or failed before and due again) and whose
publication is over (not required, published or given up: model.WORK's "clean"; a file waiting
for its block is cleaned by the publisher, with the same functions, in the write that records
it published: one write for both, issue 22; a file that needs no publication is cleaned by the
monitor in the write that records it `done`, when the deletion ends within
`cleaner.at_done_wait` seconds):
1. the temporary copy must be inside the source site's temp area (`sites.temp_pfn` refuses
   anything else: the cleaner never touches a user's files) and inside the owner's own
   temporary area (`model.in_temp_area`: never another user's output);
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
from collections.abc import Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, cast

from aso import model, sites
from aso.config import CleanerConfig, Config
from aso.core import request
from aso.files import FileError, Files, Look, open_files
from aso.model import CLEANUP
from aso.runtime import Agent, Cycle, set_aside_reason
from aso.transfer.gfalcopy import normal_adler32
from aso.workqueue import CLEAN

log = logging.getLogger("aso.agent.cleaner")


@dataclass(frozen=True)
class Outcome:
    cleaned: bool
    reason: str


def destination_url(config: Config, doc: Mapping[str, Any]) -> str:
    return sites.pfn(config, doc["destination"], doc["destination_lfn"])


def destination_look(config: Config, doc: Mapping[str, Any]) -> Look:
    """The look that confirms a request's destination copy (aso.files.Confirmer)."""
    return Look(
        key=doc["_id"],
        site=doc["destination"],
        url=destination_url(config, doc),
        size=doc["size"],
        adler32=normal_adler32(doc["checksum"]["adler32"]),
    )


def temp_url(config: Config, doc: Mapping[str, Any]) -> str:
    return sites.temp_pfn(config, doc["source"], doc["source_lfn"])


def clean_one(
    config: Config, files: Files, doc: Mapping[str, Any], confirmed: bool = False
) -> Outcome:
    """Confirm the destination, then delete the temporary copy; never the other way round.
    `confirmed`: the caller confirmed the destination in this cycle (the publisher, before
    publishing; the monitor, before recording `done`): no second look."""
    if not model.in_temp_area(doc["user"], doc["source_lfn"]):  # an admin-written request
        return Outcome(
            False, f"refused: {doc['source_lfn']} is not in {doc['user']}'s temporary area"
        )
    try:
        temp = temp_url(config, doc)
    except sites.SiteError as exc:
        return Outcome(False, f"refused: {exc}")
    try:
        if not confirmed:
            wrong = files.confirm(
                destination_url(config, doc),
                doc["size"],
                normal_adler32(doc["checksum"]["adler32"]),
            )
            if wrong:
                return Outcome(False, f"destination not confirmed ({wrong}): temporary copy kept")
        deleted = files.delete(temp)
    except FileError as exc:
        return Outcome(False, str(exc))
    return Outcome(True, "temporary copy deleted" if deleted else "temporary copy already gone")


def due(doc: Mapping[str, Any], now: float) -> bool:
    return (
        doc.get(model.STATE) == "done"
        and doc.get(CLEANUP) in model.CLEANUP_DUE
        and (doc.get("cleanup_retry_after") or 0) <= now
    )


def cleanable_at_done(doc: Mapping[str, Any], now: float) -> bool:
    """A file just recorded `done` whose temporary copy may go at once: its cleanup is due and
    no publication waits for it (model.WORK's "clean")."""
    return due(doc, now) and doc.get(model.PUBLICATION) in model.FINAL[model.PUBLICATION]


def cleanup_recorded(
    doc: dict[str, Any], outcome: Outcome, by: str, now: float, settings: CleanerConfig
) -> dict[str, Any]:
    """The document with a deletion's outcome: `cleaned`, or `cleanup_error` with the next
    try after the backoff."""
    if outcome.cleaned:
        return request.cleaned(doc, by, now, outcome.reason)
    return request.cleanup_failed(
        doc, by, now, outcome.reason, settings.base_delay, settings.max_delay
    )


class Deleter:
    """Deletions of temporary copies (`clean_one`) of all sites at once, `cleaner.max_per_site`
    at a time at each site (one lasting thread pool per site, so its threads keep their gfal2
    contexts)."""

    def __init__(self, config: Config, files: Files, agent: str):
        self.config = config
        self.files = files
        self.agent = agent
        self.pools: dict[str, ThreadPoolExecutor] = {}
        self.late: dict[str, list[Future[Outcome]]] = {}  # site → deletions not waited for

    def _submit(
        self, docs: list[dict[str, Any]], confirmed: Collection[str]
    ) -> dict[str, Future[Outcome]]:
        futures = {}
        for doc in docs:
            pool = self.pools.get(doc["source"])
            if pool is None:
                pool = self.pools[doc["source"]] = ThreadPoolExecutor(
                    max_workers=self.config.cleaner.max_per_site,
                    thread_name_prefix=f"clean-{doc['source']}",
                )
            futures[doc["_id"]] = pool.submit(
                clean_one, self.config, self.files, doc, doc["_id"] in confirmed
            )
        return futures

    def clean_all(
        self, docs: list[dict[str, Any]], confirmed: Collection[str] = ()
    ) -> dict[str, Outcome]:
        """`confirmed`: the ids of the files whose destination the caller confirmed in this
        cycle (clean_one)."""
        futures = self._submit(docs, confirmed)
        return {doc["_id"]: self.outcome_of(doc, futures[doc["_id"]]) for doc in docs}

    def clean_within(
        self, docs: list[dict[str, Any]], seconds: float, confirmed: Collection[str] = ()
    ) -> dict[str, Outcome]:
        """The outcomes of the deletions of `docs` that end within `seconds` (the monitor
        records them in the write of the file's `done`). The others go on; their files stay
        the cleaner's (a copy already gone counts as cleaned). A site whose deletions of an
        earlier call are still under way gets none this time: a slow storage is left to the
        cleaner instead of a queue growing behind it."""
        self.late = {
            site: running
            for site, futures in self.late.items()
            if (running := [f for f in futures if not f.done()])
        }
        taken = [doc for doc in docs if doc["source"] not in self.late]
        futures = self._submit(taken, confirmed)
        wait(futures.values(), timeout=seconds)
        outcomes = {}
        for doc in taken:
            future = futures[doc["_id"]]
            if future.done():
                outcomes[doc["_id"]] = self.outcome_of(doc, future)
            else:
                self.late.setdefault(doc["source"], []).append(future)
        return outcomes

    def outcome_of(self, doc: dict[str, Any], future: Future[Outcome]) -> Outcome:
        """The deletion's outcome; an error of ours on one file is that file's `cleanup_error`
        (retried after the backoff, the reason in the document), not the end of the cycle."""
        try:
            return future.result()
        except Exception as exc:
            return Outcome(False, set_aside_reason(self.agent, doc, exc))

    def close(self) -> None:
        for pool in self.pools.values():
            pool.shutdown(wait=True, cancel_futures=True)


class Cleaner(Agent):
    name = "cleaner"
    kinds = (CLEAN,)

    def __init__(self, config: Config, instance: str | None = None, files: Files | None = None):
        super().__init__(config, instance)
        self.files = files or open_files(config)
        self.deleter = Deleter(config, self.files, self.name)

    def partition_key(self, doc: Mapping[str, Any]) -> str:
        return cast(str, doc["source"])

    def cycle(self, ctx: Cycle) -> None:
        now = ctx.now
        work = sorted((d for d in ctx.work if due(d, now)), key=lambda d: d["last_update"])
        work = work[: self.config.cleaner.batch]
        report = ctx.counts("cleaned", "cleanup_errors", "conflicts")
        if not work:
            return
        outcomes = self.deleter.clean_all(work)
        seen = {doc["_id"]: doc[CLEANUP] for doc in work}

        def decide(doc: dict[str, Any]) -> dict[str, Any] | None:
            # Read again after a conflict (a user's `aso publish --retry`, or the publisher):
            # the outcome still holds while the file is done and its cleanup where this cycle
            # found it.
            if doc.get(model.STATE) != "done" or doc.get(CLEANUP) != seen[doc["_id"]]:
                return None
            return cleanup_recorded(
                doc, outcomes[doc["_id"]], self.instance, now, self.config.cleaner
            )

        outcome = self.db.write_decided(work, decide)
        report["conflicts"] += len(outcome.not_written)
        for doc in outcome.written:
            report["cleaned" if doc[CLEANUP] == "cleaned" else "cleanup_errors"] += 1
            log.debug(
                "file %s: temporary copy %s at %s: %s",
                doc["_id"],
                doc["source_lfn"],
                doc["source"],
                outcomes[doc["_id"]].reason,
            )
        ctx.wrote(outcome.written)

    def close(self) -> None:
        self.deleter.close()
