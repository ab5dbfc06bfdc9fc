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

from aso import actions, model
from aso.config import Config, HoldsConfig
from aso.core import holds, request
from aso.core.submission import deadline_reason, past_deadline
from aso.model import STATE
from aso.monitoring.queries import read_holds
from aso.retry import RetryPolicy, load_policy
from aso.runtime import Agent, Cycle
from aso.store import Server, StoreError
from aso.transfer import errors
from aso.workqueue import DECIDE

log = logging.getLogger("aso.agent.retry_manager")


def decided(
    doc: Mapping[str, Any],
    policy: RetryPolicy,
    by: str,
    now: float,
    config: HoldsConfig,
    held_sites: frozenset[str] = frozenset(),
    deadline: float = 0.0,
) -> dict[str, Any]:
    """The document after the decision on its failed attempt: failed as expired past its own
    `deadline` (transfer.deadline); held (its destination had no room or permission for its
    user, or stopped answering everyone: `held_sites`), waiting without spending an attempt
    until its hold ends or its deadline passes; else as the policy decides."""
    if past_deadline(doc, deadline, now):
        return request.stopped_waiting(doc, by, now, deadline_reason(doc, deadline), errors.EXPIRED)
    hold = holds.holding_id(doc, config, held_sites)
    if hold is not None:
        reason = doc.get("failure_reason") or ""
        if holds.past_deadline(doc, config, now):
            return request.given_up(
                doc, by, now, f"held past its deadline ({config.deadline:g} s): {reason}"
            )
        said = f"held by {hold}: {doc.get('error_class')}: {reason}"
        return request.held(doc, by, now, config.first_check, said, hold)
    decision = policy.decide(doc, now)
    if decision.retry:
        return request.retry_scheduled(doc, by, now, decision.delay, decision.reason)
    return request.given_up(doc, by, now, decision.reason)


def hold_starts(
    docs: list[dict[str, Any]], config: HoldsConfig, tripped: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """What each hold to start or widen says, by hold id: a user's from the requests it held
    (destination, user, class, reason, directory and the largest size among them); a site's
    from its breaker's reason (`tripped`: site → why)."""
    starts: dict[str, dict[str, Any]] = {}
    for doc in docs:
        if not holds.held_request(doc, config):
            continue
        key = doc["attempts"][-1]["held"]
        hold = next((h for h in holds.hold_keys(doc) if model.hold_id(*h) == key), None)
        if hold is None or (not hold[1] and hold[0] not in tripped):
            continue  # held by a site's hold in force
        site, user = hold
        reason = tripped[site] if not user else doc.get("failure_reason") or doc["error_class"]
        start = starts.setdefault(key, {
            "site": site, "user": user, "error_class": doc["error_class"], "reason": reason,
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
        self.breaker = holds.Breaker(config.holds)

    observes = True  # the policy and the breaker learn from every outcome

    def observe(self, doc: Mapping[str, Any]) -> None:
        self.policy.observe(doc)
        self.breaker.observe(doc)

    def forget(self) -> None:
        self.breaker.forget()

    def cycle(self, ctx: Cycle) -> None:
        now = ctx.now
        tripped, held_sites = self.sites_held(ctx)
        updates = []
        for doc in ctx.work:
            # The policy is a plug-in: an error of its on one file is that file's alone.
            updated = ctx.acted_on(
                decided, doc, self.policy, self.instance, now, self.config.holds, held_sites,
                self.config.transfer.deadline,
            )  # fmt: skip
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
        report["held"] = sum(1 for d in written if holds.held_request(d, self.config.holds))
        report["retry"] -= report["held"]
        starts = hold_starts(written, self.config.holds, tripped)
        if starts:
            self.start_holds(starts, ctx)

    def sites_held(self, ctx: Cycle) -> tuple[dict[str, str], frozenset[str]]:
        """The destinations of this cycle's failures whose breaker tripped (site → why), and
        those that a site's hold holds or whose breaker tripped: their files are held."""
        config = self.config.holds
        failing = {
            site
            for d in ctx.work
            if config.enabled and d.get("error_class") in model.SITE_HOLD_CLASSES
            for site in (d["source"], d["destination"])
        }
        if not failing:
            return {}, frozenset()
        tripped = {s: why for s in failing if (why := self.breaker.tripped(s, ctx.now))}
        try:
            found = holds.holds_of(read_holds(self.db, [(site, "") for site in failing]))
        except StoreError as exc:
            log.warning("sites' holds not read (%s): the breakers alone decide", exc)
            found = {}
        in_force = {site for (site, _), hold in found.items() if hold.holds}
        return tripped, frozenset(in_force | set(tripped))

    def start_holds(self, starts: dict[str, dict[str, Any]], ctx: Cycle) -> None:
        """Start (or widen) the holds of this cycle's held files (until they are written,
        their files wait their cool-off)."""
        written = actions.start_holds(self.db, starts, self.instance, ctx.now, self.config.holds)
        ctx.count("holds_started", written)
