"""What every `aso` sub-command module shares: the configuration of the invocation. Its own
module so that aso/cli/__init__.py and the modules it mounts (catalog, storage, ...) import it
without importing each other."""

from __future__ import annotations

import datetime as dt
import logging
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, TypeVar, cast

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from aso import config as aso_config
from aso.config import Config
from aso.store import Database

EXIT_RETRYABLE = 75  # sysexits' EX_TEMPFAIL: the store is down, full or overloaded


class UsageError(Exception):
    """Bad arguments: exit code 2."""


class NotFound(Exception):
    """What the command was asked about does not exist: exit code 1."""


def acting_name(config: Config, server: Any) -> str:
    """Who a command acts as: the account, or through the front end (x509) the name the front
    end mapped the certificate to, as the store sees it."""
    if config.store.auth == "x509":
        name: str | None = server.session().get("name")
        if not name:
            raise UsageError("the front end did not say who this certificate is")
        return name
    return config.store_user[0]


def config_of(ctx: typer.Context) -> Config:
    """The configuration, loaded on first use (so that `aso config init` needs none)."""
    obj = ctx.find_root().obj
    if "config" not in obj:
        config = aso_config.load(obj["config_file"])
        level = "DEBUG" if obj["verbose"] else config.log.level.upper()
        logging.basicConfig(
            level=getattr(logging, level),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        if not obj["verbose"]:
            # The HTTP stack's own retry warnings would repeat what our one-line errors say.
            logging.getLogger("urllib3").setLevel(logging.ERROR)
            logging.getLogger("ibm_cloud_sdk_core").setLevel(logging.ERROR)
            # gfal2 passes its plugins' protocol traces (every Davix request and answer) at
            # INFO: ~160 lines a copy drowned the worker's one line per file.
            logging.getLogger("gfal2").setLevel(logging.WARNING)
        obj["config"] = config
        if config.source is None:
            BUILT_IN_DEFAULTS.append(True)
    return cast(Config, obj["config"])


# Set when the invocation found no config file and runs on the built-in defaults: an error
# from the store then says so (a 401 alone sent people looking at their password).
BUILT_IN_DEFAULTS: list[bool] = []
NO_CONFIG_HINT = (
    "no config file was found, so the built-in defaults were used: give --config PATH or set "
    "$ASO_CONFIG (`aso config init` writes one)"
)


def utc_time(epoch: float | None) -> str:
    """An epoch time as `YYYY-MM-DD HH:MM:SS` (UTC); empty when unknown."""
    if not epoch:
        return ""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def line_console(stderr: bool = False) -> Console:
    """A console for lines of text. Rich wraps lines at the terminal's width, and off a terminal
    at 80 columns: a pipe got a long path or message cut into several lines. Soft-wrapped, a
    line is printed whole and a terminal folds it itself. Tables go through print_table."""
    return Console(stderr=stderr, soft_wrap=True)


# --- listings: --limit N, --all, and an "N more" line ------------------------------------------
DEFAULT_LIMIT = 50  # rows of a table by default: a screenful that says how many more there are
LimitOpt = Annotated[
    int | None,
    typer.Option(
        "--limit",
        min=1,
        help=f"At most this many rows (default {DEFAULT_LIMIT} in a table; with --json every "
        "row unless this is given).",
        show_default=False,
    ),
]
AllOpt = Annotated[bool, typer.Option("--all", help="Every row, however many.")]
Row = TypeVar("Row")


def row_limit(limit: int | None, show_all: bool, json_out: bool) -> int | None:
    """How many rows a listing shows (None: all). A table stops at DEFAULT_LIMIT unless told
    otherwise; JSON is for scripts, which must not be cut short by a default they never see,
    so it is whole unless --limit is given."""
    if show_all:
        return None
    if limit is not None:
        return limit
    return None if json_out else DEFAULT_LIMIT


def first_rows(rows: Sequence[Row], wanted: int | None) -> list[Row]:
    return list(rows if wanted is None else rows[:wanted])


def print_more(total: int, shown: int, json_out: bool = False) -> None:
    """The line after a listing cut short: how many rows were left out and how to see them.
    With --json it goes to stderr, so that stdout stays one JSON document."""
    if total <= shown:
        return
    line = f"{total - shown} more: --limit N, or --all"
    print(line, file=sys.stderr if json_out else sys.stdout)


# What a terminal would act on, or shows as nothing: control characters (C0, DEL, C1: escape
# sequences that clear the screen, set the clipboard, forge links), format characters (the
# marks that reorder text, zero-width ones) and line and paragraph separators: Unicode's
# categories Cc, Cf, Zl and Zp, whatever their code point.
_UNSHOWABLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def _showable(char: str) -> str:
    if unicodedata.category(char) in _UNSHOWABLE_CATEGORIES:
        return char.encode("unicode_escape").decode("ascii")
    return char


def shown(value: Any) -> str:
    """A value as a listing shows it: its text, with what a terminal would act on or show as
    nothing written as a visible escape (\\x1b, \\u202e, \\u200b). Users write the reasons,
    LFNs and names listings show (round 27: a history entry's reason cleared an operator's
    screen and set his clipboard)."""
    text = "" if value is None else str(value)
    if text.isascii() and text.isprintable():
        return text
    return "".join(_showable(char) for char in text)


def print_json(console: Console, data: Any) -> None:
    """JSON for scripts, every character beyond ASCII written as its escape (\\u009b, \\u202e):
    what users wrote reaches the terminal a script's output is read on as text (round 28: a
    reason's C1 controls and text-reordering marks went out raw through --json)."""
    console.print_json(data=data, ensure_ascii=True)


def print_table(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None
) -> None:
    """A listing: a table on a terminal; on a pipe or in a file, tab-separated lines with a
    header first (the title, if any, as a `# ` line), every value whole, so that scripts get
    what a person sees without the table's cut-off cells. Every value is `shown`, and a table's
    cells are text, never markup."""
    cells = [[shown(v) for v in row] for row in rows]
    if sys.stdout.isatty():
        table = Table(*columns, title=Text(shown(title)) if title else None)
        for row in cells:
            table.add_row(*(Text(v) for v in row))
        Console().print(table)
        return
    if title:
        print(f"# {shown(title)}")
    print("\t".join(columns))
    for row in cells:
        print("\t".join(row))


def resolve_id(db: Database, given: str) -> str:
    """The request id that `given` starts with: ids are long, listings show their start, and
    any unique start is taken wherever an id is. Raises NotFound when none matches, UsageError
    when several do."""
    if len(given) == 64:
        return given
    if len(given) < 4:
        raise UsageError(f"request id {given!r} is too short: give at least 4 characters")
    ids = [d["_id"] for d in db.all_docs(given, given + "\ufff0", limit=2)]
    if not ids:
        raise NotFound(f"no request id starts with {given!r}")
    if len(ids) > 1:
        raise UsageError(f"several request ids start with {given!r}: give more characters")
    return str(ids[0])
