"""Holds, as plain functions over documents: a destination that refused a user's files for lack
of room (quota) or of permission holds that user's files for it instead of failing them (a
user's hold, `hold:SITE:USER`); a destination that stopped answering many users' attempts at once
holds everyone's files for it (a site's hold, `hold:SITE`: the `Breaker` trips). The retry
manager starts a hold (`started`) and marks the attempts it holds (they spend nothing), the
submitter keeps the files back while a hold holds them (`holding`) and fails them once it was
cancelled or expired (`ended_holding`), the hold checker looks at the destination again on a
backoff (`verdict`, `checked`), its user (a user's hold) or an operator releases or cancels it
(`ended`)."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aso import model
from aso.config import HoldsConfig
from aso.model import HOLD_ACTIVE, HOLD_CANCELLED, HOLD_EXPIRED, HOLD_RELEASED, STATE
from aso.transfer import errors

QUOTA, PERMISSION = model.HOLD_CLASSES
NO_ANSWER = "no answer from"  # how a site's hold says itself


@dataclass(frozen=True)
class Hold:
    """One hold document, as the agents and the status read it."""

    site: str
    user: str
    error_class: str
    state: str
    reason: str
    since: float
    next_check: float
    free: int | None
    needs: int
    path: str
    by: str
    at: float

    @property
    def holds(self) -> bool:
        return self.state == HOLD_ACTIVE

    def says(self) -> str:
        """One line for a person: what holds, where, the figures, the reason."""
        return f"{self.figures()}: {self.reason}"

    def figures(self) -> str:
        """What holds, where, the figures (no reason: a hold's user may have written it)."""
        if not self.user:
            return f"{NO_ANSWER} {self.site} (every user's files)"
        what = "no room" if self.error_class == QUOTA else "no permission"
        free = "" if self.free is None else f", {self.free} bytes free of {self.needs} needed"
        return f"{what} for {self.user} at {self.site}{free}"


def hold_of(doc: Mapping[str, Any]) -> Hold:
    return Hold(
        doc["site"], doc["user"], doc["error_class"], doc["state"], doc["reason"], doc["since"],
        doc["next_check"], doc["free"], doc["needs"], doc["path"], doc["by"], doc["at"],
    )  # fmt: skip


def holds_of(docs: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Hold]:
    """Every hold among `docs`, in force or ended, by (destination, user)."""
    found = {}
    for doc in docs:
        if doc.get("type") == model.HOLD_TYPE:
            hold = hold_of(doc)
            found[hold.site, hold.user] = hold
    return found


def is_held_class(error_class: str | None, config: HoldsConfig) -> bool:
    """Whether a failure of this class holds its user's files at its destination."""
    return config.enabled and error_class in model.HOLD_CLASSES


def holding_id(
    doc: Mapping[str, Any], config: HoldsConfig, held_sites: Iterable[str] = ()
) -> str | None:
    """The hold a failed attempt is held by: its user's at its destination (no room, no
    permission), or a site's (no answer, at its destination or its source that a site's hold
    holds or whose breaker tripped: `held_sites`); None: not held (the retry policy decides)."""
    error_class = doc.get("error_class")
    if is_held_class(error_class, config):
        return model.hold_id(doc["destination"], doc["user"])
    if not config.enabled or error_class not in model.SITE_HOLD_CLASSES:
        return None
    sites = set(held_sites)
    site = next((s for s in (doc["destination"], doc["source"]) if s in sites), None)
    return None if site is None else model.hold_id(site)


def held_request(doc: Mapping[str, Any], config: HoldsConfig) -> bool:
    """Whether the retry manager's decision on this request held it (waiting in `retry`)."""
    attempts = doc.get("attempts") or []
    return (
        config.enabled and doc.get(STATE) == "retry" and bool(attempts and attempts[-1].get("held"))
    )


def hold_keys(doc: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(site, user) of the holds that may hold a request: its user's at its destination, and
    the sites' of its destination and its source."""
    return (doc["destination"], doc["user"]), (doc["destination"], ""), (doc["source"], "")


def _holds_of(doc: Mapping[str, Any], holds: Mapping[tuple[str, str], Hold]) -> list[Hold]:
    """The holds that may hold the request (`hold_keys`), those that exist."""
    return [holds[k] for k in hold_keys(doc) if k in holds]


def holding(doc: Mapping[str, Any], holds: Mapping[tuple[str, str], Hold]) -> Hold | None:
    """The hold in force on a request's destination, its user's or the site's, if any."""
    return next((h for h in _holds_of(doc, holds) if h.holds), None)


def released(doc: Mapping[str, Any], holds: Mapping[tuple[str, str], Hold]) -> bool:
    """Whether a hold that held this request was released after it came to wait: it goes
    now, whatever is left of its cool-off."""
    return any(
        h.state == HOLD_RELEASED and waiting_since(doc) <= h.at for h in _holds_of(doc, holds)
    )


def waiting_since(doc: Mapping[str, Any]) -> float:
    """When a request last entered its copy state (`new` at creation or resubmission, `retry`
    after a failed attempt)."""
    entries = [h for h in doc.get("history") or [] if h.get("axis") == STATE]
    return float(entries[-1]["at"]) if entries else float(doc.get("created") or 0.0)


def ended_holding(doc: Mapping[str, Any], holds: Mapping[tuple[str, str], Hold]) -> Hold | None:
    """The cancelled or expired hold that held this waiting request when it ended: the request
    fails with it. A request that came to wait after that end (a resubmission, a new upload)
    is not held by it any more."""
    return next(
        (
            h
            for h in _holds_of(doc, holds)
            if h.state in model.HOLD_FAILS and waiting_since(doc) <= h.at
        ),
        None,
    )


def failure_reason(hold: Hold) -> str:
    ended = "cancelled by " + hold.by if hold.state == HOLD_CANCELLED else "past its deadline"
    return f"held ({hold.error_class} at {hold.site}) and the hold {ended}: {hold.reason}"


def held_since(doc: Mapping[str, Any]) -> float | None:
    """When this request's first held attempt since its last resubmission ended (a per-file
    deadline runs from it), or None."""
    from aso.retry import attempts_since_resubmission

    ends = [
        a.get("ended") or a.get("submitted") or 0.0
        for a in attempts_since_resubmission(doc)
        if a.get("held")
    ]
    return min(ends) if ends else None


def past_deadline(doc: Mapping[str, Any], config: HoldsConfig, now: float) -> bool:
    since = held_since(doc)
    return since is not None and now - since > config.deadline


def _entry(state: str, reason: str, by: str, at: float) -> dict[str, Any]:
    return {"state": state, "reason": reason[:1024], "by": by, "at": at}


# Entries an agent's write keeps: the latest, with room left for its user's release or cancel.
KEPT_ENTRIES = model.MAX_HOLD_HISTORY - 10


def _with(
    history: Iterable[Mapping[str, Any]], entry: dict[str, Any], keep: int = KEPT_ENTRIES
) -> list[Any]:
    return [*list(history)[-(keep - 1) :], entry]


def started(
    current: Mapping[str, Any] | None,
    *,
    site: str,
    user: str,
    error_class: str,
    reason: str,
    path: str,
    needs: int,
    by: str,
    now: float,
    config: HoldsConfig,
    free: int | None = None,
) -> dict[str, Any] | None:
    """The hold document after a file of `user` failed at `site` with a holding class (no
    `user`: the site's, for everyone's files): a new hold, one that had ended started again, or
    a user's in force needing more room; None: the one in force says it already."""
    if current is not None and current["state"] == HOLD_ACTIVE:
        if not user or (needs <= current["needs"] and error_class == current["error_class"]):
            return None
        return {**current, "needs": max(needs, current["needs"]), "error_class": error_class}
    entry = _entry(HOLD_ACTIVE, reason, by, now)
    doc: dict[str, Any] = {
        "_id": model.hold_id(site, user),
        "type": model.HOLD_TYPE,
        "site": site,
        "user": user,
        "error_class": error_class,
        "path": path,
        "needs": needs,
        "free": free,
        "since": now,
        "checks": 0,
        "next_check": round(now + config.first_check, 3),
        **entry,
        "history": _with((current or {}).get("history") or [], entry),
    }
    if current is not None:
        doc["_rev"] = current["_rev"]
        if "notified" in current:  # what the notifier told of the history it carries
            doc["notified"] = current["notified"]
    return doc


def ended(
    current: Mapping[str, Any],
    state: str,
    reason: str,
    by: str,
    now: float,
    *,
    by_owner: bool = False,
) -> dict[str, Any]:
    """The hold released, cancelled or expired, with who and why in its history (its user's
    change adds its entry to all the earlier ones, as the validation wants)."""
    entry = _entry(state, reason, by, now)
    keep = model.MAX_HOLD_HISTORY if by_owner else KEPT_ENTRIES
    return {**current, **entry, "history": _with(current["history"], entry, keep)}


@dataclass(frozen=True)
class Look:
    """What a look at a held destination found: bytes free (None: not reported) and the error of
    a probe write (None: written, or not tried)."""

    free: int | None
    probe_error: str | None = None
    probed: bool = False


def verdict(hold: Hold, look: Look) -> str | None:
    """Why the destination still cannot take the hold's files, or None: it can. Room is judged
    from the free space its storage reports, where it does; otherwise (and for a permission)
    from a probe write."""
    if hold.error_class == QUOTA and look.free is not None:
        if look.free < hold.needs:
            return f"{look.free} bytes free, {hold.needs} needed"
        return None
    if not look.probed:
        return "not checked"
    return look.probe_error


def needs_probe(hold: Hold, free: int | None) -> bool:
    """Whether a look must also try a probe write: a permission, or room not reported."""
    return hold.error_class == PERMISSION or free is None


def checked(
    current: Mapping[str, Any], look: Look, by: str, now: float, config: HoldsConfig
) -> dict[str, Any] | None:
    """The hold after a look at its destination: released when it passes, expired once past its
    deadline, else checked again later (doubling, up to `max_check_interval`); None: it was
    ended meanwhile (by its user, an operator or another look), the look changes nothing."""
    if current.get("state") != HOLD_ACTIVE:
        return None
    hold = hold_of(current)
    still = verdict(hold, look)
    looked = {**current, "free": look.free}
    if still is None:
        return ended(
            looked,
            HOLD_RELEASED,
            f"the {'destination' if hold.user else 'site'} passed a check: {_figures(hold, look)}",
            by,
            now,
        )
    if now - hold.since > config.deadline:
        return ended(looked, HOLD_EXPIRED, f"held past its deadline: {still}", by, now)
    checks = current["checks"] + 1
    delay = min(config.max_check_interval, config.first_check * 2**checks)
    return {**looked, "checks": checks, "next_check": round(now + delay, 3)}


def _figures(hold: Hold, look: Look) -> str:
    if not hold.user:
        return "it answers"
    if look.free is not None:
        return f"{look.free} bytes free"
    return "a probe file was written"


def due(hold: Hold, now: float) -> bool:
    return hold.holds and hold.next_check <= now


@dataclass
class Breaker:
    """A circuit breaker per site, fed every request that changes (the changes feed): it trips
    when at least `holds.breaker_failures` attempts of at least `holds.breaker_users` users
    failed without an answer (connection, timeout) from that site, as their reasons say (the
    step that failed: SOURCE or DESTINATION, errors.failing_end), within
    `holds.breaker_window` seconds, no copy from or to it having ended since the first."""

    config: HoldsConfig
    # site → (end, failed without an answer?, user) of recent attempts from or to it
    outcomes: dict[str, deque[tuple[float, bool, str]]] = field(
        default_factory=lambda: defaultdict(deque)
    )
    seen: dict[str, int] = field(default_factory=dict)  # request id → attempts counted

    def observe(self, doc: Mapping[str, Any]) -> None:
        if doc.get("type") != model.REQUEST_TYPE or "destination" not in doc:
            return
        ended = [a for a in doc.get("attempts") or [] if a.get("outcome") in model.RAN_TO_AN_END]
        for attempt in ended[self.seen.get(doc["_id"], 0) :]:
            unanswered = (
                attempt["outcome"] == "failed"
                and attempt.get("error_class") in model.SITE_HOLD_CLASSES
            )

            ended_at, user = attempt.get("ended") or 0.0, doc["user"]
            if not unanswered:  # a copy done, or failed otherwise: both ends answered
                for site in {doc["source"], doc["destination"]}:
                    self.outcomes[site].append((ended_at, False, user))
                continue
            # Only the end the failure names counts it: a dead source had held every file for
            # the destination its users chose (round 29); a failure that names neither, none.
            site = errors.failing_end(attempt.get("reason"), doc["source"], doc["destination"])
            if site is not None:
                self.outcomes[site].append((ended_at, True, user))
        self.seen[doc["_id"]] = len(ended)

    def tripped(self, site: str, now: float) -> str | None:
        """Why the site counts as not answering (its hold's reason), or None."""
        window = self.outcomes.get(site)
        if not window:
            return None
        while window and window[0][0] < now - self.config.breaker_window:
            window.popleft()
        failing: list[tuple[float, bool, str]] = []
        for outcome in sorted(window):
            failing = [*failing, outcome] if outcome[1] else []
        users = {user for _, _, user in failing}
        if len(failing) < self.config.breaker_failures or len(users) < self.config.breaker_users:
            return None
        return (
            f"{len(failing)} attempts of {len(users)} users there failed without an answer "
            f"within {self.config.breaker_window:g} s, none succeeding since"
        )

    def forget(self) -> None:
        self.outcomes.clear()
        self.seen.clear()
