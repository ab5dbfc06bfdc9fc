"""Retry manager: decides what becomes of every failed attempt.

`failed_attempt` → `retry` (with `retry_after`, the end of its cool-off) or → `failed` for good,
as the retry policy decides (aso/retry.py; a plug-in chosen by `retry.policy`). A failure for
want of room or permission at the destination holds the file instead (aso/core/holds.py): it
waits in `retry` without spending an attempt, and the retry manager starts the hold of its
destination and user, which the submitter honours and the hold checker ends. The submitter
takes a `retry` once its cool-off is over (earlier versions of this agent wrote it back to
`new` first: one more write per failed attempt).

A user's kill always wins: an owner may kill a file in `failed_attempt` or `retry` at any moment;
if the kill lands first, the retry manager's write conflicts (409) and the file stays killed.
Partition: by request id.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Mapping
from typing import Any

from aso import model
from aso.config import Config, HoldsConfig
from aso.core import holds, request
from aso.model import STATE
from aso.retry import RetryPolicy, load_policy
from aso.runtime import Agent, Cycle
from aso.store import Server, StoreError
from aso.workqueue import DECIDE

log = logging.getLogger("aso.agent.retry_manager")


def decided(
    doc: Mapping[str, Any], policy: RetryPolicy, by: str, now: float, config: HoldsConfig
) -> dict[str, Any]:
    """The document after the decision on its failed attempt: held (a destination without room
    or permission for its user: it waits without spending an attempt, until its hold ends or
    its deadline passes), else as the policy decides."""
    error_class = doc.get("error_class")
    if holds.is_held_class(error_class, config):
        reason = doc.get("failure_reason") or ""
        if holds.past_deadline(doc, config, now):
            return request.given_up(
                doc, by, now, f"held past its deadline ({config.deadline:g} s): {reason}"
            )
        held = f"held: {error_class} at {doc['destination']}: {reason}"
        return request.retry_scheduled(doc, by, now, config.first_check, held)
    decision = policy.decide(doc, now)
    if decision.retry:
        return request.retry_scheduled(doc, by, now, decision.delay, decision.reason)
    return request.given_up(doc, by, now, decision.reason)


def hold_starts(docs: list[dict[str, Any]], config: HoldsConfig) -> dict[str, dict[str, Any]]:
    """What each hold to start or widen says, by hold id: the held requests' destination, user,
    class, reason, directory and the largest size among them."""
    starts: dict[str, dict[str, Any]] = {}
    for doc in docs:
        if not holds.held_request(doc, config):
            continue
        key = model.hold_id(doc["destination"], doc["user"])
        start = starts.setdefault(key, {
            "site": doc["destination"], "user": doc["user"], "error_class": doc["error_class"],
            "reason": doc.get("failure_reason") or doc["error_class"],
            "path": posixpath.dirname(doc["destination_lfn"]), "needs": 0,
        })  # fmt: skip
        start["needs"] = max(start["needs"], int(doc.get("size") or 0))
    return starts


class RetryManager(Agent):
    name = "retry-manager"
    kinds = (DECIDE,)

    def __init__(
        self, config: Config, instance: str | None = None, *, server: Server | None = None
    ):
        super().__init__(config, instance, server=server)
        self.policy = load_policy(config.retry)

    observes = True  # the policy may learn from every outcome (aso/retry.py)

    def observe(self, doc: Mapping[str, Any]) -> None:
        self.policy.observe(doc)

    def cycle(self, ctx: Cycle) -> None:
        now = ctx.now
        updates = []
        for doc in ctx.work:
            # The policy is a plug-in: an error of its on one file is that file's alone.
            updated = ctx.acted_on(decided, doc, self.policy, self.instance, now, self.config.holds)
            if updated is not None:
                updates.append(updated)
        report = ctx.counts("retry", "failed", "held", "conflicts")
        written = ctx.write(updates)
        for doc in written:
            report[doc[STATE]] += 1
            log.debug(
                "file %s (%s): %s: %s",
                doc["_id"],
                doc["source_lfn"],
                doc[STATE],
                doc["history"][-1].get("reason", ""),
            )
        starts = hold_starts(written, self.config.holds)
        report["held"] = sum(1 for d in written if holds.held_request(d, self.config.holds))
        report["retry"] -= report["held"]
        if starts:
            self.start_holds(starts, ctx)

    def start_holds(self, starts: dict[str, dict[str, Any]], ctx: Cycle) -> None:
        """Start (or widen) the holds of this cycle's held files: one write per hold, read
        again and decided again when someone else wrote it meanwhile."""

        def decide(current: dict[str, Any]) -> dict[str, Any] | None:
            found = current if "_rev" in current else None
            return holds.started(
                found, **starts[current["_id"]], by=self.instance, now=ctx.now,
                config=self.config.holds,
            )  # fmt: skip

        try:
            outcome = self.db.write_decided([{"_id": key} for key in starts], decide)
        except StoreError as exc:
            log.warning("holds not written (%s): their files wait their cool-off", exc)
            return
        for doc in outcome.written:
            log.info("hold %s: %s", doc["_id"], holds.hold_of(doc).says())
        for refused in outcome.refused:
            log.warning("hold %s not written: %s", refused.id, refused.reason)
        ctx.count("holds_started", len(outcome.written))
