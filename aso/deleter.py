"""Deleting temporary copies: the destination confirmed first, then the copy at the source
deleted with gfal2, a few at a time per site (aso.deleter.Deleter, used by the cleaner, the
publisher and the monitor)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from aso import model, sites
from aso.config import Config
from aso.core.cleanup import Outcome
from aso.files import FileError, Files, Look
from aso.provision import storejs
from aso.runtime import set_aside_reason
from aso.transfer.gfal_copier import normal_adler32


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
    its catalog call; the monitor, before recording `done`): no second look. A file never
    copied (failed for good, killed) has no copy of ours at its destination: its temporary
    copy is discarded without a look (the cleaner, past `cleaner.failed_grace`)."""
    if not storejs.in_temp_area(doc["user"], doc["source_lfn"]):  # an admin-written request
        return Outcome(
            False, f"refused: {doc['source_lfn']} is not in {doc['user']}'s temporary area"
        )
    try:
        temp = temp_url(config, doc)
    except sites.SiteError as exc:
        return Outcome(False, f"refused: {exc}")
    try:
        if not confirmed and doc.get(model.STATE) not in model.NEVER_COPIED:
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
    done = "temporary copy deleted" if deleted else "temporary copy already gone"
    if doc.get(model.STATE) in model.NEVER_COPIED:
        done += f" ({doc[model.STATE]} and not resubmitted: discarded)"
    return Outcome(True, done)


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
