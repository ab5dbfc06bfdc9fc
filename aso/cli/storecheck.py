"""`aso store check [URL]`: report whether a CouchDB-API store is fit for ASO
(aso/provision/store_check.py).

Exit code 0: fit (warnings allowed); 1: problems found. A store that cannot be reached or
refuses the credentials is one `aso: error:` line (aso.cli.main), nothing else.
"""

from __future__ import annotations

import sys
from typing import Annotated
from urllib.parse import unquote, urlsplit, urlunsplit

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from aso.cli.common import config_of, line_console, print_json, print_table
from aso.provision import store_check
from aso.store import Server, Settings, Unauthorized, redact

console = line_console()
STYLE = {store_check.OK: "green", store_check.WARN: "yellow", store_check.ERROR: "bold red"}
CHECK_RETRIES = 1  # a check should say "unreachable" in seconds, not after the agents' retries


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """(URL without user:password, user, password) of a URL that may carry them."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, None, None
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    bare = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return bare, unquote(parts.username), unquote(parts.password or "")


def store_check_cmd(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Argument(
            help="Store URL, may carry user:password (default: store.url of the config).",
            show_default=False,
        ),
    ] = None,
    user: Annotated[
        str | None, typer.Option(help="Account (default: the URL's, else store.admin_user).")
    ] = None,
    password: Annotated[
        str | None, typer.Option(help="Its password (prompted if --user is given alone).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the findings as JSON.")] = False,
) -> None:
    """Check a CouchDB 3 (or the embedded store) for ASO: version, settings that matter
    (auth handlers, proxy auth, sizes, JS query server), cluster membership and q/n, each ASO
    database's _security and design documents, the agent account. Exit 1 on any error."""
    config = config_of(ctx)
    bare, url_user, url_password = split_credentials(url or config.store.url)
    if user is not None:
        if password is None:
            password = typer.prompt("Password", hide_input=True)
    elif url_user is not None:
        user, password = url_user, url_password
    else:
        user, password = config.store.admin_user, config.store.admin_password
    settings = Settings.of(config.store)
    settings.retries = min(settings.retries, CHECK_RETRIES)
    server = Server(bare, user or "", password or "", settings)
    expected = store_check.expected_of(config)
    try:
        answers = store_check.gather(server, expected, config.store.agent_password)
    except Unauthorized as exc:
        who = user or "anonymous"
        raise Unauthorized(
            exc.status, exc.error, f"{redact(bare)} refused the credentials of {who}", exc.url
        ) from None
    findings = store_check.analyse(answers, expected)
    if json_out:
        print_json(console, store_check.as_json(answers, findings))
    else:
        print_findings(findings)
    raise typer.Exit(store_check.exit_code(findings))


def print_findings(findings: list[store_check.Finding]) -> None:
    """The findings: a table with each level in its colour on a terminal; elsewhere, as every
    listing, tab-separated lines with a header, each detail whole."""
    if sys.stdout.isatty():
        table = Table("", "item", "detail")
        for finding in findings:
            style = STYLE[finding.level]
            # Text, not markup: details quote ini sections such as [chttpd].
            table.add_row(Text(finding.level, style=style), Text(finding.item),
                          Text(finding.detail))  # fmt: skip
        Console().print(table)
    else:
        print_table(("level", "item", "detail"), [(f.level, f.item, f.detail) for f in findings])
    counts = {level: sum(f.level == level for f in findings) for level in store_check.LEVELS}
    verdict = "problems found" if counts[store_check.ERROR] else "fit for ASO"
    console.print(
        f"{verdict}: {counts['error']} error(s), {counts['warn']} warning(s), {counts['ok']} ok",
        highlight=False,
    )
