"""`aso reconcile [--fix] [--json] [--kind KIND ...]`: where the documents, the storage and the
catalog disagree (aso.reconcile), and with --fix, the repairs.

aso/cli/__init__.py registers `reconcile_cmd` as `aso reconcile`. Reads use the everyday
account; repairs an agent could make are written with the agent account (the store checks them
against the agents' transitions), the others need the everyday account to be an operator
(aso-admin or a server admin). Exit code 0 when everything agrees (or, with --fix, when every
finding was repaired), 1 when something disagrees or could not be checked.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

import typer

from aso import model, reconcile
from aso.cli.common import (
    AllOpt,
    LimitOpt,
    first_rows,
    line_console,
    print_more,
    print_table,
    row_limit,
)
from aso.cli.common import config_of as _config
from aso.config import Config

console = line_console()
err_console = line_console(stderr=True)

TITLES = {
    reconcile.STUCK: "Stuck requests",
    reconcile.ORPHAN_TEMP: "Orphan temporary files",
    reconcile.LEFTOVER_TEMP: "Temporary files left after cleanup",
    reconcile.DESTINATION_MISSING: "Destination files missing",
    reconcile.DESTINATION_MISMATCH: "Destination files with a wrong size or adler32",
    reconcile.CATALOG_MISSING: "Published files their block does not hold",
    reconcile.CATALOG_EXTRA: "Catalog files whose request is not published",
}


def _print(text: str, **kwargs: Any) -> None:
    console.print(text, markup=False, highlight=False, **kwargs)


def reconcile_cmd(
    ctx: typer.Context,
    fix: Annotated[
        bool, typer.Option("--fix", help="Make the repairs the findings propose.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    kind: Annotated[
        list[str] | None,
        typer.Option(
            "--kind",
            help="Only this kind of check (repeatable): " + ", ".join(reconcile.KINDS) + ".",
            show_default=False,
        ),
    ] = None,
    limit: LimitOpt = None,
    show_all: AllOpt = False,
) -> None:
    """Compare documents, storage and catalog; report (and with --fix repair) what disagrees.

    Each kind's table shows at most --limit findings (--fix repairs them all)."""
    unknown = sorted(set(kind or ()) - set(reconcile.KINDS))
    if unknown:
        raise typer.BadParameter(
            f"unknown kind {', '.join(unknown)}; one of {', '.join(reconcile.KINDS)}",
            param_hint="--kind",
        )
    from aso.catalog import open_catalog
    from aso.catalog.base import CatalogError
    from aso.files import open_files
    from aso.store import Server

    config = _config(ctx)
    server = Server.from_config(config)
    db = server.db(config.store.files_db)
    try:
        catalog = open_catalog(config, server)
    except CatalogError as exc:
        err_console.print(f"aso: catalog not opened, its checks are skipped: {exc}", markup=False)
        catalog = None
    files = open_files(config)
    try:
        report = reconcile.reconcile(config, db, catalog=catalog, files=files, kinds=kind)
        outcomes = _fix(config, server, files, report) if fix and report.findings else []
    finally:
        if catalog is not None:
            catalog.close()
    wanted = row_limit(limit, show_all, json_out)
    if json_out:
        findings = first_rows(report.findings, wanted)
        print(
            json.dumps(
                {
                    "total": len(report.findings),
                    "findings": [f.as_dict() for f in findings],
                    "orphans_by_user": [
                        dataclasses.asdict(u) for u in reconcile.orphans_by_user(report.findings)
                    ],
                    "errors": report.errors,
                    "checked": report.checked,
                    "seconds": report.seconds,
                    "fixes": [o.as_dict() for o in outcomes] if fix else None,
                },
                indent=2,
            )
        )
        print_more(len(report.findings), len(findings), json_out=True)
    else:
        _show(report, outcomes, fix, wanted)
    repaired = {id(o.finding) for o in outcomes if o.repaired}
    left = [f for f in report.findings if id(f) not in repaired]
    if left or report.errors:
        raise typer.Exit(1)


def _fix(config: Config, server: Any, files: Any, report: reconcile.Report) -> list[Any]:
    from aso.store import Server, StoreError

    admin_db = None
    try:
        roles = server.session().get("roles") or []
    except StoreError:
        roles = []
    if any(role in roles for role in model.ADMIN_ROLES):
        admin_db = server.db(config.store.files_db)
    agent_db = None
    agent_server = None
    if config.store.agent_user and config.store.agent_password:
        agent_server = Server.from_config(config, account="agent")
        agent_db = agent_server.db(config.store.files_db)

    def service() -> Any:
        from aso.transfer import open_service

        return open_service(config, agent_server or server)

    fixer = reconcile.Fixer(
        config,
        files,
        agent_db,
        admin_db or (None if agent_db else server.db(config.store.files_db)),
        service=service,
        by=f"reconciler:{server.user or 'anonymous'}"[:200],
    )
    try:
        return fixer.apply(report.findings)
    finally:
        fixer.close()


def _show_orphans(users: list[reconcile.UserOrphans]) -> None:
    """Each user's orphan temporary files: count, bytes, the oldest's age."""
    if not users:
        return
    rows = [(u.user, str(u.files), str(u.bytes), reconcile.age_text(u.oldest)) for u in users]
    print_table(("user", "files", "bytes", "oldest"), rows, title="Orphan temporary files by user")


def _show(report: reconcile.Report, outcomes: list[Any], fixed: bool, wanted: int | None) -> None:
    results = {id(o.finding): o for o in outcomes}
    for kind, findings in report.by_kind().items():
        rows = []
        for f in first_rows(findings, wanted):
            if f.repair is None:
                repair = "LOST: report only" if f.lost else "report only"
            elif not fixed:
                repair = f.repair.text
            else:
                outcome = results.get(id(f))
                repair = (
                    "not tried"
                    if outcome is None
                    else ("done: " if outcome.repaired else "NOT done: ") + outcome.text
                )
            subject = f.request_id or f.block or ""
            rows.append((subject, f.path or "", f.site or "", f.detail, repair))
        columns = ("request / block", "path", "site", "detail",
                   "repair: outcome" if fixed else "repair")  # fmt: skip
        print_table(columns, rows, title=f"{TITLES.get(kind, kind)} ({len(findings)})")
        print_more(len(findings), len(rows))
    _show_orphans(reconcile.orphans_by_user(report.findings))
    for error in report.errors:
        err_console.print(f"not checked: {error}", markup=False, highlight=False)
    checked = ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in report.checked.items())
    counts = report.counts()
    if not report.findings:
        _print(f"all agree ({checked}; {report.seconds:.1f} s)")
        return
    lost = sum(1 for f in report.findings if f.lost)
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    _print(
        f"{len(report.findings)} disagreement(s): {summary}"
        + (f"; {lost} file(s) LOST" if lost else "")
        + f" ({checked}; {report.seconds:.1f} s)"
    )
    if fixed:
        done = sum(1 for o in outcomes if o.repaired)
        _print(f"repaired {done} of {len(report.findings)}; {len(outcomes) - done} not repaired")
