"""ASO's agents: one module per daemon, each a small `aso.runtime.Agent` over plain functions.

`AGENTS` names them for `aso agent NAME` and `aso run`; modules are imported on demand."""

from __future__ import annotations

import importlib
from typing import Any

AGENTS = {
    "submitter": "agents.submitter:Submitter",
    "monitor": "agents.monitor:Monitor",
    "gfal-worker": "agents.gfal_worker:GfalWorker",
    "retry-manager": "agents.retry_manager:RetryManager",
    "cleaner": "agents.cleaner:Cleaner",
    "publisher": "agents.publisher:Publisher",
    "reconciler": "agents.reconciler:Reconciler",
    "analytics": "agents.analytics:Analytics",
}


def agent_class(name: str) -> Any:
    """The Agent class registered as `name` (KeyError if there is none)."""
    module, _, attr = AGENTS[name].partition(":")
    return getattr(importlib.import_module(module), attr)
