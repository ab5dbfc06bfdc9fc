"""Retry policies: what to do with a failed transfer attempt.

A policy is a plug-in, loaded by name from the entry-point group `aso.retry_policies`
(`retry.policy` in the config), so a site can ship its own in any installed package:

    [options.entry_points]
    aso.retry_policies =
        mypolicy = mypackage.module:MyPolicy

A policy class is built with the `[retry]` section of the config and answers `decide(doc, now)`
with a Decision: retry after a delay, or fail for good with a reason. It may also `observe`
every request that changes (the retry manager shows it the whole `_changes` feed), which is how
the adaptive policy learns each link's recent failure ratio. ASO ships two:

* `default`: permanent error classes (missing source, existing destination, permission,
  quota) fail at once; a checksum mismatch fails when it repeats; other failures are retried
  with exponential backoff (`base_delay` · 2^(n-1), capped at `max_delay`, ± `jitter`) until
  `max_attempts` attempts since the last resubmission;
* `adaptive`: the default, plus a per-link penalty: on a link whose failure ratio over the last
  `window` seconds is above `bad_link_ratio` (with at least `min_samples` outcomes), the delay is
  multiplied by `link_penalty`, so a broken link is not hammered while it stays broken.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol

from aso import model
from aso.config import RetryConfig
from aso.transfer import errors

GROUP = "aso.retry_policies"


@dataclass(frozen=True)
class Decision:
    retry: bool
    delay: float = 0.0  # seconds of cool-off before the file goes back to `new`
    reason: str = ""


class RetryPolicy(Protocol):
    name: str

    def decide(self, doc: Mapping[str, Any], now: float) -> Decision: ...

    def observe(self, doc: Mapping[str, Any]) -> None: ...


class PolicyError(ValueError):
    """The configured policy cannot be loaded; the message lists the known ones."""


def available() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load_policy(config: RetryConfig) -> RetryPolicy:
    known = available()
    if config.policy not in known:
        raise PolicyError(
            f"retry.policy {config.policy!r} is not an installed retry policy; "
            f"known: {', '.join(sorted(known)) or 'none'}"
        )
    policy: RetryPolicy = known[config.policy].load()(config)
    return policy


# --- what the documents say about past attempts -----------------------------------------------
def attempts_since_resubmission(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The attempts that count: those after the owner's last resubmission."""
    resubmitted = max(
        (
            h["at"]
            for h in doc.get("history", [])
            if h["axis"] == model.STATE and h["from"] in model.NEVER_COPIED and h["to"] == "new"
        ),
        default=0.0,
    )
    return [a for a in doc.get("attempts", []) if a.get("submitted", 0) >= resubmitted]


def link_of(doc: Mapping[str, Any]) -> str:
    return f"{doc['source']}>{doc['destination']}"


# --- the shipped policies ----------------------------------------------------------------------
class DefaultPolicy:
    name = "default"

    def __init__(self, config: RetryConfig, rng: random.Random | None = None):
        self.config = config
        self.rng = rng or random.Random()

    def observe(self, doc: Mapping[str, Any]) -> None:
        """The default policy learns nothing from the feed."""

    def decide(self, doc: Mapping[str, Any], now: float) -> Decision:
        error_class = doc.get("error_class") or errors.UNKNOWN
        attempts = attempts_since_resubmission(doc)
        # Attempts its destination's hold held (aso/core/holds.py) spend nothing.
        n = max(1, sum(not a.get("held") for a in attempts))
        if errors.is_permanent(error_class):
            return Decision(
                False,
                reason=f"permanent error ({error_class}): "
                f"{doc.get('failure_reason') or ''}".strip(),
            )
        if error_class == errors.CHECKSUM:
            mismatches = sum(a.get("error_class") == errors.CHECKSUM for a in attempts)
            if mismatches > self.config.checksum_retries:
                return Decision(False, reason=f"checksum mismatch in {mismatches} attempts")
        if n >= self.config.max_attempts:
            return Decision(
                False,
                reason=f"out of attempts ({n} of {self.config.max_attempts}); last: {error_class}",
            )
        return Decision(True, self.delay(n, doc, now), reason=f"retry {n} after {error_class}")

    def delay(self, n: int, doc: Mapping[str, Any], now: float) -> float:
        base: float = min(self.config.max_delay, self.config.base_delay * 2 ** (n - 1))
        spread = self.config.jitter * base
        return max(0.0, base + self.rng.uniform(-spread, spread))


class LinkAdaptivePolicy(DefaultPolicy):
    name = "adaptive"

    def __init__(self, config: RetryConfig, rng: random.Random | None = None):
        super().__init__(config, rng)
        # link → (time, failed?) of recent attempt outcomes, oldest first
        self.outcomes: dict[str, deque[tuple[float, bool]]] = defaultdict(deque)
        self.seen: dict[str, int] = {}  # request id → attempts already counted

    def observe(self, doc: Mapping[str, Any]) -> None:
        if doc.get("type") != model.REQUEST_TYPE or "source" not in doc:
            return
        attempts = doc.get("attempts") or []
        ended = [a for a in attempts if a.get("outcome") in model.RAN_TO_AN_END]
        counted = self.seen.get(doc["_id"], 0)
        for attempt in ended[counted:]:
            self.outcomes[link_of(doc)].append(
                (attempt.get("ended") or 0.0, attempt["outcome"] == "failed")
            )
        self.seen[doc["_id"]] = len(ended)

    def failure_ratio(self, link: str, now: float) -> tuple[float, int]:
        window = self.outcomes[link]
        while window and window[0][0] < now - self.config.window:
            window.popleft()
        if not window:
            return 0.0, 0
        return sum(failed for _, failed in window) / len(window), len(window)

    def delay(self, n: int, doc: Mapping[str, Any], now: float) -> float:
        delay = super().delay(n, doc, now)
        ratio, samples = self.failure_ratio(link_of(doc), now)
        if samples >= self.config.min_samples and ratio > self.config.bad_link_ratio:
            delay = min(
                self.config.max_delay * self.config.link_penalty, delay * self.config.link_penalty
            )
        return delay
