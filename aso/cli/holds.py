"""`aso hold list|release|cancel`: the holds on users' files at destinations that refused them
for want of room or permission.

aso/cli/__init__.py mounts `hold_app` as `aso hold`. A hold keeps a user's files for a
destination waiting (aso/core/holds.py) until the hold checker finds the destination able to
take them, or its deadline passes. Its user (or an operator, for anyone) may release it (the
files are tried again now) or cancel it (the files it holds fail, and may be resubmitted later);
the store refuses anyone else (docs/usage.md, "Held files").
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
from aso.core import holds
from aso.monitoring.queries import all_holds
from aso.store import Server

console = line_console()

hold_app = typer.Typer(
    help="Files held at destinations without room or permission: list, release, cancel.",
    no_args_is_help=True,
)

SiteArg = Annotated[str, typer.Argument(help="Destination site, e.g. T2_CH_CERN.")]
UserOpt = Annotated[
    str, typer.Option("--user", "-u", help="Whose hold (default: you; others: operators only).")
]
ReasonOpt = Annotated[str, typer.Option("--reason", "-r", help="Why (recorded in the hold).")]
EveryoneOpt = Annotated[
    bool,
    typer.Option(
        "--everyone", help="The site's hold of every user's files (no answer: operators only)."
    ),
]
EVERYONE = "(everyone)"  # how a listing shows a site's hold's user


@hold_app.command("list")
def hold_list(
    ctx: typer.Context,
    user: Annotated[str, typer.Option("--user", "-u", help="Only this user's holds.")] = "",
    site: Annotated[str, typer.Option("--site", "-s", help="Only holds at this site.")] = "",
    everything: Annotated[
        bool, typer.Option("--all", "-a", help="Ended holds too (released, cancelled, expired).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the holds as JSON.")] = False,
) -> None:
    """The holds in force (with --all every hold): whose files, where, why, since when, the
    free space last seen and the next check."""
    config = config_of(ctx)
    db = Server.from_config(config).db(config.store.files_db)
    docs = [
        d
        for d in all_holds(db)
        if (everything or d["state"] == model.HOLD_ACTIVE)
        and (not user or d["user"] == user)
        and (not site or d["site"] == site)
    ]
    if as_json:
        print_json(console, [{k: v for k, v in d.items() if k[0] != "_"} for d in docs])
        return
    if not docs:
        console.print("no files are held" if not everything else "no hold has been recorded")
        return
    rows = []
    for doc in sorted(docs, key=lambda d: (d["site"], d["user"])):
        hold = holds.hold_of(doc)
        free = "" if hold.free is None else str(hold.free)
        check = utc_time(hold.next_check) if hold.holds else ""
        rows.append((hold.site, hold.user or EVERYONE, hold.state, hold.error_class,
                     utc_time(hold.since), free, str(hold.needs), check, hold.reason))  # fmt: skip
    headers = ["site", "user", "state", "class", "since", "free", "needs", "next check", "reason"]
    print_table(headers, rows)


def _end(ctx: typer.Context, site: str, user: str, everyone: bool, state: str, reason: str) -> None:
    config = config_of(ctx)
    if site not in config.sites:
        raise UsageError(f"{site} is not a site of the catalogue (sites.* in the config)")
    if user and not re.fullmatch(model.NAME_PATTERN, user):
        raise UsageError(f"{user!r} is not a user name")
    if user and everyone:
        raise UsageError("--user and --everyone together: a hold is a user's or the site's")
    server = Server.from_config(config)
    by = acting_name(config, server)
    whose = "" if everyone else user or by
    db = server.db(config.store.files_db)
    said = reason.strip() or f"{state} by {by}"
    try:
        actions.end_hold(db, site, whose, state, said, by, round(time.time(), 3))
    except actions.NotHeld as exc:
        raise UsageError(str(exc)) from None
    owner = f"{whose}'s" if whose else "every user's"
    console.print(f"hold of {owner} files at {site}: {state} (by {by}: {said})")
    if state == model.HOLD_RELEASED:
        console.print("its files are tried again at the submitter's next cycle")
    else:
        console.print(
            "its files fail (class and reason of the hold); `aso resubmit` brings them back"
        )


def _ending(state: str, name: str, doc: str) -> None:
    """`aso hold release` and `aso hold cancel`: the same options, another end."""

    def command(
        ctx: typer.Context,
        site: SiteArg,
        user: UserOpt = "",
        everyone: EveryoneOpt = False,
        reason: ReasonOpt = "",
    ) -> None:
        _end(ctx, site, user, everyone, state, reason)

    command.__doc__ = doc
    hold_app.command(name)(command)


_ending(
    model.HOLD_RELEASED,
    "release",
    "Release a hold: its files are tried again now (a destination still full holds them again).",
)
_ending(
    model.HOLD_CANCELLED, "cancel", "Cancel a hold: the files it holds fail now, with its reason."
)
