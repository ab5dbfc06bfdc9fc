"""Statistics of finished transfer requests: what one finished request counts for (a pure
function, in Python and in JavaScript for the views), the two places the statistics live, and
reading them back as one.

A request counts once its copy is over (`state` done, failed or killed), dated by the UTC day
(and hour) of that end, the `at` of its last `state` transition, under four dimensions:

    link "SRC>DST" · user · destination · hour "HH" (all links: the hourly histogram)

What it counts for (the COLUMNS; `counts` in Python, CONTRIBUTION_JS in the views):

* its outcome: files_done and bytes_done, files_failed (and its error_class under `errors`,
  first of the pair) or files_killed;
* each of its attempts: attempts; done ones (attempts_done) with their transfer time (ended −
  submitted) in time_count, time_sum, a histogram (<10 s, <30 s, <60 s, <300 s, <1800 s, more)
  and the day's fastest and slowest; failed ones (attempts_failed, and their error class under
  `errors`, second of the pair).

Where the statistics live:

* **live**: the files database's design document `_design/stats` (LIVE_DESIGN) maps every
  finished request still there to its contribution. A failed request its owner resubmits leaves
  the view and comes back with its new ending: the view always says what the documents say.
* **purged**: before the analytics agent deletes old finished requests it writes what they
  count for into *batch documents* of `store.stats_db` (aso.monitoring.purge has the exactly-once
  protocol). The design document `_design/stats` there (DESIGN) adds up the rows of completed
  batches, with the same keys as the live views.

`read` adds the two: the statistics are the same before and after a purge. Both use built-in
reduces only (`_sum`, `_stats`), which CouchDB 3 runs natively and the embedded store has too.
"""

from __future__ import annotations

import datetime as dt
import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aso import model
from aso.monitoring import summaries
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
# (validate_doc_update of DESIGN).
SECURITY = {
    "admins": {"names": [], "roles": []},
    "members": {"names": [], "roles": [model.USER_ROLE, model.AGENT_ROLE, "aso-admin"]},
}


# --- what a finished request counts for ------------------------------------------------------
def ended_at(doc: Mapping[str, Any]) -> float:
    """When the request's copy ended: the `at` of its last `state` transition."""
    for h in reversed(doc.get("history") or []):
        if h.get("axis") == model.STATE:
            return float(h["at"])
    return float(doc.get("last_update", 0))


def _utc(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, dt.UTC)


def day_of(epoch: float) -> str:
    return _utc(epoch).strftime("%Y-%m-%d")


def bucket(seconds: float) -> int:
    for i, bound in enumerate(BUCKETS):
        if seconds < bound:
            return i
    return len(BUCKETS)


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


def counts(doc: Mapping[str, Any]) -> Contribution | None:
    """What a request counts for; None while its copy is not over. CONTRIBUTION_JS is the same
    function for the views (tests/test_analytics.py holds them to it)."""
    if doc.get("type") != model.REQUEST_TYPE or doc.get(model.STATE) not in ENDED_STATES:
        return None
    row = Row()
    v = row.values

    def error(cls: str | None, which: int) -> None:
        row.errors.setdefault(cls or UNKNOWN_CLASS, [0, 0])[which] += 1

    state = doc[model.STATE]
    if state == "done":
        v[_COL["files_done"]] += 1
        v[_COL["bytes_done"]] += int(doc["size"])
    elif state == "failed":
        v[_COL["files_failed"]] += 1
        error(doc.get("error_class"), 0)
    else:
        v[_COL["files_killed"]] += 1
    for attempt in doc.get("attempts") or []:
        v[_COL["attempts"]] += 1
        if attempt.get("outcome") == "done":
            v[_COL["attempts_done"]] += 1
            if attempt.get("ended") is not None:
                seconds = max(0.0, float(attempt["ended"]) - float(attempt["submitted"]))
                v[_COL["time_count"]] += 1
                v[_COL["time_sum"]] += seconds
                v[_COL["time_" + BUCKET_NAMES[bucket(seconds)]]] += 1
                row.time_min = seconds if row.time_min is None else min(row.time_min, seconds)
                row.time_max = seconds if row.time_max is None else max(row.time_max, seconds)
        elif attempt.get("outcome") == "failed":
            v[_COL["attempts_failed"]] += 1
            error(attempt.get("error_class"), 1)
    ended = ended_at(doc)
    names = {
        "link": f"{doc['source']}>{doc['destination']}",
        "user": doc["user"],
        "destination": doc["destination"],
        "hour": _utc(ended).strftime("%H"),
    }
    return Contribution(ended, names, row)


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


# --- the views ---------------------------------------------------------------------------------
def _js(template: str, **values: Any) -> str:
    """JavaScript from a template whose $names become the JSON of `values`."""
    return string.Template(template).substitute({k: json.dumps(v) for k, v in values.items()})


CONTRIBUTION_JS = _js(
    """
function contribution(doc) {
  var ENDED = $ended, COL = $columns, BUCKETS = $buckets, NAMES = $bucket_names;
  if (doc.type !== $request_type || ENDED.indexOf(doc.state) === -1) { return null; }
  var v = [], errors = {}, tmin = null, tmax = null, i;
  for (i = 0; i < COL.length; i++) { v.push(0); }
  function col(name) { return COL.indexOf(name); }
  function error(cls, which) {
    cls = cls || $unknown;
    if (!errors.hasOwnProperty(cls)) { errors[cls] = [0, 0]; }
    errors[cls][which] += 1;
  }
  if (doc.state === 'done') { v[col('files_done')] += 1; v[col('bytes_done')] += doc.size; }
  else if (doc.state === 'failed') { v[col('files_failed')] += 1; error(doc.error_class, 0); }
  else { v[col('files_killed')] += 1; }
  var attempts = doc.attempts || [];
  for (i = 0; i < attempts.length; i++) {
    var a = attempts[i];
    v[col('attempts')] += 1;
    if (a.outcome === 'done') {
      v[col('attempts_done')] += 1;
      if (a.ended !== null && a.ended !== undefined) {
        var s = Math.max(0, a.ended - a.submitted), b = 0;
        while (b < BUCKETS.length && s >= BUCKETS[b]) { b++; }
        v[col('time_count')] += 1;
        v[col('time_sum')] += s;
        v[col('time_' + NAMES[b])] += 1;
        tmin = tmin === null ? s : Math.min(tmin, s);
        tmax = tmax === null ? s : Math.max(tmax, s);
      }
    } else if (a.outcome === 'failed') {
      v[col('attempts_failed')] += 1;
      error(a.error_class, 1);
    }
  }
  var ended = doc.last_update, h = doc.history || [];
  for (i = h.length - 1; i >= 0; i--) { if (h[i].axis === 'state') { ended = h[i].at; break; } }
  var iso = new Date(ended * 1000).toISOString();
  return {day: iso.slice(0, 10), values: v, errors: errors, time_min: tmin, time_max: tmax,
          names: {link: doc.source + '>' + doc.destination, user: doc.user,
                  destination: doc.destination, hour: iso.slice(11, 13)}};
}
""",
    ended=list(ENDED_STATES),
    columns=list(COLUMNS),
    buckets=list(BUCKETS),
    bucket_names=list(BUCKET_NAMES),
    request_type=model.REQUEST_TYPE,
    unknown=UNKNOWN_CLASS,
)

# The three statistics views, as emit statements over a row `r` with r.by, r.day, r.name.
_EMITS = {
    "daily": "emit([r.by, r.day, r.name], r.values);",
    "errors": "for (var cls in r.errors) { if (r.errors.hasOwnProperty(cls)) { "
    "emit([r.by, r.day, cls, r.name], r.errors[cls]); } }",
    "transfer_time": "if (r.time_min !== null) { emit([r.by, r.day, r.name], r.time_min); "
    "emit([r.by, r.day, r.name], r.time_max); }",
}
_REDUCES = {"daily": "_sum", "errors": "_sum", "transfer_time": "_stats"}


def _live_map(emit: str) -> str:
    return (
        "function (doc) {"
        + CONTRIBUTION_JS
        + "var got = contribution(doc); if (got === null) { return; } "
        "for (var by in got.names) { if (got.names.hasOwnProperty(by)) { "
        "var r = {by: by, day: got.day, name: got.names[by], values: got.values, "
        "errors: got.errors, time_min: got.time_min, time_max: got.time_max}; " + emit + " } } }"
    )


def _batch_map(emit: str) -> str:
    return (
        _js(
            "function (doc) { if (doc.type !== $batch || doc.status !== $complete) { return; } "
            "for (var i = 0; i < doc.rows.length; i++) { var r = doc.rows[i]; ",
            batch=BATCH,
            complete=COMPLETE,
        )
        + emit
        + " } }"
    )


# Finished requests (nothing more will happen to them: model.is_final) by last change: what the
# analytics agent may purge.
PURGEABLE_MAP = _js(
    "function (doc) { var FINAL = $final; if (doc.type !== $request_type) { return; } "
    "if (doc.state === 'failed' || doc.state === 'killed' || "
    "(FINAL.state.indexOf(doc.state) !== -1 && FINAL.cleanup.indexOf(doc.cleanup) !== -1 && "
    "FINAL.publication.indexOf(doc.publication) !== -1)) { emit(doc.last_update, null); } }",
    final={axis: list(values) for axis, values in model.FINAL.items()},
    request_type=model.REQUEST_TYPE,
)

# `_design/stats` of the files database: the live statistics and the purge candidates.
LIVE_DESIGN: dict[str, Any] = {
    "_id": f"_design/{DDOC}",
    "language": "javascript",
    "views": {
        **{
            name: {"map": _live_map(emit), "reduce": _REDUCES[name]}
            for name, emit in _EMITS.items()
        },
        "purgeable": {"map": PURGEABLE_MAP},
    },
}

VALIDATE = r"""function (newDoc, oldDoc, userCtx, secObj) {
  var roles = userCtx.roles || [];
  function has(role) { return roles.indexOf(role) !== -1; }
  function refuse(rule, why) { throw({forbidden: '[' + rule + '] ' + why}); }
  if (has('_admin') || has('aso-admin')) { return; }
  // EMBEDDED_VALIDATES_BEFORE_CONFLICT: a write based on another revision than
  // the current one is a conflict, refused here as one (the embedded store asks before it looks).
  var live = oldDoc && !oldDoc._deleted, rev = newDoc._rev;
  if (!(oldDoc ? rev === oldDoc._rev || (!live && rev === undefined) : rev === undefined)) {
    refuse('conflict', 'the write is based on another revision than the current one');
  }
  if (!has('aso-agent')) { refuse('stats', 'only agents and admins write statistics'); }
  if (newDoc._deleted) { refuse('stats', 'agents never delete statistics'); }
  if (newDoc._id === 'lease:purge') {
    if (newDoc.type !== 'analytics_lease' || typeof newDoc.holder !== 'string' ||
        typeof newDoc.until !== 'number') {
      refuse('schema', 'the purge lease has type analytics_lease, holder and until');
    }
    return;
  }
  if (newDoc._id.indexOf('monitor:') === 0) {
    // The monitoring summaries (aso/monitoring/summaries.py): recomputed, rewritten as they come.
    if ($monitor_types.indexOf(newDoc.type) < 0) {
      refuse('schema', 'monitor: documents have one of the types ' + $monitor_types.join(', '));
    }
    return;
  }
  if (newDoc.type !== 'analytics_batch' || newDoc._id.indexOf('batch:') !== 0) {
    refuse('schema', 'statistics documents are analytics_batch documents with ids batch:...');
  }
  if (newDoc.status !== 'pending' && newDoc.status !== 'complete') {
    refuse('schema', 'a batch is pending or complete');
  }
  if (!Array.isArray(newDoc.rows) || typeof newDoc.requests !== 'object') {
    refuse('schema', 'a batch document needs rows and requests');
  }
  if (oldDoc && oldDoc.status === 'complete') {
    refuse('immutable', 'a complete batch never changes: its requests are counted');
  }
  if (!oldDoc && newDoc.status !== 'pending') {
    refuse('schema', 'a batch is written pending first, before its requests are deleted');
  }
}"""

# `_design/stats` of the statistics database.
DESIGN: dict[str, Any] = {
    "_id": f"_design/{DDOC}",
    "language": "javascript",
    "validate_doc_update": VALIDATE.replace("$monitor_types", json.dumps(list(summaries.TYPES))),
    "views": {
        **{
            name: {"map": _batch_map(emit), "reduce": _REDUCES[name]}
            for name, emit in _EMITS.items()
        },
        "pending": {
            "map": _js(
                "function (doc) { if (doc.type === $batch && doc.status === $pending) "
                "{ emit(doc.written, null); } }",
                batch=BATCH,
                pending=PENDING,
            )
        },
    },
}


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
