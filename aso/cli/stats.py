"""`aso stats`: the daily statistics of finished transfers per link, user, destination or hour,
from the files database's live views and the statistics database's purged batches
(aso.monitoring.statistics).

aso/cli/__init__.py registers `stats_cmd` as `aso stats`.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Annotated, Any

import typer

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
from aso.monitoring import statistics
from aso.store import Server

console = line_console()


def _day(value: str | None, option: str) -> str | None:
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value).isoformat()
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a day YYYY-MM-DD", param_hint=option) from None


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def _errors(entry: dict[str, Any], top: int = 2) -> str:
    ranked = sorted(
        entry["errors"].items(), key=lambda kv: (-(kv[1]["files"] + kv[1]["attempts"]), kv[0])
    )
    return ", ".join(f"{cls} {e['files']}/{e['attempts']}" for cls, e in ranked[:top])


def stats_cmd(
    ctx: typer.Context,
    by: Annotated[
        str,
        typer.Option("--by", help="Dimension: " + ", ".join(statistics.DIMENSIONS) + "."),
    ] = "link",
    days: Annotated[
        int, typer.Option("--days", min=1, help="The last N UTC days, today included.")
    ] = 7,
    first: Annotated[
        str | None, typer.Option("--from", help="First day (YYYY-MM-DD); overrides --days.")
    ] = None,
    last: Annotated[str | None, typer.Option("--to", help="Last day (YYYY-MM-DD).")] = None,
    limit: LimitOpt = None,
    show_all: AllOpt = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """Daily statistics of finished transfers: files, bytes, failures by error class, transfer
    times; the same before and after finished requests are purged.

    The total is of every row, also of those --limit leaves out."""
    if by not in statistics.DIMENSIONS:
        raise typer.BadParameter(
            f"{by!r} is not one of {', '.join(statistics.DIMENSIONS)}", param_hint="--by"
        )
    config = _config(ctx)
    default_first, default_last = statistics.days_back(days, time.time())
    first_day = _day(first, "--from") or default_first
    last_day = _day(last, "--to") or default_last
    if first_day > last_day:
        raise typer.BadParameter(f"--from {first_day} is after --to {last_day}")
    server = Server.from_config(config)
    sources = [server.db(config.store.files_db), server.db(config.store.stats_db)]
    rows = statistics.read(sources, by, first_day, last_day)
    shown = first_rows(rows, row_limit(limit, show_all, json_out))
    if json_out:
        print(json.dumps({"by": by, "from": first_day, "to": last_day, "total": len(rows),
                          "rows": shown}, indent=2))  # fmt: skip
        print_more(len(rows), len(shown), json_out=True)
        return
    columns = ("day", by, "done", "bytes", "failed", "killed", "attempts", "failed att.",
               "mean time", "top errors (files/attempts)")  # fmt: skip
    cells = [_cells(r["day"], r["name"], r) for r in shown]
    if rows:
        whole = statistics.total(rows)
        mean = whole["time_sum"] / whole["time_count"] if whole["time_count"] else None
        merged: dict[str, dict[str, int]] = {}
        for r in rows:
            for cls, e in r["errors"].items():
                m = merged.setdefault(cls, {"files": 0, "attempts": 0})
                m["files"] += e["files"]
                m["attempts"] += e["attempts"]
        cells.append(_cells("total", "", {**whole, "time_mean": mean, "errors": merged}))
    print_table(
        columns, cells, title=f"Finished transfers by {by}, {first_day} to {last_day} (UTC)"
    )
    print_more(len(rows), len(shown))
    if not rows:
        console.print("no finished transfers in this period")


def _cells(day: str, name: str, r: dict[str, Any]) -> list[str]:
    mean = r.get("time_mean")
    return [
        day,
        name,
        str(r["files_done"]),
        _size(r["bytes_done"]),
        str(r["files_failed"]),
        str(r["files_killed"]),
        str(r["attempts"]),
        str(r["attempts_failed"]),
        "" if mean is None else f"{mean:.1f} s",
        _errors(r),
    ]
