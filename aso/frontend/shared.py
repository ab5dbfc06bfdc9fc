"""Operators' costly reduce reads, shared: one read of a key at a time, its answer kept while
it is fresh. The embedded store reduces every row of a range at each read
(EMBEDDED_REDUCES_EVERY_ROW: a user's 30,000-file task's counts took 2.4-3.3 s, alice's link
11.9 s, at every 30 s refresh of an operator's page), so a user decided what an operator's page
costs the store. An answer that took the store `cost` seconds is kept for FRESH_PER_COST times
that (at most MAX_FRESH): such reads hold the store at most 1/(1 + FRESH_PER_COST) of the time
whoever opens them, and cheap ones (CouchDB keeps its reductions) are never kept. A kept answer
goes out with `Age` (RFC 9111)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer

FRESH_PER_COST = 10.0
MIN_COST = 0.25  # seconds: an answer that cost less is never kept
MAX_FRESH = 600.0  # seconds an answer may be kept
MAX_ANSWER_BYTES = 4 << 20  # a larger answer is relayed, not kept
MAX_KEPT_BYTES = 32 << 20  # all kept answers; past this, or MAX_KEPT of them, the first to
MAX_KEPT = 1000  # go stale are dropped first


@dataclass(frozen=True)
class Answer:
    """A store answer read whole: its status, its headers (Twisted's Headers) and body."""

    code: int
    phrase: bytes
    headers: Any
    body: bytes
    at: float  # when it ended (the clock of SharedReads)


class Lead:
    """The one read of a key under way: `done(answer, cost)` once (later calls do nothing),
    with None if it ended without a whole answer."""

    def __init__(self, reads: SharedReads, key: bytes):
        self.reads, self.key = reads, key
        self.waiting: list[defer.Deferred[Answer | None]] = []
        self.ended = False
        self.sent_at = reads.clock()  # when it went to the store (the front end sets it then)

    def done(self, answer: Answer | None, cost: float = 0.0) -> None:
        if self.ended:
            return
        self.ended = True
        if self.reads.under_way.get(self.key) is self:
            del self.reads.under_way[self.key]
        if answer is not None and answer.code != 200:
            answer = None  # a refusal, a 304 to its own client's ETag: not another's answer
        if answer is not None:
            self.reads.keep(self.key, answer, cost)
        for waiting in self.waiting:
            waiting.callback(answer)


class SharedReads:
    """The kept answers and the reads under way, by key (the store request's target)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.kept: dict[bytes, tuple[Answer, float]] = {}  # key → (answer, fresh until)
        self.kept_bytes = 0
        self.under_way: dict[bytes, Lead] = {}

    def fresh(self, key: bytes) -> Answer | None:
        kept = self.kept.get(key)
        if kept is None:
            return None
        answer, until = kept
        if self.clock() < until:
            return answer
        self._drop(key)
        return None

    def join(self, key: bytes) -> defer.Deferred[Answer | None] | None:
        """The answer of the read of `key` under way (None if it ends without one), or None
        if there is none under way."""
        lead = self.under_way.get(key)
        if lead is None:
            return None
        waiting: defer.Deferred[Answer | None] = defer.Deferred()
        lead.waiting.append(waiting)
        return waiting

    def lead(self, key: bytes) -> Lead:
        lead = Lead(self, key)
        self.under_way[key] = lead
        return lead

    def keep(self, key: bytes, answer: Answer, cost: float) -> None:
        if cost < MIN_COST or len(answer.body) > MAX_ANSWER_BYTES:
            return
        self._drop(key)
        until = answer.at + min(cost * FRESH_PER_COST, MAX_FRESH)
        self.kept[key] = (answer, until)
        self.kept_bytes += len(answer.body)
        for stale in [k for k, (_, fresh_until) in self.kept.items() if fresh_until <= answer.at]:
            self._drop(stale)
        while self.kept_bytes > MAX_KEPT_BYTES or len(self.kept) > MAX_KEPT:
            self._drop(min(self.kept, key=lambda k: self.kept[k][1]))  # the first to go stale

    def _drop(self, key: bytes) -> None:
        kept = self.kept.pop(key, None)
        if kept is not None:
            self.kept_bytes -= len(kept[0].body)
