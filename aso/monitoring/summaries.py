"""Monitoring summaries: what happened to the requests, hour by hour, in a few small documents
of the statistics database (`monitor:*`), so that the monitoring pages load in constant time
whatever the files database holds and keep their history after the purge.

Events (a request's history entries, its creation, its failed attempts) are counted in the
UTC hour they happened in (`Tally`); the `Aggregator` (the analytics agent's, one at a time)
follows the files database's `_changes` feed, closes each hour once no write can still carry
an event of it, and counts every event exactly once across restarts and crashes. What each
document holds: docs/monitoring.md ("Monitoring summaries") and docs/summaries.schema.json.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aso import limits, metrics, model
from aso.store import Conflict, Database

log = logging.getLogger("aso.monitor")

HOUR = 3600.0
DAY = 86400.0
HOUR_PREFIX = "monitor:hour:"
TASKS_PREFIX = "monitor:tasks:"
DAY_PREFIX = "monitor:day:"
# Each hour's and day's links and failures, in documents of their own: only the links and
# errors pages read them (the overview's long windows would read megabytes otherwise).
LINK_HOUR_PREFIX = "monitor:linkhour:"
LINK_DAY_PREFIX = "monitor:linkday:"
STATE_ID = "monitor:state"
LIVE_ID = "monitor:live"
LIVE_LINKS_ID = "monitor:live:links"
LIVE_USERS_ID = "monitor:live:users"
TYPES = (
    "monitor_hour",
    "monitor_tasks",
    "monitor_links",
    "monitor_day",
    "monitor_state",
    "monitor_live",
)
RECENT = 24 * 3600.0  # the live document lists the tasks active in the last 24 hours
# Users name their tasks, as many as they like (30,000 tasks active in a day made
# `monitor:live` too large for CouchDB, 413 every cycle, and the pages' live figures stale for
# everyone): a summary document lists at most TASKS_CAP tasks in full (~300 B each), each
# user's USER_TASKS latest first (their page), and folds the rest into counted totals per user
# (OTHER_TASKS: user → {"tasks": tasks folded, "created"/"axis:to": files}).
TASKS_CAP = 1000
USER_TASKS = 20
OTHER_TASKS = "tasks_other"
USER_KEY = "user:"  # a task's "user:NAME" → events: whose task it is
# The first run over an existing store holds every hour in memory until the whole feed is read;
# thousands of tasks an hour over months would not fit: it records tasks of its last week only.
FIRST_RUN_TASKS = 7 * 86400.0
ATTEMPT = "attempt"  # the pseudo-axis of failed attempts in events
USER_BYTES_DONE = "bytes_done"  # in `users`, beside the states: the bytes of the files done
# What the overview calls the backlog: files on their way (the pages read the same list from
# the design document).
BACKLOG = model.ON_ITS_WAY

# An event: (at, axis, from, to); for a failed attempt (ended, "attempt", the reason's pattern,
# error class).
Event = tuple[float, str, str | None, str]
SAMPLES = 3  # request ids kept per error message pattern and hour

# What varies between failures of one cause: URLs, paths, ids, counts. The errors page groups
# reasons by what is left (`error_pattern`).
_VARYING = (
    (re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I), "<url>"),
    (re.compile(r"(?<![\w.])/[^\s,;:'\"]+"), "<path>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<id>"),
    (re.compile(r"\b(?=[0-9a-f]*[0-9])[0-9a-f]{8,}\b", re.I), "<id>"),
    (re.compile(r"\b\d+(\.\d+)?\s*(s|ms|seconds|bytes|B|kB|MB|GB)\b"), "<n> \\2"),
    (re.compile(r"\b\d{4,}\b"), "<n>"),
)
PATTERN_CHARS = 200


def error_pattern(reason: str | None) -> str:
    """A failure's reason with what varies between failures of one cause replaced by
    placeholders: 'connection refused by /store/a/1.root at 10:22' and '... /store/b/2.root'
    are one pattern."""
    text = " ".join((reason or "").split())
    for pattern, placeholder in _VARYING:
        text = pattern.sub(placeholder, text)
    return text[:PATTERN_CHARS] or "(no reason given)"


@dataclass(frozen=True)
class Meta:
    """What an event of a request is counted under."""

    size: int
    link: str
    user: str
    task: str
    doc_id: str = ""
    # (ended, seconds) of each attempt that copied the file (outcome done, with an end).
    copies: tuple[tuple[float, float], ...] = ()

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> Meta:
        return cls(
            int(doc.get("size") or 0),
            f"{doc.get('source')}>{doc.get('destination')}",
            str(doc.get("user")),
            str(doc.get("task")),
            str(doc.get("_id") or ""),
            copies_of(doc),
        )

    def copy_seconds(self, at: float) -> float:
        """How long the copy that made the file `done` at `at` took: the done attempt that
        ended nearest to `at` (the monitor records the end the service reports, then the
        change); 0 when no attempt records one."""
        if not self.copies:
            return 0.0
        return min(self.copies, key=lambda c: abs(c[0] - at))[1]


def copies_of(doc: Mapping[str, Any]) -> tuple[tuple[float, float], ...]:
    """(ended, seconds from `submitted` to `ended`) of each attempt of `doc` that copied it."""
    return tuple(
        (float(a["ended"]), max(0.0, float(a["ended"]) - float(a["submitted"])))
        for a in doc.get("attempts") or []
        if a.get("outcome") == "done" and a.get("ended") is not None and a.get("submitted")
    )


def _initial(doc: Mapping[str, Any], axis: str) -> str | None:
    """The state `axis` was created in: the `from` of its first change, else its state now."""
    for h in doc.get("history") or []:
        if h.get("axis") == axis:
            return h.get("from") or doc.get(axis)
    return doc.get(axis)


def events_of(doc: Mapping[str, Any]) -> list[Event]:
    """Every event of a request (see the module's docstring)."""
    out: list[Event] = []
    for h in doc.get("history") or []:
        at = float(h["at"])
        out.append((at, h["axis"], h.get("from"), h["to"]))
        if h.get("from") is None and h["axis"] == model.STATE:
            # Creation: the other axes start in a state no history entry records.
            for axis in (model.CLEANUP, model.PUBLICATION):
                initial = _initial(doc, axis)
                if initial:
                    out.append((at, axis, None, initial))
    for attempt in doc.get("attempts") or []:
        if attempt.get("outcome") == "failed" and attempt.get("ended") is not None:
            cls = attempt.get("error_class") or "unknown"
            reason = error_pattern(attempt.get("reason"))
            out.append((float(attempt["ended"]), ATTEMPT, reason, cls))
    return out


def hour_start(at: float) -> float:
    return (at // HOUR) * HOUR


def hour_name(start: float) -> str:
    return dt.datetime.fromtimestamp(start, dt.UTC).strftime("%Y-%m-%dT%H")


def day_name(start: float) -> str:
    return dt.datetime.fromtimestamp(start, dt.UTC).strftime("%Y-%m-%d")


def _bump(table: dict[str, dict[str, int]], outer: str, inner: str, n: int) -> None:
    row = table.setdefault(outer, {})
    row[inner] = row.get(inner, 0) + n
    if not row[inner]:
        del row[inner]
        if not row:
            del table[outer]


@dataclass
class Tally:
    """Summable counts of events (see the module's docstring)."""

    moves: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    links: dict[str, dict[str, int]] = field(default_factory=dict)
    users: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: dict[str, dict[str, int]] = field(default_factory=dict)
    tasks: dict[str, dict[str, int]] = field(default_factory=dict)
    link_hours: dict[str, list[float]] = field(default_factory=dict)
    failures: dict[str, dict[str, dict[str, list[Any]]]] = field(default_factory=dict)

    def count(
        self, event: Event, meta: Meta, *, moves: bool = True, dims: bool = True, tasks: bool = True
    ) -> None:
        """Count one event; or only its moves, or only its links, users and errors (an hour's
        own tally needs only its moves and tasks: thousands of hours of links would not fit)."""
        at, axis, frm, to = event
        if axis == ATTEMPT:
            if dims:
                _bump(self.errors, meta.link, to, 1)
            if moves:  # an hour's own: which link failed, how, and which files
                self.link_hours.setdefault(meta.link, [0, 0, 0, 0.0])[2] += 1
                merge_failure(
                    self.failures.setdefault(meta.link, {}).setdefault(to, {}),
                    frm or "",
                    [1, at, at, [meta.doc_id] if meta.doc_id else []],
                )
            return
        if moves:
            move = self.moves.setdefault(axis, {}).setdefault(f"{frm or ''}>{to}", [0, 0])
            move[0] += 1
            move[1] += meta.size
            if axis == model.STATE and to == "done" and frm:  # a copy (created done: none)
                done = self.link_hours.setdefault(meta.link, [0, 0, 0, 0.0])
                done[0] += 1
                done[1] += meta.size
                done[3] += meta.copy_seconds(at)
        if axis == model.STATE and dims:
            _bump(self.links, meta.link, to, 1)
            _bump(self.users, meta.user, to, 1)
            if frm:
                _bump(self.links, meta.link, frm, -1)
                _bump(self.users, meta.user, frm, -1)
            # What each user has copied: the bytes of their files done (a quota's figure).
            if to == "done":
                _bump(self.users, meta.user, USER_BYTES_DONE, meta.size)
            if frm == "done":
                _bump(self.users, meta.user, USER_BYTES_DONE, -meta.size)
        if tasks and moves:
            created = axis == model.STATE and frm is None
            _bump(self.tasks, meta.task, "created" if created else f"{axis}:{to}", 1)
            # Whose task it is (a user's page lists their tasks): summable like the rest.
            _bump(self.tasks, meta.task, f"user:{meta.user}", 1)

    def add(self, other: Tally, *, tasks: bool = True) -> None:
        for axis, moves in other.moves.items():
            mine = self.moves.setdefault(axis, {})
            for name, (files, size) in moves.items():
                move = mine.setdefault(name, [0, 0])
                move[0] += files
                move[1] += size
        for table, theirs in (
            (self.links, other.links),
            (self.users, other.users),
            (self.errors, other.errors),
            *(((self.tasks, other.tasks),) if tasks else ()),
        ):
            for outer, row in theirs.items():
                for inner, n in row.items():
                    _bump(table, outer, inner, n)
        if not tasks:  # the per-hour detail is summed over hours and days, never cumulated
            return
        for link, figures in other.link_hours.items():
            mine_link = self.link_hours.setdefault(link, [0, 0, 0, 0.0])
            for i, n in enumerate(figures):
                mine_link[i] += n
        for link, classes in other.failures.items():
            for cls, patterns in classes.items():
                into = self.failures.setdefault(link, {}).setdefault(cls, {})
                for pattern, entry in patterns.items():
                    merge_failure(into, pattern, entry)

    def totals(self) -> dict[str, dict[str, int]]:
        """Files per state of each axis: every move adds one to its `to` and takes one from its
        `from`."""
        out: dict[str, dict[str, int]] = {}
        for axis, moves in self.moves.items():
            states: dict[str, int] = defaultdict(int)
            for name, (files, _) in moves.items():
                frm, to = name.split(">")
                states[to] += files
                if frm:
                    states[frm] -= files
            out[axis] = {s: n for s, n in sorted(states.items()) if n}
        return out

    def to_json(self, *, tasks: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "moves": self.moves,
            "links": self.links,
            "users": self.users,
            "errors": self.errors,
        }
        if tasks:
            out["tasks"] = self.tasks
            out["link_hours"] = self.link_hours
            out["failures"] = self.failures
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Tally:
        tally = cls()
        tally.add(
            cls(
                moves={a: {k: list(v) for k, v in m.items()} for a, m in data["moves"].items()},
                links=dict(data.get("links", {})),
                users=dict(data.get("users", {})),
                errors=dict(data.get("errors", {})),
                tasks=dict(data.get("tasks", {})),
                link_hours=dict(data.get("link_hours", {})),
                failures=dict(data.get("failures", {})),
            )
        )
        return tally


TaskRows = dict[str, dict[str, int]]  # task (or user, folded) → "created"/"axis:to" → files


def task_user(row: Mapping[str, int]) -> str:
    """Whose task it is: the user with the most of its events ("" if none is recorded)."""
    users = {k[len(USER_KEY) :]: n for k, n in row.items() if k.startswith(USER_KEY)}
    return max(sorted(users), key=lambda u: users[u], default="")


def task_size(row: Mapping[str, int]) -> int:
    return sum(n for k, n in row.items() if not k.startswith(USER_KEY))


def fold_tasks(
    tasks: TaskRows, last_seen: Mapping[str, float] | None = None
) -> tuple[TaskRows, TaskRows]:
    """(the tasks listed in full, the rest folded by user): at most TASKS_CAP tasks, the latest
    active first (`last_seen`: task → start of its last hour), then the largest; each user's
    USER_TASKS first of theirs before anyone's others."""
    seen = last_seen or {}
    order = sorted(tasks, key=lambda t: (-seen.get(t, 0.0), -task_size(tasks[t]), t))
    per_user: dict[str, int] = defaultdict(int)
    first: list[str] = []
    rest: list[str] = []
    for task in order:
        user = task_user(tasks[task])
        per_user[user] += 1
        (first if per_user[user] <= USER_TASKS else rest).append(task)
    kept = set((first + rest)[:TASKS_CAP])
    other: TaskRows = {}
    for task in order:
        if task not in kept:
            fold_into(other, task_user(tasks[task]), {"tasks": 1, **tasks[task]})
    return {t: tasks[t] for t in order if t in kept}, other


def fold_into(other: TaskRows, user: str, row: Mapping[str, int]) -> None:
    """Add a folded row (its "tasks" count and its files) to `user`'s totals of `other`."""
    mine = other.setdefault(user, {})
    for key, n in row.items():
        if not key.startswith(USER_KEY):
            mine[key] = mine.get(key, 0) + n


def merge_other(into: TaskRows, other: Mapping[str, Mapping[str, int]]) -> None:
    for user, row in other.items():
        fold_into(into, user, row)


def merge_failure(into: dict[str, list[Any]], pattern: str, entry: list[Any]) -> None:
    """Add `entry` ([failed attempts, first seen, last seen, request ids]) to `into`'s entry of
    `pattern`: counts add up, the first and last seen widen, up to SAMPLES ids are kept."""
    mine = into.get(pattern)
    if mine is None:
        into[pattern] = [entry[0], entry[1], entry[2], list(entry[3][:SAMPLES])]
        return
    mine[0] += entry[0]
    mine[1] = min(mine[1], entry[1])
    mine[2] = max(mine[2], entry[2])
    for doc_id in entry[3]:
        if len(mine[3]) >= SAMPLES:
            break
        if doc_id not in mine[3]:
            mine[3].append(doc_id)


def backlog(totals: Mapping[str, Mapping[str, int]]) -> int:
    return sum(totals.get(model.STATE, {}).get(s, 0) for s in BACKLOG)


@dataclass
class StepReport:
    read: int = 0  # requests taken from the feed
    closed: list[str] = field(default_factory=list)  # hours closed
    days: list[str] = field(default_factory=list)  # days closed
    pending: int = 0  # requests with events in the open hours
    backfilled: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "monitor_read": self.read,
            "monitor_closed": len(self.closed),
            "monitor_pending": self.pending,
        }


class Aggregator:
    """Keeps the monitoring summaries of `files_db` in `stats_db` up to date, one `step` at a
    time (one instance at a time)."""

    def __init__(
        self,
        files_db: Database,
        stats_db: Database,
        *,
        close_after: float = 300.0,
        batch: int = limits.MAX_DOCS,
        clock: Callable[[], float] = time.time,
    ):
        self.files_db = files_db
        self.stats_db = stats_db
        self.close_after = close_after
        self.batch = batch
        self.clock = clock
        self.loaded = False
        self.closed_end: float | None = None
        self.resume_seq = "0"
        self.cumulative = Tally()
        # request → its metadata, its events in the open hours, the feed batch it was last read in
        self.pending: dict[str, tuple[Meta, list[Event], int]] = {}
        self.feed_seq = "0"
        self.batch_starts: dict[int, str] = {}  # feed batch → the sequence it was read after
        self._batches = 0
        self.last_read_at: float | None = None  # when the last feed read reached the end
        # closed hour → (its tasks, those folded: fold_tasks)
        self.recent_tasks: dict[float, tuple[TaskRows, TaskRows]] = {}
        self._revs: dict[str, str] = {}

    # -- where it stands --------------------------------------------------------------------
    def load(self) -> None:
        state = self.stats_db.get(STATE_ID)
        self.pending, self._revs, self.recent_tasks = {}, {}, {}
        self.last_read_at = None
        self.batch_starts = {}
        if state:
            self.closed_end = float(state["closed_end"])
            self.resume_seq = str(state["resume_seq"])
            self.cumulative = Tally.from_json(state["cumulative"])
            self._revs[STATE_ID] = state["_rev"]
            since = self.closed_end - RECENT
            self.recent_tasks = {
                d["start"]: (d["tasks"], d.get(OTHER_TASKS, {}))
                for d in self.stats_db.all_docs(
                    TASKS_PREFIX + hour_name(since), TASKS_PREFIX + "\ufff0"
                )
            }
        else:
            self.closed_end, self.resume_seq, self.cumulative = None, "0", Tally()
        self.feed_seq = self.resume_seq
        self.loaded = True

    def purge_bound(self) -> float | None:
        """Requests whose last change is before this may be purged: all their events are in
        the hour documents. None until the first hours are closed."""
        return self.closed_end

    # -- one cycle --------------------------------------------------------------------------
    def step(self) -> StepReport:
        report = StepReport()
        try:
            if not self.loaded:
                self.load()
            if self.closed_end is None:
                self._backfill(report)
            else:
                report.read = self._read_feed()
                self._close(report)
            self._write_live()
        except Conflict:
            # Another aggregator wrote meanwhile (a handover): start again from what it wrote.
            log.warning("monitoring summaries written by another instance; reloading")
            self.loaded = False
            raise
        report.pending = len(self.pending)
        return report

    def _changes(self, since: str) -> Iterable[tuple[str, dict[str, Any] | None]]:
        """(id, document or None if deleted) of each request in the feed after `since`; the
        time it reached the end is `last_read_at`; `batch_starts` says where each batch began."""
        while True:
            batch = self.files_db.changes(since, limit=self.batch, include_docs=True)
            taken = self.clock()
            if batch.results:
                self._batches += 1
                self.batch_starts[self._batches] = since
            since = batch.last_seq
            self.feed_seq = since
            if not batch.results:
                self.last_read_at = taken
                return
            for change in batch.results:
                doc = change.get("doc")
                if change.get("deleted") or not doc:
                    yield change["id"], None
                elif doc.get("type") == model.REQUEST_TYPE:
                    yield change["id"], doc

    def _keep_open(self, doc_id: str, doc: Mapping[str, Any], since: float) -> None:
        """Keep the request's events from `since` on, and the feed batch it was just read in."""
        events = [e for e in events_of(doc) if e[0] >= since]
        if events:
            self.pending[doc_id] = (Meta.of(doc), events, self._batches)
        else:
            self.pending.pop(doc_id, None)

    def _resume_point(self) -> str:
        """Where a restart reads the feed from once the hours up to `closed_end` are closed: the
        start of the batch that read the earliest of the requests still pending (a restart must
        find each of them again: the feed shows a request at its last write, at or after where
        it was read), else where the last read ended. Forgets the batch starts before it."""
        if not self.pending:
            self.batch_starts = {}
            return self.feed_seq
        first = min(batch for _, _, batch in self.pending.values())
        self.batch_starts = {b: s for b, s in self.batch_starts.items() if b >= first}
        return self.batch_starts[first]

    def _read_feed(self) -> int:
        assert self.closed_end is not None
        n = 0
        for doc_id, doc in self._changes(self.feed_seq):
            n += 1
            if doc is not None:  # a deleted request keeps the open events it had
                self._keep_open(doc_id, doc, self.closed_end)
        return n

    def _backfill(self, report: StepReport) -> None:
        """The first run: every event of the hours that are over, from the first copy of each
        request in one read of the whole feed; the open hours as in any cycle."""
        started = self.clock()
        until = hour_start(started - self.close_after)
        hours: dict[float, Tally] = defaultdict(Tally)
        dims = Tally()  # links, users and errors of all those hours at once
        seen: set[int] = set()
        for doc_id, doc in self._changes("0"):
            report.read += 1
            if doc is None:
                continue
            key = hash(doc_id)
            if key not in seen:
                # Events before `until` were written before this read began: any copy of the
                # request holds them all; count them from its first copy only.
                seen.add(key)
                meta = Meta.of(doc)
                for event in events_of(doc):
                    if event[0] < until:
                        tasks = event[0] >= until - FIRST_RUN_TASKS
                        hours[hour_start(event[0])].count(event, meta, dims=False, tasks=tasks)
                        dims.count(event, meta, moves=False, tasks=False)
            self._keep_open(doc_id, doc, until)
        report.backfilled = True
        self._commit_hours(sorted(hours.items()), dims, until, self._resume_point(), report)
        log.info(
            "monitoring summaries started: %d requests read, %d hours with events before %s",
            report.read,
            len(hours),
            hour_name(until),
        )

    def _close(self, report: StepReport) -> None:
        """Close every hour that ended `close_after` seconds before the last feed read."""
        assert self.closed_end is not None
        assert self.last_read_at is not None
        last_read = self.last_read_at
        until = hour_start(last_read - self.close_after)
        if until <= self.closed_end:
            return
        hours: dict[float, Tally] = defaultdict(Tally)
        dims = Tally()
        for doc_id, (meta, events, batch) in list(self.pending.items()):
            still_open = []
            for event in events:
                if event[0] < until:
                    hours[hour_start(event[0])].count(event, meta, dims=False)
                    dims.count(event, meta, moves=False, tasks=False)
                else:
                    still_open.append(event)
            if still_open:
                self.pending[doc_id] = (meta, still_open, batch)
            else:
                del self.pending[doc_id]
        self._commit_hours(sorted(hours.items()), dims, until, self._resume_point(), report)

    def _commit_hours(
        self,
        hours: list[tuple[float, Tally]],
        dims: Tally,
        until: float,
        resume: str,
        report: StepReport,
    ) -> None:
        """Write the hour documents (`hours`: their moves and tasks; `dims`: the links, users
        and errors of them all), the days they end, then where the aggregator stands."""
        previous = self.closed_end
        docs: list[dict[str, Any]] = []
        for start, tally in hours:
            self.cumulative.add(tally, tasks=False)
            totals = self.cumulative.totals()
            docs.append(
                {
                    "_id": HOUR_PREFIX + hour_name(start),
                    "type": "monitor_hour",
                    "hour": hour_name(start),
                    "start": start,
                    "moves": tally.moves,
                    "totals": totals,
                    "backlog": backlog(totals),
                }
            )
            docs.append(
                {
                    "_id": LINK_HOUR_PREFIX + hour_name(start),
                    "type": "monitor_links",
                    "hour": hour_name(start),
                    "start": start,
                    "link_hours": tally.link_hours,
                    "failures": tally.failures,
                }
            )
            tasks, other = fold_tasks(tally.tasks)
            docs.append(
                {
                    "_id": TASKS_PREFIX + hour_name(start),
                    "type": "monitor_tasks",
                    "hour": hour_name(start),
                    "start": start,
                    "tasks": tasks,
                    OTHER_TASKS: other,
                }
            )
            if start >= until - RECENT:
                self.recent_tasks[start] = (tasks, other)
            report.closed.append(hour_name(start))
        self.cumulative.add(dims, tasks=False)
        for start in [s for s in self.recent_tasks if s < until - RECENT]:
            del self.recent_tasks[start]
        self._overwrite(docs)
        self._overwrite(self._days(previous, until, report))
        state = {
            "_id": STATE_ID,
            "type": "monitor_state",
            "closed_end": until,
            "resume_seq": resume,
            "cumulative": self.cumulative.to_json(tasks=False),
            "written": self.clock(),
        }
        if STATE_ID in self._revs:
            state["_rev"] = self._revs[STATE_ID]
        self._revs[STATE_ID] = self.stats_db.put(state)
        self.closed_end, self.resume_seq = until, resume

    def _days(
        self, previous: float | None, until: float, report: StepReport
    ) -> list[dict[str, Any]]:
        """Day documents of the days that ended between `previous` and `until` (with events):
        each with the sum of its hours' moves, and one with the sum of their links and
        failures."""
        last_end = (until // DAY) * DAY  # days ending at or before `until` are over
        first = (previous // DAY) * DAY if previous is not None else 0.0  # not closed yet
        if first >= last_end:
            return []
        first_hour, last_hour = (hour_name(first) if first else ""), hour_name(last_end - HOUR)
        rows = self.stats_db.all_docs(HOUR_PREFIX + first_hour, HOUR_PREFIX + last_hour)
        details = self.stats_db.all_docs(
            LINK_HOUR_PREFIX + first_hour, LINK_HOUR_PREFIX + last_hour
        )
        by_day: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for doc in rows:
            by_day[day_name(doc["start"])].append(doc)
        detail_by_day: dict[str, Tally] = defaultdict(Tally)
        for doc in details:
            detail_by_day[day_name(doc["start"])].add(
                Tally.from_json(
                    {"moves": {}, "link_hours": doc["link_hours"], "failures": doc["failures"]}
                )
            )
        docs = []
        for day, hour_docs in sorted(by_day.items()):
            tally = Tally()
            for h in hour_docs:
                tally.add(Tally.from_json({"moves": h["moves"]}))
            last = max(hour_docs, key=lambda h: h["start"])
            start = (last["start"] // DAY) * DAY
            docs.append(
                {
                    "_id": DAY_PREFIX + day,
                    "type": "monitor_day",
                    "day": day,
                    "start": start,
                    "moves": tally.moves,
                    "totals": last["totals"],
                    "backlog": last["backlog"],
                    "backlog_max": max(h["backlog"] for h in hour_docs),
                }
            )
            detail = detail_by_day[day]
            docs.append(
                {
                    "_id": LINK_DAY_PREFIX + day,
                    "type": "monitor_links",
                    "day": day,
                    "start": start,
                    "link_hours": detail.link_hours,
                    "failures": detail.failures,
                }
            )
            report.days.append(day)
        return docs

    def _overwrite(self, docs: list[dict[str, Any]]) -> None:
        """Write documents whatever revision they have (they are recomputed, never edited)."""
        for i in range(0, len(docs), self.batch):
            chunk = docs[i : i + self.batch]
            current = self.stats_db.get_many(d["_id"] for d in chunk)
            for doc in chunk:
                if existing := current.get(doc["_id"]):
                    doc["_rev"] = existing["_rev"]
            for result in self.stats_db.bulk_write(chunk):
                if not result.ok:
                    raise result.as_error(self.stats_db.name)

    # -- now --------------------------------------------------------------------------------
    def _write_live(self) -> None:
        """The figures up to the last feed read: closed hours plus the open ones."""
        now_tally = Tally()
        now_tally.add(self.cumulative, tasks=False)
        open_hours: dict[float, Tally] = defaultdict(Tally)
        for meta, events, _ in self.pending.values():
            for event in events:
                open_hours[hour_start(event[0])].count(event, meta)
        for tally in open_hours.values():
            now_tally.add(tally, tasks=False)
        as_of = self.last_read_at if self.last_read_at is not None else self.clock()
        totals = now_tally.totals()
        tasks, other = self._recent_tasks(open_hours, as_of)
        live: dict[str, Any] = {
            "_id": LIVE_ID,
            "type": "monitor_live",
            "as_of": as_of,
            "closed_end": self.closed_end,
            "totals": totals,
            "backlog": backlog(totals),
            "open": [
                {
                    "hour": hour_name(start),
                    "start": start,
                    "moves": t.moves,
                    "link_hours": t.link_hours,
                    "failures": t.failures,
                }
                for start, t in sorted(open_hours.items())
            ],
            "tasks_since": as_of - RECENT,
            "tasks": tasks,
            OTHER_TASKS: other,
        }
        links = {
            "_id": LIVE_LINKS_ID,
            "type": "monitor_live",
            "as_of": as_of,
            "links": now_tally.links,
            "errors": now_tally.errors,
        }
        users = {"_id": LIVE_USERS_ID, "type": "monitor_live", "as_of": as_of}
        users["users"] = now_tally.users
        metrics.export_summaries(totals, now_tally.links, now_tally.errors, live["backlog"])
        for doc in (live, links, users):
            self._put_live(doc)

    def _recent_tasks(
        self, open_hours: Mapping[float, Tally], as_of: float
    ) -> tuple[TaskRows, TaskRows]:
        """What each task did in the 24 hours before `as_of` (closed and open hours), folded as
        fold_tasks does; a task an hour document folded is in that hour's folded totals."""
        hours = [(s, t) for s, t in self.recent_tasks.items() if s >= as_of - RECENT]
        hours += [(s, (t.tasks, {})) for s, t in open_hours.items()]
        recent = Tally()
        other: TaskRows = {}
        last_seen: dict[str, float] = {}
        for start, (tasks, folded) in sorted(hours, key=lambda h: h[0]):
            recent.add(Tally(tasks=tasks))
            merge_other(other, folded)
            last_seen.update(dict.fromkeys(tasks, start))
        tasks, folded = fold_tasks(recent.tasks, last_seen)
        merge_other(other, folded)
        return tasks, other

    def _put_live(self, doc: dict[str, Any]) -> None:
        if doc["_id"] not in self._revs:
            current = self.stats_db.get(doc["_id"])
            if current:
                self._revs[doc["_id"]] = current["_rev"]
        if doc["_id"] in self._revs:
            doc["_rev"] = self._revs[doc["_id"]]
        try:
            self._revs[doc["_id"]] = self.stats_db.put(doc)
        except Conflict:
            self._revs.pop(doc["_id"], None)  # read the revision again next cycle
            raise
