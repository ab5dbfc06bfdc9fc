"""`aso catalog ls|blocks DATASET`: what the catalog holds for a dataset.

aso/cli/__init__.py mounts `catalog_app` as `aso catalog`. The catalog is the configured one: the
embedded catalog database (`store.catalog_db`, default "aso_catalog") unless `publisher.catalog` is
"dbs", then DBS3 through the `[dbs]` section. A dataset the catalog does not know is not an
error: a message on stderr, exit 0, and an empty list with --json.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from aso.catalog import open_catalog
from aso.catalog.base import Catalog, CatalogError, CatalogStoreDown
from aso.cli.common import (
    EXIT_RETRYABLE,
    AllOpt,
    LimitOpt,
    first_rows,
    line_console,
    print_more,
    print_table,
    row_limit,
    utc_time,
)
from aso.cli.common import config_of as _config
from aso.config import Config

console = line_console()
err_console = line_console(stderr=True)

catalog_app = typer.Typer(
    help="Look at the catalog finished files are published to (embedded or DBS3).",
    no_args_is_help=True,
)


DatasetArg = Annotated[str, typer.Argument(help="Dataset name, /primary/processed/USER.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")]


def _catalog(config: Config) -> Catalog:
    """The configured catalog, read with the everyday account."""
    from aso.store import Server

    return open_catalog(config, Server.from_config(config))


def _fail(exc: CatalogError) -> typer.Exit:
    """A one-line error; the exit code of a store that is down (75, try again later) when the
    embedded catalog's store is, else 1."""
    if isinstance(exc, CatalogStoreDown):
        err_console.print(f"aso: error: {exc} (retryable: try again later)", markup=False,
                          highlight=False)  # fmt: skip
        return typer.Exit(EXIT_RETRYABLE)
    err_console.print(f"aso: error: {exc}", markup=False, highlight=False)
    return typer.Exit(1)


def _unknown(dataset: str, catalog: Catalog, json_out: bool) -> None:
    err_console.print(
        f"dataset {dataset} is not in the {catalog.name} catalog", markup=False, highlight=False
    )
    if json_out:
        print("[]")


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{size} B"


def _listing(ctx: typer.Context, dataset: str, what: str) -> tuple[Catalog, Any]:
    """(catalog, its `blocks` or `files` answer for the dataset); a CatalogError ends the
    command with a one-line error and exit code 1."""
    try:
        catalog = _catalog(_config(ctx))
    except CatalogError as exc:
        raise _fail(exc) from None
    try:
        answer = getattr(catalog, what)(dataset)
    except CatalogError as exc:
        raise _fail(exc) from None
    finally:
        catalog.close()
    return catalog, answer


def _print_json(rows: list[Any], total: int) -> None:
    """The rows as a JSON list (the catalog's own answer, whole unless --limit cut it; the
    "N more" line then goes to stderr)."""
    print(json.dumps(rows, indent=2))
    print_more(total, len(rows), json_out=True)


@catalog_app.command("blocks")
def catalog_blocks(
    ctx: typer.Context,
    dataset: DatasetArg,
    limit: LimitOpt = None,
    show_all: AllOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """List the blocks of a dataset: name, files, size, origin site, creation time."""
    catalog, blocks = _listing(ctx, dataset, "blocks")
    if blocks is None:
        _unknown(dataset, catalog, json_out)
        return
    shown = first_rows(blocks, row_limit(limit, show_all, json_out))
    if json_out:
        _print_json(shown, len(blocks))
        return
    rows = [
        (b["block"], b["files"], human_size(b["size"]), b["origin_site"], utc_time(b["created"]))
        for b in shown
    ]
    print_table(("block", "files", "size", "origin site", "created (UTC)"), rows)
    print_more(len(blocks), len(shown))
    total = sum(b["size"] for b in blocks)
    files = sum(b["files"] for b in blocks)
    console.print(
        f"{len(blocks)} block(s), {files} file(s), {human_size(total)} in {dataset}",
        markup=False,
        highlight=False,
    )


@catalog_app.command("ls")
def catalog_ls(
    ctx: typer.Context,
    dataset: DatasetArg,
    limit: LimitOpt = None,
    show_all: AllOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """List the files of a dataset: LFN, size, events, block."""
    catalog, files = _listing(ctx, dataset, "files")
    if files is None:
        _unknown(dataset, catalog, json_out)
        return
    shown = first_rows(files, row_limit(limit, show_all, json_out))
    if json_out:
        _print_json(shown, len(files))
        return
    # The dataset is the argument: the block is shown by its part after '#'.
    rows = [
        (f["lfn"], human_size(f["size"]), f["events"], "#" + f["block"].split("#", 1)[-1])
        for f in shown
    ]
    print_table(("lfn", "size", "events", "block"), rows)
    print_more(len(files), len(shown))
    blocks = len({f["block"] for f in files})
    console.print(
        f"{len(files)} file(s) in {blocks} block(s), "
        f"{human_size(sum(f['size'] for f in files))} in {dataset}",
        markup=False,
        highlight=False,
    )
