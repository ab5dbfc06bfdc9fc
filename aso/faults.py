"""Named fault points for crash tests: `point("submitter.after_intent")` kills the process
(SIGKILL, as `kill -9` would) when $ASO_FAULTS names that point. Without the variable, nothing.

Tests and chaos runs use them to stop a process at the exact moment that matters (between an
intent and the action it announces), which a timer-driven kill only hits by luck."""

from __future__ import annotations

import os
import signal


def point(name: str) -> None:
    wanted = os.environ.get("ASO_FAULTS", "")
    if wanted and name in wanted.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
