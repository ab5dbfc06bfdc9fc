"""Retry manager: decides what becomes of every failed attempt.

`failed_attempt` → `retry` (with `retry_after`, the end of its cool-off) or → `failed` for good,
as the retry policy decides (aso/retry.py; a plug-in chosen by `retry.policy`). The submitter
takes a `retry` once its cool-off is over (earlier versions of this agent wrote it back to
`new` first: one more write per failed attempt).

A user's kill always wins: an owner may kill a file in `failed_attempt` or `retry` at any moment;
if the kill lands first, the retry manager's write conflicts (409) and the file stays killed.
Partition: by request id.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from aso.config import Config
from aso.core import request
from aso.model import STATE
from aso.retry import RetryPolicy, load_policy
from aso.runtime import Agent, Cycle
from aso.store import Server
from aso.workqueue import DECIDE

log = logging.getLogger("aso.agent.retry_manager")


def decided(doc: Mapping[str, Any], policy: RetryPolicy, by: str, now: float) -> dict[str, Any]:
    """The document after the policy's decision on its failed attempt."""
    decision = policy.decide(doc, now)
    if decision.retry:
        return request.retry_scheduled(doc, by, now, decision.delay, decision.reason)
    return request.given_up(doc, by, now, decision.reason)


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
            updated = ctx.acted_on(decided, doc, self.policy, self.instance, now)
            if updated is not None:
                updates.append(updated)
        report = ctx.counts("retry", "failed", "conflicts")
        for doc in ctx.write(updates):
            report[doc[STATE]] += 1
            log.debug(
                "file %s (%s): %s: %s",
                doc["_id"],
                doc["source_lfn"],
                doc[STATE],
                doc["history"][-1].get("reason", ""),
            )
