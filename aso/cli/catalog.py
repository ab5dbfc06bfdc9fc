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
from rich.console import Console

from aso.catalog import open_catalog
from aso.catalog.base import Catalog, CatalogError
from aso.cli.common import config_of as _config
from aso.cli.common import print_table, utc_time
from aso.config import Config

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

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


@catalog_app.command("blocks")
def catalog_blocks(ctx: typer.Context, dataset: DatasetArg, json_out: JsonOpt = False) -> None:
    """List the blocks of a dataset: name, files, size, origin site, creation time."""
    catalog, blocks = _listing(ctx, dataset, "blocks")
    if blocks is None:
        _unknown(dataset, catalog, json_out)
        return
    if json_out:
        print(json.dumps(blocks, indent=2))
        return
    rows = [
        (b["block"], b["files"], human_size(b["size"]), b["origin_site"], utc_time(b["created"]))
        for b in blocks
    ]
    print_table(("block", "files", "size", "origin site", "created (UTC)"), rows)
    total = sum(b["size"] for b in blocks)
    files = sum(b["files"] for b in blocks)
    console.print(
        f"{len(blocks)} block(s), {files} file(s), {human_size(total)} in {dataset}",
        markup=False,
        highlight=False,
    )


@catalog_app.command("ls")
def catalog_ls(ctx: typer.Context, dataset: DatasetArg, json_out: JsonOpt = False) -> None:
    """List the files of a dataset: LFN, size, events, block."""
    catalog, files = _listing(ctx, dataset, "files")
    if files is None:
        _unknown(dataset, catalog, json_out)
        return
    if json_out:
        print(json.dumps(files, indent=2))
        return
    # The dataset is the argument: the block is shown by its part after '#'.
    rows = [
        (f["lfn"], human_size(f["size"]), f["events"], "#" + f["block"].split("#", 1)[-1])
        for f in files
    ]
    print_table(("lfn", "size", "events", "block"), rows)
    blocks = len({f["block"] for f in files})
    console.print(
        f"{len(files)} file(s) in {blocks} block(s), "
        f"{human_size(sum(f['size'] for f in files))} in {dataset}",
        markup=False,
        highlight=False,
    )
