"""What the end of a file's transfer makes of its request (the monitor's decision): done once
the copy is confirmed at its destination, else a failed attempt (or killed, when its owner
asked), with the error's class and reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aso import model
from aso.core import request
from aso.core.destination import NOT_DONE_CLASS, Finding, awaits_a_look, not_done
from aso.model import STATE
from aso.transfer import errors
from aso.transfer.base import CANCELED, DONE, FileStatus


def outcome(
    doc: Mapping[str, Any],
    status: FileStatus,
    by: str,
    now: float,
    finding: Finding | None = None,
) -> dict[str, Any] | None:
    """The document after its file's transfer ended, or None while it is still under way (or
    reported done and not confirmed at the destination yet). `finding`: the monitor's look at
    the destination, for a copy the service reported done without verifying it."""
    killing = doc[STATE] == "kill_requested"
    if not status.terminal:
        return None
    if status.state == DONE:
        if awaits_a_look(status, finding):
            return None
        problem = not_done(doc, status, finding)
        if problem is not None:
            return request.attempt_ended(
                doc,
                "killed" if killing else "failed_attempt",
                by,
                now,
                reason=problem,
                error_class=NOT_DONE_CLASS,
                outcome="failed",
                ended=status.ended,
            )
        late = model.KILL_CAME_LATE if killing else None
        return request.attempt_ended(
            doc, "done", by, now, outcome="done", reason=late, ended=status.ended
        )
    error_class = status.error_class or errors.classify(message=status.reason)
    target = "killed" if killing else "failed_attempt"
    result = "canceled" if status.state == CANCELED else "failed"
    return request.attempt_ended(
        doc,
        target,
        by,
        now,
        reason=status.reason or status.service_state,
        error_class=error_class,
        outcome=result,
        ended=status.ended,
    )
