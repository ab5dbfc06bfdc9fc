"""Statistics of finished transfer requests: what one finished request counts for (one
JavaScript function, couchapp/shared/statistics/contribution.js, for the views and the purge),
the two places the statistics live, and reading them back as one.

A request counts once its copy is over (`state` done, failed or killed), dated by the UTC day
(and hour) of that end, the `at` of its last `state` transition, under four dimensions:

    link "SRC>DST" · user · destination · hour "HH" (all links: the hourly histogram)

What it counts for (the COLUMNS):

* its outcome: files_done and bytes_done, files_failed (and its error_class under `errors`,
  first of the pair) or files_killed;
* each of its attempts: attempts; done ones (attempts_done) with their transfer time (ended −
  submitted) in time_count, time_sum, a histogram (<10 s, <30 s, <60 s, <300 s, <1800 s, more)
  and the day's fastest and slowest; failed ones (attempts_failed, and their error class under
  `errors`, second of the pair).

Where the statistics live:

* **live**: the files database's design document `_design/stats` (couchapp/stats-live) maps every
  finished request still there to its contribution. A failed request its owner resubmits leaves
  the view and comes back with its new ending: the view always says what the documents say.
* **purged**: before the analytics agent deletes old finished requests it writes what they
  count for into *batch documents* of `store.stats_db` (aso.monitoring.purge has the
  exactly-once protocol). The design document `_design/stats` there (couchapp/stats) adds up the
  rows of completed batches, with the same keys as the live views.

`read` adds the two: the statistics are the same before and after a purge. Both use built-in
reduces only (`_sum`, `_stats`), which CouchDB 3 runs natively and the embedded store has too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aso import model
from aso.store import Database

SCHEMA_VERSION = 1
DDOC = "stats"
BATCH = "analytics_batch"
BATCH_PREFIX = "batch:"
PENDING, COMPLETE = "pending", "complete"
DIMENSIONS = ("link", "user", "destination", "hour")
ENDED_STATES = model.FINAL[model.STATE]

# Transfer-time histogram: upper bounds in seconds; the last bucket holds the rest.
BUCKETS = (10, 30, 60, 300, 1800)
BUCKET_NAMES = ("lt10s", "lt30s", "lt60s", "lt300s", "lt1800s", "ge1800s")
COLUMNS = (
    "files_done",
    "bytes_done",
    "files_failed",
    "files_killed",
    "attempts",
    "attempts_done",
    "attempts_failed",
    "time_count",
    "time_sum",
    *(f"time_{name}" for name in BUCKET_NAMES),
)
_COL = {name: i for i, name in enumerate(COLUMNS)}
UNKNOWN_CLASS = "unknown"

# Who may use the statistics database: every ASO role reads; agents and admins write
# (couchapp/stats/validate_doc_update.js).
SECURITY = {
    "admins": {"names": [], "roles": []},
    "members": {"names": [], "roles": [model.USER_ROLE, model.AGENT_ROLE, "aso-admin"]},
}


# --- what a finished request counts for ------------------------------------------------------
def _utc(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, dt.UTC)


def day_of(epoch: float) -> str:
    return _utc(epoch).strftime("%Y-%m-%d")


@dataclass
class Row:
    """Summable statistics: the COLUMNS, errors {class: [files, attempts]}, fastest and
    slowest done transfer."""

    values: list[float] = field(default_factory=lambda: [0] * len(COLUMNS))
    errors: dict[str, list[int]] = field(default_factory=dict)
    time_min: float | None = None
    time_max: float | None = None

    def add(self, other: Row) -> None:
        self.values = [a + b for a, b in zip(self.values, other.values, strict=True)]
        for cls, (files, attempts) in other.errors.items():
            mine = self.errors.setdefault(cls, [0, 0])
            mine[0] += files
            mine[1] += attempts
        for t in (other.time_min, other.time_max):
            if t is not None:
                self.time_min = t if self.time_min is None else min(self.time_min, t)
                self.time_max = t if self.time_max is None else max(self.time_max, t)

    def to_json(self) -> dict[str, Any]:
        return {
            "values": [_number(x) for x in self.values],
            "errors": {cls: list(pair) for cls, pair in sorted(self.errors.items())},
            "time_min": _number(self.time_min),
            "time_max": _number(self.time_max),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Row:
        return cls(
            list(data["values"]),
            {c: list(p) for c, p in data["errors"].items()},
            data["time_min"],
            data["time_max"],
        )


@dataclass
class Contribution:
    """What one finished request counts for, and under which keys."""

    ended: float
    names: dict[str, str]
    row: Row

    @property
    def day(self) -> str:
        return day_of(self.ended)

    def stat_keys(self) -> list[tuple[str, str, str]]:
        return [(by, self.day, name) for by, name in self.names.items()]

    def to_json(self) -> dict[str, Any]:
        return {"ended": self.ended, "names": self.names, **self.row.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Contribution:
        return cls(float(data["ended"]), dict(data["names"]), Row.from_json(data))


class Tally:
    """Rows keyed (dimension, day, name): what a set of contributions adds up to."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str], Row] = {}
        self.requests = 0

    def add(self, contribution: Contribution) -> None:
        for key in contribution.stat_keys():
            self.rows.setdefault(key, Row()).add(contribution.row)
        self.requests += 1

    def documents(self) -> list[dict[str, Any]]:
        return [
            {"by": by, "day": day, "name": name, **row.to_json()}
            for (by, day, name), row in sorted(self.rows.items())
        ]


def _number(x: float | None) -> Any:
    if x is None:
        return None
    x = round(float(x), 3)
    return int(x) if x.is_integer() else x


# --- reading the statistics --------------------------------------------------------------------
def days_back(days: int, now: float) -> tuple[str, str]:
    """(first, last) UTC day of the last `days` days, today included."""
    today = _utc(now).date()
    return (today - dt.timedelta(days=max(1, days) - 1)).isoformat(), today.isoformat()


def read(
    sources: Sequence[Database],
    by: str,
    first_day: str,
    last_day: str,
    freshness: str = "fresh",
) -> list[dict[str, Any]]:
    """The statistics of one dimension per (day, name) from `first_day` to `last_day`, added
    over `sources` (the files database's live views and the statistics database's): every
    COLUMNS figure by name, `errors` {class: {files, attempts}}, `time_min`, `time_max` and
    `time_mean` (seconds; None without done transfers)."""
    if by not in DIMENSIONS:
        raise ValueError(f"unknown dimension {by!r}; one of {', '.join(DIMENSIONS)}")
    start, end = [by, first_day], [by, last_day, {}]
    rows: dict[tuple[str, str], Row] = {}
    for db in sources:
        daily = db.view(
            DDOC, "daily", start_key=start, end_key=end, group_level=3, freshness=freshness
        )
        for r in daily.rows:
            _, day, name = r["key"]
            rows.setdefault((day, name), Row()).add(Row(values=_padded(r["value"])))
        errors = db.view(
            DDOC, "errors", start_key=start, end_key=end, group=True, freshness=freshness
        )
        for r in errors.rows:
            _, day, cls, name = r["key"]
            rows.setdefault((day, name), Row()).add(Row(errors={cls: _padded(r["value"], 2)}))
        times = db.view(
            DDOC, "transfer_time", start_key=start, end_key=end, group_level=3, freshness=freshness
        )
        for r in times.rows:
            _, day, name = r["key"]
            extremes = Row(time_min=r["value"]["min"], time_max=r["value"]["max"])
            rows.setdefault((day, name), Row()).add(extremes)
    return [_entry(day, name, rows[(day, name)]) for day, name in sorted(rows)]


def _entry(day: str, name: str, row: Row) -> dict[str, Any]:
    entry: dict[str, Any] = {"day": day, "name": name}
    entry.update(zip(COLUMNS, (_number(x) for x in row.values), strict=True))
    entry["errors"] = {
        cls: {"files": files, "attempts": attempts}
        for cls, (files, attempts) in sorted(row.errors.items())
    }
    entry["time_min"], entry["time_max"] = _number(row.time_min), _number(row.time_max)
    count = entry["time_count"]
    entry["time_mean"] = _number(row.values[_COL["time_sum"]] / count) if count else None
    return entry


def _padded(value: Any, n: int = len(COLUMNS)) -> list[Any]:
    values = list(value) if isinstance(value, list) else [value]
    return (values + [0] * n)[:n]


def total(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = COLUMNS) -> dict[str, Any]:
    """Column sums over rows of `read` (a whole day, or the whole period)."""
    return {c: _number(sum(r[c] for r in rows)) for c in columns}
