"""`aso metrics targets`: where Prometheus finds the agents' metrics.

Agents take their metrics port at start (the first free one from `metrics.port` upward) and
record it in their heartbeats; this writes Prometheus's file-based service discovery from the
live ones (`file_sd_configs`), so that a new agent host or instance is scraped without editing
Prometheus's configuration. Run it every minute (a systemd timer or cron) next to Prometheus.

aso/cli/__init__.py mounts `metrics_app` as `aso metrics`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from aso import metrics, model
from aso.cli.common import config_of as _config
from aso.cli.common import line_console
from aso.store import Server

console = line_console()
metrics_app = typer.Typer(help="Prometheus metrics of the agents and the front end.",
                          no_args_is_help=True)  # fmt: skip


@metrics_app.command("targets")
def targets_cmd(
    ctx: typer.Context,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Write the file_sd JSON here (atomically); default: stdout."
        ),
    ] = None,
    frontend: Annotated[
        list[str] | None,
        typer.Option("--frontend", help="host:port of a front end's metrics; repeatable."),
    ] = None,
) -> None:
    """Prometheus file_sd targets: every live agent instance that serves metrics, and the
    front ends named with --frontend."""
    config = _config(ctx)
    db = Server.from_config(config).db(config.store.files_db)
    prefix = f"{model.HEARTBEAT_TYPE}:"  # ids "heartbeat:<agent>:<instance>"
    beats = db.all_docs(prefix, prefix + "\ufff0")
    entries = metrics.file_sd_targets(beats, config.agents.heartbeat_expiry)
    for address in frontend or []:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise typer.BadParameter(f"{address!r} is not host:port", param_hint="--frontend")
        entries.append({"targets": [address], "labels": {"agent": "frontend"}})
    text = json.dumps(entries, indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
        return
    _write_atomically(out, text)
    console.print(f"{len(entries)} targets written to {out}")


def _write_atomically(path: Path, text: str) -> None:
    """Prometheus re-reads the file when it changes: it must never see half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
