"""`aso site ban|drain|allow|list` and `aso user ban|allow|list`: operators' controls.

aso/cli/__init__.py mounts `site_app` as `aso site` and `user_app` as `aso user`. A ban or a
drain keeps the submitter from starting anything new on that site (in one direction, or both)
or for that user; `allow` lifts it. Each setting is one document of the files database, written
with the command's store account (an operator's: the store refuses anyone else), with every
earlier setting, who made it, when and why (aso/core/controls.py, docs/usage.md).
"""

from __future__ import annotations

import re
import time
from typing import Annotated

import typer

from aso import actions, model
from aso.cli.common import (
    UsageError,
    acting_name,
    config_of,
    line_console,
    print_json,
    print_table,
    utc_time,
)
from aso.model import AS_DESTINATION, AS_SOURCE, BOTH, SITE, USER
from aso.monitoring.queries import read_controls
from aso.store import Server

console = line_console()

site_app = typer.Typer(
    help="Ban, drain or allow a site (as source, destination or both); list the controls.",
    no_args_is_help=True,
)
user_app = typer.Typer(help="Ban or allow a user; list the controls.", no_args_is_help=True)

SiteArg = Annotated[str, typer.Argument(help="Site name, e.g. T2_CH_CERN.")]
UserArg = Annotated[str, typer.Argument(help="User name, as the store knows it.")]
ReasonOpt = Annotated[str, typer.Option("--reason", "-r", help="Why (recorded, shown to users).")]
SourceOpt = Annotated[bool, typer.Option("--source", help="Only as a source.")]
DestinationOpt = Annotated[bool, typer.Option("--destination", help="Only as a destination.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the controls as JSON.")]
HistoryOpt = Annotated[bool, typer.Option("--history", help="Every setting, not the last only.")]


def _set(ctx: typer.Context, kind: str, name: str, mode: str, reason: str, direction: str) -> None:
    config = config_of(ctx)
    if kind == SITE and name not in config.sites:
        raise UsageError(f"{name} is not a site of the catalogue (sites.* in the config)")
    if kind == USER and not re.fullmatch(model.NAME_PATTERN, name):
        raise UsageError(f"{name!r} is not a user name")
    if mode != model.ALLOW and not reason.strip():
        raise UsageError(f"--reason is required: users see why their files wait ({mode})")
    server = Server.from_config(config)
    by = acting_name(config, server)
    db = server.db(config.store.files_db)
    actions.set_control(db, kind, name, mode, reason, by, round(time.time(), 3), direction)
    where = "" if direction == BOTH else f" as {direction}"
    console.print(f"{kind} {name}: {mode}{where} (by {by}: {reason or 'no reason given'})")
    if mode == model.BAN:
        console.print("nothing new starts there; copies under way go on until they end")
    elif mode == model.DRAIN:
        console.print("nothing new starts there; copies under way finish")


def _direction(source: bool, destination: bool) -> str:
    if source and destination:
        raise UsageError("--source and --destination together: give neither for both")
    return AS_SOURCE if source else AS_DESTINATION if destination else BOTH


def _list(ctx: typer.Context, kind: str, as_json: bool, history: bool) -> None:
    config = config_of(ctx)
    db = Server.from_config(config).db(config.store.files_db)
    docs = [d for d in read_controls(db) if d.get("kind") == kind]
    if as_json:
        keep = ("name", "mode", "direction", "reason", "by", "at", "history")
        print_json(console, [{k: d[k] for k in keep} for d in docs])
        return
    if not docs:
        console.print(f"no {kind} has been banned, drained or allowed")
        return
    rows = [
        (d["name"], s["mode"], s["direction"], utc_time(s["at"]), s["by"], s["reason"])
        for d in docs
        for s in (d["history"] if history else [d])
    ]
    print_table([kind, "mode", "direction", "since", "by", "reason"], rows)


def _site_setting(mode: str, doc: str) -> None:
    """`aso site ban` and `aso site drain`: the same options, another mode."""

    def command(
        ctx: typer.Context,
        site: SiteArg,
        reason: ReasonOpt = "",
        source: SourceOpt = False,
        destination: DestinationOpt = False,
    ) -> None:
        _set(ctx, SITE, site, mode, reason, _direction(source, destination))

    command.__doc__ = doc
    site_app.command(mode)(command)


_site_setting(model.BAN, "Ban a site: nothing new starts from or to it (or in one direction).")
_site_setting(
    model.DRAIN, "Drain a site: nothing new starts from or to it; copies under way finish."
)


@site_app.command("allow")
def site_allow(ctx: typer.Context, site: SiteArg, reason: ReasonOpt = "") -> None:
    """Lift a site's ban or drain."""
    _set(ctx, SITE, site, model.ALLOW, reason, BOTH)


@site_app.command("list")
def site_list(ctx: typer.Context, as_json: JsonOpt = False, history: HistoryOpt = False) -> None:
    """The sites' controls: the setting of each, or with --history every setting."""
    _list(ctx, SITE, as_json, history)


@user_app.command("ban")
def user_ban(ctx: typer.Context, user: UserArg, reason: ReasonOpt = "") -> None:
    """Ban a user: none of their files starts (those under way go on)."""
    _set(ctx, USER, user, model.BAN, reason, BOTH)


@user_app.command("allow")
def user_allow(ctx: typer.Context, user: UserArg, reason: ReasonOpt = "") -> None:
    """Lift a user's ban."""
    _set(ctx, USER, user, model.ALLOW, reason, BOTH)


@user_app.command("list")
def user_list(ctx: typer.Context, as_json: JsonOpt = False, history: HistoryOpt = False) -> None:
    """The users' controls: the setting of each, or with --history every setting."""
    _list(ctx, USER, as_json, history)
