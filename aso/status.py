"""What users and CRAB-style clients ask: the state of a task's files, and a file's story.

Everything comes from the files database's views, one request each, so that a client through
the front end can ask the same thing over HTTP (docs/frontend.md, "Status queries"):

* `asyncstageout/by_task`, key [task, job_id, file_type]: every file of a task (or of one
  job) with its three states, link, last change and reason;
* `asyncstageout/task_states` (`_count`, group_level=3), key [task, axis, state]: the counts;
* `asyncstageout/task_updates`, key [task, last_update]: what changed since a time (polling);
* `asyncstageout/link_done` (`_count`), key [source, destination, end]: copies done per link
  in time, for the estimated completion.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from aso.model import AXES, ON_ITS_WAY
from aso.store import Database

DDOC = "asyncstageout"
RATE_WINDOW = 3600.0  # seconds of link throughput an estimate is made from


@dataclass
class FileStatus:
    id: str
    job_id: str
    file_type: str
    state: str
    cleanup: str
    publication: str
    last_update: float
    reason: str | None = None
    source: str | None = None
    destination: str | None = None


@dataclass
class TaskStatus:
    task: str
    job: str | None
    files: list[FileStatus]
    counts: dict[str, dict[str, int]]  # axis → state → files
    eta: float | None = None  # seconds until the files on their way are done; None: unknown
    rates: dict[str, float] = field(default_factory=dict)  # link → files/s over RATE_WINDOW

    @property
    def exists(self) -> bool:
        return bool(self.files)

    @property
    def on_its_way(self) -> int:
        return sum(n for s, n in self.counts.get("state", {}).items() if s in ON_ITS_WAY)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["on_its_way"] = self.on_its_way
        if not self.exists:
            data["message"] = no_requests(self.task, self.job)
        return data


def no_requests(task: str, job: str | None = None) -> str:
    return f"no requests for task {task}" + (f" job {job}" if job else "")


def _file(row: Mapping[str, Any], job_id: str, file_type: str) -> FileStatus:
    value = row["value"]
    return FileStatus(
        id=row["id"],
        job_id=job_id,
        file_type=file_type,
        state=value["state"],
        cleanup=value["cleanup"],
        publication=value["publication"],
        last_update=value.get("last_update") or 0.0,
        reason=value.get("reason"),
        source=value.get("source"),
        destination=value.get("destination"),
    )


def task_files(db: Database, task: str, job: str | None = None) -> list[FileStatus]:
    """Every file of the task (or of one job), in one view request."""
    start, end = ([task, job], [task, job, {}]) if job else ([task], [task, {}])
    rows = db.view(DDOC, "by_task", start_key=start, end_key=end).rows
    return [_file(r, r["key"][1], r["key"][2]) for r in rows]


def task_counts(db: Database, task: str) -> dict[str, dict[str, int]]:
    """Files of the task per state of each axis, in one view request."""
    rows = db.view(
        DDOC, "task_states", start_key=[task], end_key=[task, {}], reduce=True, group_level=3
    ).rows
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for row in rows:
        _, axis, state = row["key"]
        counts[axis][state] = row["value"]
    return dict(counts)


def counts_of(files: list[FileStatus]) -> dict[str, dict[str, int]]:
    return {axis: dict(Counter(getattr(f, axis) for f in files)) for axis in AXES if files}


def changed_since(db: Database, task: str, since: float) -> list[dict[str, Any]]:
    """The task's files whose last change is after `since` (epoch seconds): what a polling
    client asks each time, with the newest `last_update` as its next `since`."""
    rows = db.view(DDOC, "task_updates", start_key=[task, since], end_key=[task, {}]).rows
    return [
        {"id": r["id"], "last_update": r["key"][1], **r["value"]}
        for r in rows
        if r["key"][1] > since
    ]


def link_rates(
    db: Database, links: set[tuple[str, str]], now: float, window: float = RATE_WINDOW
) -> dict[tuple[str, str], float]:
    """Files done per second on each link over the last `window` seconds."""
    rates = {}
    for source, destination in sorted(links):
        rows = db.view(
            DDOC,
            "link_done",
            start_key=[source, destination, now - window],
            end_key=[source, destination, now],
            reduce=True,
        ).rows
        rates[(source, destination)] = (rows[0]["value"] if rows else 0) / window
    return rates


def estimate(files: list[FileStatus], rates: Mapping[tuple[str, str], float]) -> float | None:
    """Seconds until the files on their way are done, if each link keeps its recent pace: the
    slowest link decides. None when a link with files to go has done nothing lately."""
    waiting = Counter((f.source, f.destination) for f in files if f.state in ON_ITS_WAY)
    if not waiting:
        return 0.0
    times = []
    for link, n in waiting.items():
        rate = rates.get(link, 0.0)  # type: ignore[arg-type]  # by_task always has both sites
        if rate <= 0:
            return None
        times.append(n / rate)
    return max(times)


def task_status(
    db: Database, task: str, job: str | None = None, now: float | None = None
) -> TaskStatus:
    files = task_files(db, task, job)
    counts = counts_of(files) if job else task_counts(db, task)
    status = TaskStatus(task, job, files, counts)
    if files:
        now = time.time() if now is None else now
        links = {(f.source, f.destination) for f in files if f.state in ON_ITS_WAY}
        rates = link_rates(db, links, now)  # type: ignore[arg-type]  # by_task: both sites set
        status.rates = {f"{s}>{d}": r for (s, d), r in rates.items()}
        status.eta = estimate(files, rates)
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
