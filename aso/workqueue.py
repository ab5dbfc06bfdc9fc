"""How agents find their work: the shared queue view and a `_changes`-driven work set.

Both read the same definition of work, aso/model.py's WORK table (which requests are work of
which kind), through `couchapp/queue/views/work/map.js` (key [kind, ...]; `aso db init` writes
the table into it) and its Python twin `work_kinds` below, which a test keeps in agreement:

* `QueueView` reads a kind's key range from the compact shared view (one row per request that
  some agent must act upon, nothing for finished requests). Simple and exact, but every fresh
  read makes the store index the documents changed since the last read: on the embedded store
  about 780 documents/s per view, in one single-threaded process.
* `ChangesWorkSet` keeps an agent's work in memory from the `_changes` feed (documents included)
  since a checkpoint, after one start-up read of the queue view. Each refresh costs a read of
  what changed, with no index to maintain on the agent's critical path.

`sim/bench_workqueue.py` measures the two side by side; docs/design.md, "How agents find
their work", gives the figures and the choice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aso import limits, model
from aso.feedrelay import Feed, FeedGap, StoreFeed
from aso.store import Database

log = logging.getLogger("aso.workqueue")

QUEUE_DDOC = "queue"
QUEUE_VIEW = "work"

KINDS = tuple(model.WORK)
SUBMIT, ACTIVE, DECIDE, CLEAN, PUBLISH, DISCARD = KINDS
FIRST, RETRY = "first", "retry"  # DISCARD's two key ranges (work_key)
# The kinds of the requests still on their way: each state of model.ON_ITS_WAY is the work of
# one of them (tests/test_workqueue.py holds the two lists together).
ON_ITS_WAY_KINDS = tuple(
    kind
    for kind, axes in model.WORK.items()
    if set(axes) == {model.STATE} and set(axes[model.STATE]) <= set(model.ON_ITS_WAY)
)


def work_key(kind: str, doc: Mapping[str, Any]) -> list[Any]:
    """The rest of a kind's key: what its agent reads a range of (map.js keyOf)."""
    if kind == SUBMIT:
        return [doc["user"], doc["source"], doc["destination"]]
    if kind == ACTIVE:
        return [(doc.get("transfer") or {}).get("job_id", "")]
    if kind == DECIDE:
        return [doc["last_update"]]
    if kind == DISCARD:  # a first try past the grace, or a retry once its backoff is over
        if doc.get(model.CLEANUP) == "cleanup_error":
            return [RETRY, doc.get("cleanup_retry_after") or 0]
        return [FIRST, model.state_since(doc)]
    if kind == CLEAN:
        return [doc["source"]]
    return [doc["user"], (doc.get("publish_info") or {}).get("dataset", "")]  # PUBLISH


def work_kinds(doc: Mapping[str, Any]) -> list[list[Any]]:
    """The queue view's keys for a document (the Python twin of queue/views/work/map.js)."""
    if doc.get("type") != model.REQUEST_TYPE or doc.get("_deleted"):
        return []
    return [
        [kind, *work_key(kind, doc)]
        for kind, axes in model.WORK.items()
        if all(doc.get(axis) in values for axis, values in axes.items())
    ]


def kind_range(kind: str, *prefix: Any) -> tuple[list[Any], list[Any]]:
    """start/end keys of a kind (optionally narrowed by the next key components)."""
    return [kind, *prefix], [kind, *prefix, {}]


class QueueView:
    """An agent's work read from the shared queue view."""

    def __init__(self, db: Database):
        self.db = db

    def docs(
        self, kind: str, *prefix: Any, limit: int | None = None, freshness: str = "fresh"
    ) -> list[dict[str, Any]]:
        start, end = kind_range(kind, *prefix)
        result = self.db.view(
            QUEUE_DDOC,
            QUEUE_VIEW,
            start_key=start,
            end_key=end,
            limit=limit,
            include_docs=True,
            reduce=False,
            freshness=freshness,
        )
        return result.docs()

    def keyed_before(
        self, kind: str, before: float, limit: int, *prefix: str
    ) -> list[dict[str, Any]]:
        """The requests of a kind (and key `prefix`) keyed next by a time (DECIDE: the last
        change; DISCARD: FIRST since its state, RETRY its backoff's end) at or before
        `before`, oldest first."""
        result = self.db.view(
            QUEUE_DDOC,
            QUEUE_VIEW,
            start_key=[kind, *prefix],
            end_key=[kind, *prefix, before],
            limit=limit,
            include_docs=True,
            reduce=False,
        )
        return result.docs()

    def backlog(self, freshness: str = "lazy") -> dict[str, int]:
        """Requests waiting per kind (a monitoring read: stale by default)."""
        result = self.db.view(
            QUEUE_DDOC, QUEUE_VIEW, reduce=True, group_level=1, freshness=freshness
        )
        return {row["key"][0]: row["value"] for row in result.rows}


@dataclass
class ChangesWorkSet:
    """The documents of some kinds, kept current from the `_changes` feed.

    `start()` reads the kinds from the queue view (the view may lag: the feed is then read from
    the sequence taken *before* the view read, so nothing changed meanwhile is missed), and
    `refresh()` applies every change since: a document enters the set when one of its keys is
    of a wanted kind and `accept(doc)` holds (an agent's partition, say), and leaves it when not.
    """

    db: Database
    kinds: tuple[str, ...]
    accept: Callable[[Mapping[str, Any]], bool] = lambda doc: True
    batch: int = limits.MAX_DOCS  # the front end's bound on a read that carries documents
    since: str = "0"
    docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Sees every document of the feed, wanted or not (a policy learning from all outcomes).
    observer: Callable[[Mapping[str, Any]], None] | None = None
    # Kinds whose documents the observer is also given from the queue view each time the set
    # starts (what was written before the position the feed is followed from), after
    # `on_start()` has told it to forget what it learnt from the feed so far (a gap in it).
    observed_kinds: tuple[str, ...] = ()
    on_start: Callable[[], None] | None = None
    # Where the changes come from: the store's feed, or the host's feed relay (aso/feedrelay.py).
    feed: Feed | None = None

    def __post_init__(self) -> None:
        if self.feed is None:
            self.feed = StoreFeed(self.db)

    def wants(self, doc: Mapping[str, Any]) -> bool:
        return any(key[0] in self.kinds for key in work_kinds(doc)) and self.accept(doc)

    def start(self, source: str = "view") -> int:
        """Fill the set: from the queue view ("view") or by reading the whole feed ("feed").

        The sequence is taken first, then the view read: a change racing the read is read again
        from the feed, and applying a change twice is harmless.
        """
        assert self.feed is not None
        self.docs = {}
        if self.on_start is not None:
            self.on_start()
        if source == "feed":
            self.since = "0"
            self.refresh()
        else:
            self.since = self.feed.position()
            view = QueueView(self.db)
            for kind in self.kinds:
                self.apply(view.docs(kind))
            if self.observer is not None:
                for kind in self.observed_kinds:
                    for doc in view.docs(kind):
                        self.observer(doc)
        log.debug(
            "work set %s started from the %s with %d documents at seq %s",
            self.kinds,
            source,
            len(self.docs),
            self.since,
        )
        return len(self.docs)

    def refresh(self, wait: float | None = None) -> int:
        """Apply the changes since the last refresh; returns how many changes were read. A
        position the feed no longer holds (the relay's memory passed it, or the relay failed
        and the store's feed takes over) starts the set again from the queue view."""
        assert self.feed is not None
        try:
            return self._refresh(wait)
        except FeedGap:
            log.info(
                "work set %s: the feed lost position %s; starting again", self.kinds, self.since
            )
            return self.start()

    def _refresh(self, wait: float | None) -> int:
        assert self.feed is not None
        read = 0
        while True:
            result = self.feed.changes(
                self.since, limit=self.batch, wait=wait if read == 0 else None
            )
            self.apply(
                change.get("doc") or {"_id": change["id"], "_deleted": True}
                for change in result.results
            )
            read += len(result.results)
            self.since = result.last_seq
            if len(result.results) < self.batch:
                return read

    def apply(self, docs: Iterable[Mapping[str, Any]]) -> None:
        for doc in docs:
            if self.observer is not None:
                self.observer(doc)
            if self.wants(doc):
                self.docs[doc["_id"]] = dict(doc)
            else:
                self.docs.pop(doc["_id"], None)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [doc for doc in self.docs.values() if any(key[0] == kind for key in work_kinds(doc))]
