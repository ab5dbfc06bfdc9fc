"""What users and CRAB-style clients ask: the state of a task's files, what changed, and a file's
story. The contract is docs/status-api.md; everything here is a few requests any HTTP client
can make through the front end:

* `asyncstageout/by_task`, key [task, job, file_type, id] (unique, jobs in numeric order): a
  status row per file; paged with start_key = the last key and skip=1;
* `asyncstageout/task_states` (`_count`), key [task, axis, state]: the counts;
* the database's `_changes` feed with the `_doc_ids` filter: which of the task's files changed
  after a sequence (the store's own cursor, which never skips a write; agents' clocks do);
* `asyncstageout/link_done` (`_count`), key [source, destination, end]: copies done per link
  in time, for the estimated completion.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from aso import model
from aso.core.controls import controls_of, holding
from aso.core.holds import hold_keys, holds_of
from aso.core.holds import holding as holding_file
from aso.limits import LIGHT_LOOKUPS
from aso.model import (
    AT_THE_SERVICE,
    AXES,
    HELD,
    HELD_BACK,
    ON_ITS_WAY,
    STATE,
    TO_SUBMIT,
    job_order,
)
from aso.store import Database, StoreError

DDOC = "asyncstageout"
PAGE = 1000  # rows per by_task request by range
KEYS_PAGE = LIGHT_LOOKUPS  # keys per by_task request by keys: a light read at the front end
# The estimate's sliding window: a link's pace is what it did in the last RATE_WINDOW seconds,
# measured from its first copy in the window (so that it is sane in a task's first minutes).
RATE_WINDOW = 900.0
MIN_COPIES = 3  # copies done on a link before its pace is taken as known
MIN_SPAN = 2.0  # seconds: the least time a pace is measured over
MAX_ENDS = 1000  # the newest copies of a link its pace is measured on
# A pause between two copies ends a link's run: at least QUIET_GAP seconds, and QUIET_GAPS times
# the window's median gap (copies end in jobs, many at once: gaps of 0 and of a job's length).
QUIET_GAP = 30.0
QUIET_GAPS = 5.0


@dataclass
class FileStatus:
    """A status row (docs/status-api.md): what a client shows of one file."""

    id: str
    rev: str
    job_id: str
    file_type: str
    state: str
    cleanup: str
    publication: str
    last_update: float
    user: str = ""
    job_retry: int = 0
    source: str = ""
    destination: str = ""
    source_lfn: str = ""
    destination_lfn: str = ""
    size: int = 0
    attempts: int = 0
    error_class: str | None = None  # the current failure's class (none once the file is done)
    reason: str | None = None  # the current failure's reason
    cleanup_error: str | None = None
    publication_error: str | None = None
    created: float = 0.0
    # Why a file not finished waits: {why, since, until, job_id} (aso/model.py WAITING_WHY);
    # None once it is finished, or stopped
    waiting: dict[str, Any] | None = None
    final: bool = False  # finished for good (model.has_ended): nothing more happens to it
    note: str | None = None  # done although its owner killed it: why (model.KILL_CAME_LATE)

    @property
    def key(self) -> list[Any]:
        """The row's by_task key: [task] is the caller's, the rest is the file's."""
        return [job_order(self.job_id), self.file_type, self.id]


@dataclass
class TaskStatus:
    task: str
    job: str | None
    files: list[FileStatus]
    counts: dict[str, dict[str, int]]  # axis → state → files
    eta: float | None = None  # seconds until the files on their way are done; None: unknown
    eta_note: str = ""  # why there is no estimate, or what it rests on
    rates: dict[str, float] = field(default_factory=dict)  # link → files/s, sliding window
    seq: str = ""  # the store's sequence before the files were read: the next poll's `since`
    # files waiting to start that an operator's control holds back, by what it says
    held_back: dict[str, int] = field(default_factory=dict)
    # files waiting to start that a hold keeps back, by what the hold says
    held: dict[str, int] = field(default_factory=dict)
    unfinished: int = 0  # files not finished for good (model.has_ended)

    @property
    def exists(self) -> bool:
        return bool(self.files)

    @property
    def finished(self) -> bool:
        """Every file of the task (or job) is finished for good: a client may stop following."""
        return self.exists and not self.unfinished

    @property
    def on_its_way(self) -> int:
        return sum(n for s, n in self.counts.get("state", {}).items() if s in ON_ITS_WAY)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["on_its_way"] = self.on_its_way
        data["finished"] = self.finished
        if not self.exists:
            data["message"] = no_requests(self.task, self.job)
        return data


# The task_states rows that count a task's files by whether they are finished for good.
FINAL_COUNT = "final"


def no_requests(task: str, job: str | None = None) -> str:
    return f"no requests for task {task}" + (f" job {job}" if job else "")


def file_status(row: Mapping[str, Any]) -> FileStatus:
    """A by_task row as a status row."""
    value = row["value"]
    fields = {k: value[k] for k in FileStatus.__dataclass_fields__ if k in value}
    fields.pop("file_type", None)
    return FileStatus(id=row["id"], file_type=row["key"][2], **fields)


def task_range(task: str, job: str | None = None) -> tuple[list[Any], list[Any]]:
    """start_key, end_key of a task's (or one job's) rows in by_task."""
    if job is None:
        return [task], [task, {}]
    return [task, job_order(job)], [task, job_order(job), {}]


def task_row_pages(
    db: Database, task: str, job: str | None = None, page: int = PAGE, include_docs: bool = False
) -> Iterator[list[dict[str, Any]]]:
    """The task's by_task rows (with their documents if asked), `page` at a time, in key
    order. Each page starts at the last key of the one before and skips it: keys are unique,
    so no row is read twice or missed (a read of documents is bounded by the front end)."""
    start, end = task_range(task, job)
    skip = 0
    while True:
        rows = db.view(
            DDOC, "by_task", start_key=start, end_key=end, limit=page, skip=skip or None,
            include_docs=include_docs,
        ).rows  # fmt: skip
        if rows:
            yield rows
        if len(rows) < page:
            return
        start, skip = rows[-1]["key"], 1


def task_pages(
    db: Database, task: str, job: str | None = None, page: int = PAGE
) -> Iterator[list[FileStatus]]:
    """The task's status rows, `page` at a time, in key order."""
    for rows in task_row_pages(db, task, job, page):
        yield [file_status(r) for r in rows]


def status_row(db: Database, doc: Mapping[str, Any]) -> FileStatus | None:
    """A request's status row (its by_task row; None while the view does not hold it yet)."""
    key = [doc["task"], job_order(doc["job_id"]), doc["file_type"], doc["_id"]]
    rows = db.view(DDOC, "by_task", key=key, limit=1).rows
    return file_status(rows[0]) if rows else None


def task_files(db: Database, task: str, job: str | None = None) -> list[FileStatus]:
    """Every file of the task (or of one job), in job order."""
    return [f for page in task_pages(db, task, job) for f in page]


def task_counts(db: Database, task: str) -> tuple[dict[str, dict[str, int]], int]:
    """Files of the task per state of each axis, and how many are not finished for good
    (model.has_ended), in one view request."""
    rows = db.view(
        DDOC, "task_states", start_key=[task], end_key=[task, {}], reduce=True, group_level=3
    ).rows
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    unfinished = 0
    for row in rows:
        _, axis, state = row["key"]
        if axis == FINAL_COUNT:
            unfinished += 0 if state else int(row["value"])
        else:
            counts[axis][state] = row["value"]
    return dict(counts), unfinished


def task_size(db: Database, task: str) -> int:
    """How many files the task has (the counts of one axis), in one small request."""
    rows = db.view(
        DDOC,
        "task_states",
        start_key=[task, STATE],
        end_key=[task, STATE, {}],
        reduce=True,
        group_level=2,
    ).rows
    return int(rows[0]["value"]) if rows else 0


def counts_of(files: list[FileStatus]) -> dict[str, dict[str, int]]:
    return {axis: dict(Counter(getattr(f, axis) for f in files)) for axis in AXES if files}


def current_seq(db: Database) -> str:
    """The store's update sequence now: a cursor before anything read after it."""
    return str(db.info()["update_seq"])


class Poller:
    """Follows one task's files (docs/status-api.md, "Following a task"): each `poll` returns
    the rows that changed since the last, each revision once. The cursor is the store's
    sequence, so no write is ever skipped, whichever agent made it and whatever its clock:

    1. `_changes?filter=_doc_ids&since=SEQ` with the ids known: which of them changed;
    2. the task's size (`task_states`): when it differs from the ids known, files were
       recorded (or purged) since, and the task is read again to find them;
    3. the changed rows from `by_task` by key (a file's job and type never change).

    A row can come again with the same revision when it changed between steps 1 and 3 (it is
    read at its newest, and the next poll sees the change): those repeats are dropped."""

    def __init__(self, db: Database, task: str, since: str = "0"):
        self.db = db
        self.task = task
        self.since = since
        self.keys: dict[str, list[Any]] = {}  # id → its by_task key (job and type never change)
        self.revs: dict[str, str] = {}  # id → the revision last returned

    def start(self) -> list[FileStatus]:
        """Every file of the task now; polls go on from before they were read."""
        self.since = current_seq(self.db)
        return self._seen(task_files(self.db, self.task))

    def knows(self, files: list[FileStatus]) -> None:
        """Follow these files from `since` on without returning them now (a client that keeps
        no state between calls has just read them)."""
        self.keys.update((f.id, [self.task, *f.key]) for f in files)

    def poll(self) -> list[FileStatus]:
        ids = sorted(self.keys)
        if ids:
            batch = self.db.changes(self.since, doc_ids=ids)
            changed = {r["id"] for r in batch.results}
            last_seq = batch.last_seq
        else:
            changed, last_seq = set(), current_seq(self.db)
        rows: list[FileStatus] = []
        if task_size(self.db, self.task) != len(self.keys):
            everything = task_files(self.db, self.task)  # new files (or purged ones)
            present = {f.id for f in everything}
            self.keys = {i: key for i, key in self.keys.items() if i in present}
            self.revs = {i: rev for i, rev in self.revs.items() if i in present}
            rows = [f for f in everything if f.id in changed or f.id not in self.keys]
        elif changed:
            rows = self._rows_by_key([self.keys[i] for i in sorted(changed)])
        self.since = last_seq
        return self._seen(rows)

    def _rows_by_key(self, keys: list[list[Any]]) -> list[FileStatus]:
        found = []
        for start in range(0, len(keys), KEYS_PAGE):
            view = self.db.view(DDOC, "by_task", keys=keys[start : start + KEYS_PAGE])
            found += [file_status(r) for r in view.rows]
        return found

    def _seen(self, rows: list[FileStatus]) -> list[FileStatus]:
        fresh = [row for row in rows if self.revs.get(row.id) != row.rev]
        self.knows(rows)
        self.revs.update((row.id, row.rev) for row in rows)
        return fresh


def changed_since(db: Database, task: str, since: str) -> tuple[list[FileStatus], str]:
    """The task's files that changed after the store sequence `since` (the `seq` of an earlier
    answer; "0": every file), and the sequence to ask from next time. For a client that keeps
    no state between calls: the task's ids are read first; see Poller for one that does."""
    poller = Poller(db, task, since)
    if since in ("", "0"):
        return poller.start(), poller.since
    poller.knows(task_files(db, task))
    return poller.poll(), poller.since


@dataclass
class LinkPace:
    """A link's recent copies: when each of the window's copies ended (oldest first)."""

    ends: tuple[float, ...]

    @property
    def copies(self) -> int:
        return len(self.ends)

    def rate(self, now: float) -> float | None:
        """Files per second while the link was copying, or None while too little is known:
        over its latest run of copies (a gap of QUIET_GAP and QUIET_GAPS times its usual gap
        ends a run), the copies that ended after the run's first end by the time they took.
        Quiet time (before the run, after it, a pause) is no time the link was slow."""
        run = latest_run(self.ends)
        if len(run) < MIN_COPIES:
            return None
        after_first = sum(1 for end in run if end > run[0])
        if not after_first:
            return None
        return after_first / max(run[-1] - run[0], MIN_SPAN)


def latest_run(ends: tuple[float, ...]) -> tuple[float, ...]:
    """The newest copies without a pause among them."""
    if len(ends) < 2:
        return ends
    gaps = sorted(b - a for a, b in itertools.pairwise(ends))
    pause = max(QUIET_GAP, QUIET_GAPS * gaps[len(gaps) // 2])
    first = len(ends) - 1
    while first > 0 and ends[first] - ends[first - 1] <= pause:
        first -= 1
    return ends[first:]


def link_pace(
    db: Database, link: tuple[str, str], now: float, window: float = RATE_WINDOW
) -> LinkPace:
    """When the copies done on `link` in the last `window` seconds ended (the newest MAX_ENDS)."""
    source, destination = link
    rows = db.view(DDOC, "link_done", start_key=[source, destination, now],
                   end_key=[source, destination, now - window], reduce=False,
                   descending=True, limit=MAX_ENDS).rows  # fmt: skip
    return LinkPace(tuple(sorted(float(row["key"][2]) for row in rows)))


def estimate(
    files: list[FileStatus], paces: Mapping[tuple[str, str], LinkPace], now: float
) -> tuple[float | None, str]:
    """Seconds until the files on their way are done if each link keeps its recent pace (the
    slowest link decides), and a note: why there is no estimate, or what it rests on."""
    waiting = Counter((f.source, f.destination) for f in files if f.state in ON_ITS_WAY)
    if not waiting:
        return 0.0, "nothing left to copy"
    times = []
    for link, n in sorted(waiting.items()):
        pace = paces.get(link) or LinkPace(())
        rate = pace.rate(now)
        if rate is None:
            minutes = RATE_WINDOW / 60
            return None, (
                f"{link[0]} → {link[1]} has copied {pace.copies} files in the last "
                f"{minutes:.0f} min: too few to tell its pace"
            )
        times.append(n / rate)
    return max(times), (
        f"from each link's pace over its latest copies of the last {RATE_WINDOW / 60:.0f} min"
    )


CONTROL_PREFIX = "control:"
MAX_CONTROLS = 1000  # control documents read at most (one per site or user ever set)


def read_controls(db: Database) -> list[dict[str, Any]]:
    """The operators' control documents (aso/core/controls.py)."""
    return db.all_docs(CONTROL_PREFIX, CONTROL_PREFIX + "\ufff0", limit=MAX_CONTROLS)


HOLD_PREFIX = "hold:"
MAX_HOLDS = 10_000  # hold documents read at most (one per destination and user ever held)
HOLD_PAGE = 1000  # a read with documents through the front end is a page of at most 1000


def all_holds(db: Database) -> list[dict[str, Any]]:
    """Every hold document, in force or ended (aso/core/holds.py), page by page: each page
    starts at the last id of the one before (round 29: one read of 10,000 with their
    documents was refused by the front end, and `aso hold list` with it)."""
    found: dict[str, dict[str, Any]] = {}
    first = HOLD_PREFIX
    while len(found) < MAX_HOLDS:
        page = db.all_docs(first, HOLD_PREFIX + "\ufff0", limit=HOLD_PAGE)
        found.update((d["_id"], d) for d in page)
        if len(page) < HOLD_PAGE:
            break
        first = page[-1]["_id"]
    return [d for d in found.values() if d.get("type") == model.HOLD_TYPE]


def read_holds(db: Database, pairs: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """The hold documents (aso/core/holds.py) of these (destination, user) pairs that exist."""
    ids = sorted({model.hold_id(site, user) for site, user in pairs})
    if not ids:
        return []
    return [doc for doc in db.get_many(ids).values() if doc is not None]


def held_back_counts(db: Database, files: list[FileStatus]) -> dict[str, int]:
    """How many of the files waiting to start an operator's control holds back, by what the
    control says; each such file's `waiting` says so too (`held_back`, with the control). Empty
    when the controls cannot be read: the status goes on without them."""
    waiting = [f for f in files if f.state in TO_SUBMIT]
    if not waiting:
        return {}
    try:
        found = controls_of(read_controls(db))
    except StoreError:
        return {}
    held: dict[str, int] = defaultdict(int)
    for f in waiting:
        setting = holding(f.user, f.source, f.destination, found)
        if setting is not None:
            held[setting.says()] += 1
            if f.waiting is not None and f.state == "new":
                f.waiting = {**f.waiting, "why": HELD_BACK, "control": setting.says()}
    return dict(held)


def held_counts(db: Database, files: list[FileStatus]) -> dict[str, int]:
    """How many of the files waiting to start a hold keeps back (their destination refused
    their user for room or permission), and of those at the transfer service a site's hold
    holds (their copy waits on a site that stopped answering), by what the hold says; each
    such file's `waiting` says so too (`held`, with the hold's id and its next look as
    `until`, its `job_id` kept). Empty when the holds cannot be read: the status goes on
    without them."""
    waiting = [f for f in files if f.state in TO_SUBMIT or f.state == "submitted"]
    if not waiting:
        return {}
    try:
        ends = [{"source": f.source, "destination": f.destination, "user": f.user} for f in waiting]
        found = holds_of(read_holds(db, {key for end in ends for key in hold_keys(end)}))
    except StoreError:
        return {}
    held: dict[str, int] = defaultdict(int)
    for f, end in zip(waiting, ends, strict=True):
        hold = holding_file(end, found)
        if hold is None or (hold.user and f.state not in TO_SUBMIT):
            continue  # a user's hold keeps back what is not sent yet; a copy under way goes on
        held[hold.says()] += 1
        if f.waiting is not None:
            f.waiting = {**f.waiting, "why": HELD, "until": hold.next_check,
                         "hold": model.hold_id(hold.site, hold.user)}  # fmt: skip
    return dict(held)


def link_queues(db: Database, files: list[FileStatus]) -> None:
    """What each queued file waits behind on its link: how many of the link's files wait to
    start (every user's, in its `waiting` as `link_waiting`) and how many are in transfer
    (`link_active`), one read of the links view per link. Left out when it cannot be read."""
    queued = [f for f in files if f.waiting and f.waiting["why"] == "queued"]
    for source, destination in sorted({(f.source, f.destination) for f in queued}):
        try:
            rows = db.view(DDOC, "links", start_key=[source, destination, "state"],
                           end_key=[source, destination, "state", {}], reduce=True,
                           group_level=4).rows  # fmt: skip
        except StoreError:
            return
        counts = {row["key"][3]: int(row["value"]) for row in rows}
        behind = sum(counts.get(s, 0) for s in TO_SUBMIT)
        active = sum(counts.get(s, 0) for s in AT_THE_SERVICE)
        for f in queued:
            if (f.source, f.destination) == (source, destination) and f.waiting is not None:
                f.waiting = {**f.waiting, "link_waiting": behind, "link_active": active}


def waiting_counts(files: list[FileStatus]) -> dict[str, int]:
    """How many of the files on their way wait for each reason (their `waiting.why`)."""
    return dict(Counter(f.waiting["why"] for f in files if f.waiting))


def task_status(
    db: Database, task: str, job: str | None = None, now: float | None = None
) -> TaskStatus:
    seq = current_seq(db)
    files = task_files(db, task, job)
    if job:
        counts, unfinished = counts_of(files), sum(not f.final for f in files)
    else:
        counts, unfinished = task_counts(db, task)
    status = TaskStatus(task, job, files, counts, seq=seq, unfinished=unfinished)
    status.held_back = held_back_counts(db, files)
    status.held = held_counts(db, files)
    link_queues(db, files)
    if files:
        now = time.time() if now is None else now
        links = sorted({(f.source, f.destination) for f in files if f.state in ON_ITS_WAY})
        paces = {link: link_pace(db, link, now) for link in links}
        status.rates = {
            f"{s}>{d}": rate for (s, d), p in paces.items() if (rate := p.rate(now)) is not None
        }
        status.eta, status.eta_note = estimate(files, paces, now)
    return status


@dataclass
class Event:
    at: float
    what: str
    detail: str = ""


def timeline(doc: Mapping[str, Any], job_url: str = "") -> list[Event]:
    """A file's whole story, oldest first: its recording, every change of its three states
    (with the reason: the cleanup's outcome, the catalog block it went into), and each transfer
    attempt with its job id (and its link to the FTS web monitor: `job_url`, `fts3.monitor_url`,
    with {job_id} replaced) and error."""
    events = []
    for h in doc.get("history", []):
        if h.get("from") is None:
            what = f"recorded as {h['to']} by {h['by']}"
        else:
            what = f"{h['axis']}: {h['from']} → {h['to']} by {h['by']}"
        events.append(Event(h["at"], what, h.get("reason") or ""))
    for n, attempt in enumerate(doc.get("attempts", []), 1):
        events.append(
            Event(
                attempt["submitted"],
                f"attempt {n} submitted to {attempt['service']} as job {attempt['job_id']}",
                job_url.replace("{job_id}", attempt["job_id"]) if job_url else "",
            )
        )
        if attempt.get("ended") is not None:
            detail = attempt.get("reason") or ""
            if attempt.get("error_class"):
                detail = f"[{attempt['error_class']}] {detail}"
            events.append(
                Event(attempt["ended"], f"attempt {n} {attempt.get('outcome') or 'ended'}", detail)
            )
    return sorted(events, key=lambda e: e.at)
