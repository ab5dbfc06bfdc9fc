"""A temporary copy's cleanup: when it is due, and what its outcome makes of the request (the
cleaner, the publisher and the monitor record deletions with the same functions)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aso import model
from aso.config import CleanerConfig
from aso.core import request
from aso.model import CLEANUP


@dataclass(frozen=True)
class Outcome:
    cleaned: bool
    reason: str


def due(doc: Mapping[str, Any], now: float) -> bool:
    return (
        doc.get(model.STATE) == "done"
        and doc.get(CLEANUP) in model.CLEANUP_DUE
        and (doc.get("cleanup_retry_after") or 0) <= now
    )


def discardable(doc: Mapping[str, Any], now: float, grace: float) -> bool:
    """A file never copied (failed for good, or killed) whose temporary copy is still there,
    `grace` seconds after it reached that state (model.WORK's "discard"): the copy goes."""
    return (
        doc.get(model.STATE) in model.NEVER_COPIED
        and doc.get(CLEANUP) in model.CLEANUP_DUE
        and model.state_since(doc) <= now - grace
        and (doc.get("cleanup_retry_after") or 0) <= now
    )


def cleanable_at_done(doc: Mapping[str, Any], now: float) -> bool:
    """A file just recorded `done` whose temporary copy may go at once: its cleanup is due and
    no publication waits for it (model.WORK's "clean")."""
    return due(doc, now) and doc.get(model.PUBLICATION) in model.FINAL[model.PUBLICATION]


def cleanup_recorded(
    doc: dict[str, Any], outcome: Outcome, by: str, now: float, settings: CleanerConfig
) -> dict[str, Any]:
    """The document with a deletion's outcome: `cleaned`, or `cleanup_error` with the next
    try after the backoff."""
    if outcome.cleaned:
        return request.cleaned(doc, by, now, outcome.reason)
    return request.cleanup_failed(
        doc, by, now, outcome.reason, settings.base_delay, settings.max_delay
    )
