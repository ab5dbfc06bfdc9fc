"""`aso storage start|stop|status`: the embedded XRootD servers of the site catalogue.

aso/cli/__init__.py mounts `storage_app` as `aso storage` and turns StorageError into a one-line
error.
"""

from __future__ import annotations

from typing import Annotated

import typer

from aso.cli.common import config_of as _config
from aso.cli.common import line_console, print_json
from aso.local.xrootd import EmbeddedStorage

console = line_console()  # one line per site, however long

storage_app = typer.Typer(
    help="Run the embedded storage: one XRootD server per embedded site (root:// and https).",
    no_args_is_help=True,
)


def _print(line: str) -> None:
    console.print(line, markup=False, highlight=False)


@storage_app.command("start")
def storage_start(ctx: typer.Context) -> None:
    """Start an XRootD server per embedded site and wait until each answers (idempotent)."""
    for line in EmbeddedStorage(_config(ctx)).start():
        _print(line)


@storage_app.command("stop")
def storage_stop(ctx: typer.Context) -> None:
    """Stop the XRootD servers started from this config (and no other process)."""
    for line in EmbeddedStorage(_config(ctx)).stop():
        _print(line)


@storage_app.command("status")
def storage_status(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="Print the sites as JSON.")] = False,
) -> None:
    """Say per site whether its server runs and answers (exit 1 if one does not answer)."""
    statuses = EmbeddedStorage(_config(ctx)).status()
    if json_out:
        sites = [
            {"site": s.site, "embedded": s.embedded, "endpoints": s.endpoints, "pid": s.pid,
             "answering": s.answering, "export": None if s.export is None else str(s.export)}
            for s in statuses
        ]  # fmt: skip
        print_json(console, {"sites": sites})
    else:
        for status in statuses:
            _print(status.line())
    if any(s.embedded and not s.answering for s in statuses):
        raise typer.Exit(1)
