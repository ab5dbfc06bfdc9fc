"""`aso notify add|list|remove`: a user's subscription to notices (aso/agents/notifier.py):
where to be told (a mail address, a webhook, a Mattermost incoming webhook) and of what (their
holds' events, their tasks whose transfers are over).

aso/cli/__init__.py mounts `notify_app` as `aso notify`. The subscription is one document,
notify:USER in the notify database, that only its user (or an operator, `--user`) reads and
writes. A target is told only where the operator allows it (notify.user_mail and
notify.mail_domains for mail, notify.webhooks for webhooks, published to clients in the pages'
design document): `add` refuses one that would never be told.
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Any

import typer

from aso import model
from aso.cli.common import UsageError, acting_name, config_of, line_console, print_json, print_table
from aso.config import Config, NotifyConfig
from aso.core import notices
from aso.provision.designdocs import PAGES_DDOC
from aso.store import Database, Server, StoreError

console = line_console()

notify_app = typer.Typer(
    help="Your notices: where to be told (mail, webhook, Mattermost) of your holds and tasks.",
    no_args_is_help=True,
)

MailOpt = Annotated[str, typer.Option("--mail", help="A mail address.")]
WebhookOpt = Annotated[str, typer.Option("--webhook", help="A webhook's http(s) address (JSON).")]
MattermostOpt = Annotated[
    str, typer.Option("--mattermost", help="A Mattermost incoming webhook (.../hooks/TOKEN).")
]
UserOpt = Annotated[
    str,
    typer.Option("--user", "-u", help="Whose subscription (default: yours; others: operators)."),
]
EVENT_HELP = f"An event to be told of (repeatable; default: all): {', '.join(model.NOTICE_EVENTS)}."


def _target(mail: str, webhook: str, mattermost: str) -> dict[str, str]:
    given = [(k, v) for k, v in (("mail", mail), ("webhook", webhook), ("mattermost", mattermost))
             if v]  # fmt: skip
    if len(given) != 1:
        raise UsageError("give one target: --mail ADDRESS, --webhook URL or --mattermost URL")
    kind, to = given[0]
    problem = model.target_problem(kind, to)
    if problem:
        raise UsageError(problem)
    return {"kind": kind, "to": to}


def _store(ctx: typer.Context, user: str) -> tuple[Config, Database, str, str]:
    """The config, the notify database, who acts and whose subscription."""
    config = config_of(ctx)
    if user and not re.fullmatch(model.NAME_PATTERN, user):
        raise UsageError(f"{user!r} is not a user name")
    server = Server.from_config(config)
    by = acting_name(config, server)
    return config, server.db(config.store.notify_db), by, user or by


def allowances(config: Config, server: Server) -> NotifyConfig:
    """What the operator lets subscriptions name, as the store's pages publish it (this
    client's own config does not know the service's); the local config when not published."""
    try:
        design = server.db(config.store.pages_db).get(PAGES_DDOC)
    except StoreError:
        design = None
    published: dict[str, Any] | None = ((design or {}).get("aso") or {}).get("notify")
    if not published:
        return config.notify
    return NotifyConfig(
        user_mail="mailto://published" if published.get("mail") else "",
        mail_domains=list(published.get("mail_domains") or []),
        webhooks=list(published.get("webhooks") or []),
    )


def _write(db: Database, current: dict[str, Any] | None, whose: str, by: str,
           targets: list[dict[str, str]], events: list[str]) -> None:  # fmt: skip
    doc = {**(current or {"_id": model.subscription_id(whose)}), "type": model.SUBSCRIPTION_TYPE,
           "user": whose, "targets": targets, "events": events,
           "updated": round(time.time(), 3), "by": by}  # fmt: skip
    db.put(doc)


@notify_app.command("add")
def notify_add(
    ctx: typer.Context,
    mail: MailOpt = "",
    webhook: WebhookOpt = "",
    mattermost: MattermostOpt = "",
    event: Annotated[list[str] | None, typer.Option("--event", "-e", help=EVENT_HELP)] = None,
    user: UserOpt = "",
) -> None:
    """Be told at one more address (and, with --event, of these events only)."""
    target = _target(mail, webhook, mattermost)
    unknown = sorted(set(event or []) - set(model.NOTICE_EVENTS))
    if unknown:
        raise UsageError(f"{unknown[0]!r} is not an event ({', '.join(model.NOTICE_EVENTS)})")
    config, db, by, whose = _store(ctx, user)
    why = notices.refusal(target["kind"], target["to"], allowances(config, db.server))
    if why:
        raise UsageError(f"{target['to']} would never be told: {why}")
    current = db.get(model.subscription_id(whose))
    targets = list((current or {}).get("targets") or [])
    if target not in targets:
        if len(targets) >= model.MAX_TARGETS:
            raise UsageError(f"a subscription has at most {model.MAX_TARGETS} targets: "
                             "`aso notify remove` one first")  # fmt: skip
        targets.append(target)
    events = [e for e in model.NOTICE_EVENTS if e in event] if event else None
    events = events or list((current or {}).get("events") or model.NOTICE_EVENTS)
    _write(db, current, whose, by, targets, events)
    console.print(f"{whose} is told at {target['kind']} {target['to']} of: {', '.join(events)}")


@notify_app.command("remove")
def notify_remove(
    ctx: typer.Context,
    mail: MailOpt = "",
    webhook: WebhookOpt = "",
    mattermost: MattermostOpt = "",
    everything: Annotated[bool, typer.Option("--all", help="Every target.")] = False,
    user: UserOpt = "",
) -> None:
    """Be told no more at an address (--all: anywhere)."""
    target = None if everything else _target(mail, webhook, mattermost)
    _, db, by, whose = _store(ctx, user)
    current = db.get(model.subscription_id(whose))
    targets = list((current or {}).get("targets") or [])
    if target is not None and target not in targets:
        raise UsageError(f"{whose} is not told at {target['kind']} {target['to']}")
    kept = [] if target is None else [t for t in targets if t != target]
    if current is not None:
        _write(db, current, whose, by, kept, list(current.get("events") or []))
    console.print(f"{whose} is told at {len(kept)} address(es)")


@notify_app.command("list")
def notify_list(
    ctx: typer.Context,
    user: UserOpt = "",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the subscription as JSON.")
    ] = False,
) -> None:
    """Where you are told, of what, and whether the operator lets each address be told."""
    config, db, _, whose = _store(ctx, user)
    current = db.get(model.subscription_id(whose))
    allowed = allowances(config, db.server)
    targets = []
    for target in (current or {}).get("targets") or []:
        why_not = notices.refusal(target["kind"], target["to"], allowed) or ""
        targets.append({**target, "told": not why_not, "why_not": why_not})
    events = list((current or {}).get("events") or [])
    if as_json:
        print_json(console, {"user": whose, "targets": targets, "events": events})
        return
    if not targets:
        console.print(f"{whose} is told nowhere (`aso notify add` to be told)")
        return
    rows = [(t["kind"], t["to"], "yes" if t["told"] else f"no: {t['why_not']}") for t in targets]
    print_table(["kind", "address", "told"], rows)
    console.print(f"events: {', '.join(events) or 'none'}")
