"""What the holds (aso/core/holds.py) did to a simulated run's files, from the documents at its
end, for the report (sim/report.py).

A file waits held in two ways: after an attempt a hold held (a copy refused for room or
permission, or failed at a site whose breaker tripped: from that attempt's end to the next
attempt's start), and kept back before it is sent, while a hold of its destination (its user's,
or the site's) or of its source is in force: the submitter keeps such files back, and its
admission holds the files a destination has no room for before any of them is refused. The
spans in which each hold was in force come from its history.

`quota_figures` gives the figures of a destination with a size limit (`aso sim --quota
SITE:SIZE@START-END`): what landed there (its ledger in the job table,
aso/transfer/sim_quota.py), the copies refused, the files it held and for how long.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aso import model
from aso.core.holds import hold_keys
from aso.model import STATE
from aso.transfer import errors

Span = tuple[float, float]  # (from, to), wall epoch seconds
WAITING = ("new", "retry")  # the states in which the submitter may keep a file back
ADMISSION = "admission:"  # how a hold the submitter's admission started says so (Refused.reason)


@dataclass(frozen=True)
class HoldSpans:
    """When one hold was in force, its (last) class, and how many times it started, of them
    from the submitter's admission (before any copy was refused)."""

    error_class: str
    spans: tuple[Span, ...]
    starts: int = 0
    by_admission: int = 0


@dataclass(frozen=True)
class HeldFile:
    """A file that waited held: where it was going, the classes of what held it, the wall
    seconds it waited held, and of them those it was kept back without a held attempt (and
    the classes of the holds that kept it back)."""

    destination: str
    classes: frozenset[str]
    seconds: float
    kept_back: float
    kept_back_by: frozenset[str]


def hold_spans(docs: Iterable[Mapping[str, Any]], end: float) -> dict[tuple[str, str], HoldSpans]:
    """Every hold among `docs` by (site, user), with the spans its history says it was in
    force (one still in force at `end` counts until then)."""
    found = {}
    for doc in docs:
        if doc.get("type") == model.HOLD_TYPE:
            history = doc.get("history") or []
            starts = [e for e in history if e.get("state") == model.HOLD_ACTIVE]
            found[doc["site"], doc["user"]] = HoldSpans(
                str(doc["error_class"]),
                tuple(_spans(history, end)),
                len(starts),
                sum(str(e.get("reason", "")).startswith(ADMISSION) for e in starts),
            )
    return found


def _spans(history: Sequence[Mapping[str, Any]], end: float) -> list[Span]:
    spans, since = [], None
    for entry in history:
        active = entry.get("state") == model.HOLD_ACTIVE
        if active and since is None:
            since = float(entry["at"])
        elif not active and since is not None:
            spans.append((since, float(entry["at"])))
            since = None
    if since is not None:
        spans.append((since, max(since, end)))
    return spans


def after_held_attempts(doc: Mapping[str, Any]) -> tuple[float, set[str]]:
    """Wall seconds from each held attempt's end to the next attempt's start, and the classes
    of those attempts."""
    attempts = doc.get("attempts") or []
    seconds, classes = 0.0, set()
    for i, attempt in enumerate(attempts):
        if attempt.get("held"):
            classes.add(attempt.get("error_class") or "unknown")
            later = attempts[i + 1]["submitted"] if i + 1 < len(attempts) else None
            ended = attempt.get("ended") or attempt["submitted"]
            seconds += max(0.0, (later if later is not None else ended) - ended)
    return seconds, classes


def waits(doc: Mapping[str, Any]) -> list[Span]:
    """The spans the file waited to be sent (in `new` or `retry`), but for those after a held
    attempt (`after_held_attempts` counts them)."""
    entries = [h for h in doc.get("history") or [] if h.get("axis") == STATE]
    attempts = doc.get("attempts") or []
    found = []
    for entry, following in itertools.pairwise(entries):
        start = float(entry["at"])
        if entry["to"] in WAITING and not _after_held_attempt(attempts, start):
            found.append((start, float(following["at"])))
    return found


def _after_held_attempt(attempts: Sequence[Mapping[str, Any]], at: float) -> bool:
    """Whether the last attempt sent before `at` was held."""
    before = [a for a in attempts if float(a.get("submitted") or 0.0) < at]
    return bool(before and before[-1].get("held"))


def overlap(span: Span, spans: Iterable[Span]) -> float:
    return sum(max(0.0, min(span[1], b) - max(span[0], a)) for a, b in spans)


def kept_back(
    doc: Mapping[str, Any], holds: Mapping[tuple[str, str], HoldSpans]
) -> tuple[float, set[str]]:
    """Wall seconds the file waited to be sent while a hold that holds it was in force (the
    first of its holds in force, as the submitter finds it), and their classes."""
    mine = [holds[key] for key in hold_keys(doc) if key in holds]
    seconds, classes = 0.0, set()
    for wait in waits(doc):
        for hold in mine:
            held = overlap(wait, hold.spans)
            if held > 0:
                seconds += held
                classes.add(hold.error_class)
                break
    return seconds, classes


def held_file(
    doc: Mapping[str, Any], holds: Mapping[tuple[str, str], HoldSpans]
) -> HeldFile | None:
    """How the holds held this file, or None: they did not."""
    after, by_attempt = after_held_attempts(doc)
    before, by_hold = kept_back(doc, holds)
    if not by_attempt and not by_hold:
        return None
    classes = frozenset(by_attempt | by_hold)
    return HeldFile(doc["destination"], classes, after + before, before, frozenset(by_hold))


def quota_figures(
    quota: Mapping[str, Any],
    ledger: Mapping[str, Any] | None,
    requests: Iterable[Mapping[str, Any]],
    held: Iterable[tuple[HeldFile, str]],
    holds: Mapping[tuple[str, str], HoldSpans],
    summarize: Callable[[list[float]], dict[str, float | None]],
    compression: float,
) -> dict[str, Any]:
    """A destination with a size limit (a plan's outage with `bytes`, in simulated seconds):
    its limit and span; the bytes and copies that landed there while it was in force, whether
    they stayed within it and are the attempts the requests record done; the copies it
    refused; the files that failed for room there (none, if the holds hold); its users' holds'
    starts (of them by the submitter's admission); and the files it held ((file, outcome) of
    the run's held files): how many, how many kept back before a copy of theirs was held, how
    they ended (how many done), and their simulated seconds held (`summarize`d)."""
    site, limit = quota["site"], int(quota["bytes"])
    mine = [d for d in requests if d.get("destination") == site]
    used = int((ledger or {}).get("used", 0))
    files = [(f, end) for f, end in held if f.destination == site and errors.QUOTA in f.classes]
    users = [h for (where, user), h in holds.items() if where == site and user]
    return {
        "site": site,
        "limit_bytes": limit,
        "start": float(quota["start"]),
        "end": float(quota["end"]),
        "landed_bytes": used,
        "landed_copies": len((ledger or {}).get("copies") or {}),
        "within_limit": used <= limit,
        "ledger_agrees": ledger_agrees(ledger, mine),
        "refused_copies": sum(
            a.get("error_class") == errors.QUOTA for d in mine for a in d.get("attempts") or []
        ),
        "failed_for_room": sum(
            d.get(STATE) == "failed" and d.get("error_class") == errors.QUOTA for d in mine
        ),
        "hold_starts": sum(h.starts for h in users if h.error_class == errors.QUOTA),
        "hold_starts_by_admission": sum(h.by_admission for h in users),
        "files_held": len(files),
        "files_kept_back": sum(f.kept_back > 0 for f, _ in files),
        "held_done": sum(end == "done" for _, end in files),
        "held_outcomes": dict(Counter(end for _, end in files).most_common()),
        "held_seconds": summarize([f.seconds * compression for f, _ in files]),
    }


def ledger_agrees(ledger: Mapping[str, Any] | None, requests: Iterable[Mapping[str, Any]]) -> bool:
    """Whether every copy the quota's ledger says landed is an attempt its request records as
    done (the monitors that read the copies' ends took what the ledger decided)."""
    outcomes = {
        f"{attempt.get('job_id')}/{doc['_id']}": attempt.get("outcome")
        for doc in requests
        for attempt in doc.get("attempts") or []
    }
    return all(outcomes.get(key) == "done" for key in (ledger or {}).get("copies") or {})
