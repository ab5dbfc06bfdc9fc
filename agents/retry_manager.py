"""Retry manager: decides what becomes of every failed attempt, and ends the cool-offs.

* `failed_attempt` → `retry` (with `retry_after`, the end of its cool-off) or → `failed` for
  good, as the retry policy decides (aso/retry.py; a plug-in chosen by `retry.policy`);
* `retry` whose cool-off is over → `new`, for the submitter.

A user's kill always wins: an owner may kill a file in `failed_attempt` or `retry` at any moment;
if the kill lands first, the retry manager's write conflicts (409) and the file stays killed.
Partition: by request id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from aso import model
from aso.config import Config
from aso.model import AGENT, STATE, Change
from aso.retry import RetryPolicy, load_policy
from aso.runtime import Agent, Membership, set_aside_reason
from aso.workqueue import COOLOFF, DECIDE

log = logging.getLogger("aso.agent.retry_manager")


def decided(doc: Mapping[str, Any], policy: RetryPolicy, by: str, now: float) -> dict[str, Any]:
    """The document after the policy's decision on its failed attempt."""
    decision = policy.decide(doc, now)
    if decision.retry:
        return model.transition(
            doc,
            [Change(STATE, "retry", by, decision.reason)],
            AGENT,
            at=now,
            retry_after=round(now + decision.delay, 3),
        )
    return given_up(doc, decision.reason, by, now)


def given_up(doc: Mapping[str, Any], reason: str, by: str, now: float) -> dict[str, Any]:
    """`failed` for good, with the reason (the policy's, or why no decision could be made)."""
    return model.transition(
        doc,
        [Change(STATE, "failed", by, reason)],
        AGENT,
        at=now,
        retry_after=None,
        failure_reason=reason[:4096],
    )


def cooled_off(doc: Mapping[str, Any], by: str, now: float) -> dict[str, Any]:
    """A file whose cool-off is over goes back to the submitter's queue."""
    return model.transition(
        doc,
        [Change(STATE, "new", by, "cool-off over")],
        AGENT,
        at=now,
        retry_after=None,
        transfer=None,
    )


class RetryManager(Agent):
    name = "retry-manager"
    kinds = (DECIDE, COOLOFF)

    def __init__(self, config: Config, instance: str | None = None):
        super().__init__(config, instance)
        self.policy = load_policy(config.retry)
        self.observe = self.policy.observe

    def cycle(
        self,
        mine: list[dict[str, Any]],
        membership: Membership,
        everything: Mapping[str, dict[str, Any]],
    ) -> dict[str, Any]:
        now = time.time()
        updates = []
        for doc in mine:
            if doc[STATE] == "failed_attempt":
                try:
                    updates.append(decided(doc, self.policy, self.instance, now))
                except Exception as exc:  # the policy (a plug-in) failed on this file
                    updates.append(
                        given_up(doc, set_aside_reason(self.name, doc, exc), self.instance, now)
                    )
            elif doc[STATE] == "retry" and (doc.get("retry_after") or 0) <= now:
                updates.append(cooled_off(doc, self.instance, now))
        report = {"retry": 0, "failed": 0, "new": 0, "conflicts": 0}
        if not updates:
            return report
        written = []
        for doc, result in zip(updates, self.db.bulk_write(updates), strict=True):
            if not result.ok:
                report["conflicts"] += 1  # e.g. the owner killed it meanwhile: the kill wins
                log.info("file %s left as it is: %s (%s)", doc["_id"], result.error, result.reason)
                continue
            written.append(dict(doc, _rev=result.rev))
            report[doc[STATE]] += 1
            log.info(
                "file %s (%s): %s: %s",
                doc["_id"],
                doc["source_lfn"],
                doc[STATE],
                doc["history"][-1].get("reason", ""),
            )
        self.written(written)
        return report
