"""ASO's agents: one module per daemon, each a small `aso.runtime.Agent` over plain functions.

`AGENTS` names them for `aso agent NAME` and `aso run`; modules are imported on demand."""

from __future__ import annotations

import importlib
from typing import Any

AGENTS = {
    "submitter": "aso.agents.submitter:Submitter",
    "monitor": "aso.agents.monitor:Monitor",
    "gfal-worker": "aso.agents.gfal_worker:GfalWorker",
    "retry-manager": "aso.agents.retry_manager:RetryManager",
    "cleaner": "aso.agents.cleaner:Cleaner",
    "publisher": "aso.agents.publisher:Publisher",
    "reconciler": "aso.agents.reconciler:Reconciler",
    "analytics": "aso.agents.analytics:Analytics",
    "hold-checker": "aso.agents.hold_checker:HoldChecker",
    "notifier": "aso.agents.notifier:Notifier",
}


def agent_class(name: str) -> Any:
    """The Agent class registered as `name` (KeyError if there is none)."""
    module, _, attr = AGENTS[name].partition(":")
    return getattr(importlib.import_module(module), attr)
