"""The simulator's report, computed from the documents at the end of a run.

* `account`: every injected file in exactly one final outcome (done, publication_failed,
  failed, killed), none missing, none that nobody injected, none completed twice.
* `Analysis`: per bucket of simulated time, files injected, completed (done), failed for good,
  failed attempts and published; the backlog (every file not in a final state, as the
  monitoring pages count it) rebuilt from every file's history; latencies in simulated seconds:
  injection → done, the same without the time the transfer service held the file (the sum of
  its attempts), and done → published.
* `Report`: the above with the store's write rate and every process's CPU from the samples
  taken during the run, the verdict (does this scale hold?), JSON and PNG plots in the style of
  the paper's figures (files completed per hour against the expected rate; backlog over time).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from aso import model
from aso.core import request
from aso.model import PUBLICATION, STATE
from aso.monitoring.summaries import BACKLOG
from aso.sim.held import HeldFile, HoldSpans, held_file
from aso.sim.workload import Plan
from aso.transfer import errors

HOUR = 3600.0
OUTCOMES = ("done", "publication_failed", "failed", "killed")
# What "holds" means: completed/expected, a bounded backlog, and the p95 of the
# time ASO itself adds to a file (injection → done without the simulated transfers).
MIN_RATIO = 0.99
MAX_P95_OVERHEAD = 300.0


# -- accounting ----------------------------------------------------------------------------------
def outcome(doc: Mapping[str, Any]) -> str:
    """The one final outcome of a request, or "unfinished"."""
    if not model.has_ended(doc):
        return "unfinished"
    if doc[STATE] == "done":
        return "publication_failed" if doc[PUBLICATION] == "publication_failed" else "done"
    return str(doc[STATE])


def times_reached(doc: Mapping[str, Any], axis: str, to: str) -> int:
    return sum(1 for h in doc.get("history", []) if h["axis"] == axis and h["to"] == to)


@dataclass
class Accounting:
    injected: int
    outcomes: dict[str, int]
    missing: list[str] = field(default_factory=list)  # injected, no document
    unexpected: list[str] = field(default_factory=list)  # a document nobody injected
    twice: list[str] = field(default_factory=list)  # done or published more than once
    unfinished: list[str] = field(default_factory=list)
    # From the transfer service's records (the job table): files with two copies at once.
    copied_twice_at_once: list[str] = field(default_factory=list)
    copies_checked: int = 0  # copies (one file in one job) looked at
    # Attempts whose job the service did not know (released, lost): by the verdict of the
    # fence that came first ("absent", "ended"); `unfenced`: files with one that had none.
    fences: dict[str, int] = field(default_factory=dict)
    unfenced: list[str] = field(default_factory=list)
    # From the catalog: published files it lacks, holds twice, or holds unpublished.
    catalog_missing: list[str] = field(default_factory=list)
    catalog_twice: list[str] = field(default_factory=list)
    catalog_unexpected: list[str] = field(default_factory=list)
    catalog_files: int | None = None  # files in the catalog (None: not checked)

    CHECKS = (
        "missing",
        "unexpected",
        "twice",
        "unfinished",
        "copied_twice_at_once",
        "unfenced",
        "catalog_missing",
        "catalog_twice",
        "catalog_unexpected",
    )

    @property
    def exact(self) -> bool:
        return (
            not any(getattr(self, name) for name in self.CHECKS)
            and sum(self.outcomes.values()) == self.injected
        )

    def problems(self) -> list[str]:
        lines = []
        for name in self.CHECKS:
            ids = getattr(self, name)
            if ids:
                more = " …" if len(ids) > 5 else ""
                lines.append(f"{len(ids)} {name}: {', '.join(ids[:5])}{more}")
        total = sum(self.outcomes.values())
        if total != self.injected:
            lines.append(f"outcomes add up to {total}, {self.injected} files were injected")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "injected": self.injected,
            "outcomes": self.outcomes,
            "exact": self.exact,
            "missing": self.missing[:100],
            "unexpected": self.unexpected[:100],
            "twice": self.twice[:100],
            "unfinished": self.unfinished[:100],
            "copied_twice_at_once": self.copied_twice_at_once[:100],
            "copies_checked": self.copies_checked,
            "fences": self.fences,
            "unfenced": self.unfenced[:100],
            "catalog_missing": self.catalog_missing[:100],
            "catalog_twice": self.catalog_twice[:100],
            "catalog_unexpected": self.catalog_unexpected[:100],
            "catalog_files": self.catalog_files,
            "problems": self.problems(),
        }

    def counts_line(self) -> str:
        """The zeros that are due, in one line."""
        catalog = (
            "catalog not checked"
            if self.catalog_files is None
            else f"catalog: {self.catalog_files} files, {len(self.catalog_missing)} missing, "
            f"{len(self.catalog_twice)} twice, {len(self.catalog_unexpected)} unexpected"
        )
        return (
            f"{self.injected} injected · {len(self.missing)} lost · "
            f"{len(self.unfinished)} not final · "
            f"{len(self.unexpected)} unexpected · {len(self.twice)} completed twice · "
            f"{len(self.copied_twice_at_once)} copied twice at once "
            f"({self.copies_checked} copies checked) · {self.fences_line()} · {catalog}"
        )

    def fences_line(self) -> str:
        """The attempts whose job the service did not know, and how each job was fenced."""
        verdicts = ", ".join(f"{n} {verdict}" for verdict, n in sorted(self.fences.items()))
        return (
            f"{sum(self.fences.values())} jobs not found fenced first ({verdicts or 'none'}), "
            f"{len(self.unfenced)} not"
        )


def account(injected: Iterable[str], docs: Iterable[Mapping[str, Any]]) -> Accounting:
    """Check that every injected file is in exactly one final outcome."""
    wanted = set(injected)
    seen: set[str] = set()
    outcomes: Counter[str] = Counter()
    fences: Counter[str] = Counter()
    result = Accounting(len(wanted), {})
    for doc in docs:
        doc_id = doc["_id"]
        if doc_id not in wanted:
            result.unexpected.append(doc_id)
            continue
        seen.add(doc_id)
        done, published = (
            times_reached(doc, STATE, "done"),
            times_reached(doc, PUBLICATION, "published"),
        )
        if done > 1 or published > 1:
            result.twice.append(doc_id)
        for attempt in doc.get("attempts") or []:
            if attempt.get("fenced") is not None:
                fences[attempt["fenced"]] += 1
            elif not_found(attempt) and doc_id not in result.unfenced:
                result.unfenced.append(doc_id)
        kind = outcome(doc)
        if kind == "unfinished":
            result.unfinished.append(doc_id)
        else:
            outcomes[kind] += 1
    result.missing = sorted(wanted - seen)
    result.outcomes = {k: outcomes.get(k, 0) for k in OUTCOMES}
    result.fences = dict(fences)
    return result


def not_found(attempt: Mapping[str, Any]) -> bool:
    """An attempt ended because the service did not know its job: released after its lease,
    lost, or killed before its job was made (aso.core.request)."""
    reason = attempt.get("reason") or ""
    return (
        attempt.get("error_class") == errors.LOST
        or reason == request.RELEASED
        or reason.startswith(request.KILLED_BEFORE_ITS_JOB)
    )


def check_copies(result: Accounting, copies: Iterable[tuple[str, float, float]]) -> None:
    """Files with two copy runs that overlap in time: (file id, start, end) per run, as the
    transfer service recorded them (the gfal worker's `runs`, the sim service's fates)."""
    runs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for file_id, start, end in copies:
        runs[file_id].append((start, end))
        result.copies_checked += 1
    for file_id, spans in runs.items():
        spans.sort()
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)):
            result.copied_twice_at_once.append(file_id)


def check_catalog(
    result: Accounting, catalog_lfns: Iterable[str], docs: Iterable[Mapping[str, Any]]
) -> None:
    """Every published file in the catalog exactly once, and nothing else of the run there."""
    held = Counter(catalog_lfns)
    published = {d["destination_lfn"] for d in docs if d.get(PUBLICATION) == "published"}
    result.catalog_files = sum(held.values())
    result.catalog_missing = sorted(lfn for lfn in published if lfn not in held)
    result.catalog_twice = sorted(lfn for lfn, n in held.items() if n > 1)
    result.catalog_unexpected = sorted(lfn for lfn in held if lfn not in published)


def recheck_catalog(
    result: Accounting,
    docs: Iterable[Mapping[str, Any]],
    read_block: Callable[[str], Mapping[str, Any] | None],
) -> list[str]:
    """The published files `check_catalog` did not find, looked for again in the block their
    document names, read at the quorum (`read_block`): the catalog is read from its `_changes`,
    one copy of each shard, which on a cluster may not have the block yet. Those found there
    are not missing; returns them."""
    if not result.catalog_missing:
        return []
    missing = set(result.catalog_missing)
    blocks: dict[str, list[str]] = defaultdict(list)
    for doc in docs:
        if doc.get("destination_lfn") in missing and doc.get("publication_block"):
            blocks[doc["publication_block"]].append(doc["destination_lfn"])
    found = []
    for name, lfns in blocks.items():
        held = block_lfns(read_block(name))
        found += [lfn for lfn in lfns if lfn in held]
    result.catalog_missing = sorted(missing - set(found))
    if result.catalog_files is not None:
        result.catalog_files += len(found)
    return sorted(found)


def recheck_twice(
    result: Accounting,
    holders: Mapping[str, Sequence[str]],
    read_block: Callable[[str], Mapping[str, Any] | None],
) -> list[str]:
    """The files `check_catalog` found in more than one block (`holders`: LFN → the blocks the
    `_changes` read showed holding it), each block read again at the quorum: one copy of a
    shard may still show a block withdrawn since (a racing publisher's). Only the blocks that
    hold the file there count; one that is in none is missing (`recheck_catalog` looks in its
    recorded block). Returns the files no longer found twice."""
    cleared = []
    for lfn in list(result.catalog_twice):
        seen = holders.get(lfn, [])
        held = [name for name in set(seen) if lfn in block_lfns(read_block(name))]
        if len(held) > 1:
            continue
        cleared.append(lfn)
        result.catalog_twice.remove(lfn)
        if result.catalog_files is not None:
            result.catalog_files -= len(seen) - len(held)
        if not held:
            result.catalog_missing = sorted({*result.catalog_missing, lfn})
    return cleared


def block_lfns(block: Mapping[str, Any] | None) -> set[str]:
    return {f["lfn"] for f in (block or {}).get("files", [])}


# -- per-bucket analysis -------------------------------------------------------------------------
def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)], 2)

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99)}


class Analysis:
    """Figures per bucket of `bucket` simulated seconds since `t0` (wall epoch)."""

    def __init__(self, t0: float, compression: float, bucket: float):
        self.t0, self.compression, self.bucket = t0, compression, bucket
        self.counts: dict[str, Counter[int]] = defaultdict(Counter)
        self.latency: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.error_classes: Counter[str] = Counter()  # failed attempts by class
        self.events: list[tuple[float, int]] = []  # (simulated time, ±1) of the backlog
        # Files a hold held (aso/core/holds.py, sim/held.py): held attempts by class, files
        # kept back (before a copy of theirs was held) by the class of the hold, and each held
        # file's simulated seconds held and outcome. `holds`: when each hold was in force.
        self.held_attempts: Counter[str] = Counter()
        self.kept_back: Counter[str] = Counter()
        self.held_seconds: list[float] = []
        self.held_files: list[tuple[HeldFile, str]] = []
        self.holds: Mapping[tuple[str, str], HoldSpans] = {}

    def sim(self, t: float) -> float:
        return (t - self.t0) * self.compression

    def index(self, t: float) -> int:
        return math.floor(self.sim(t) / self.bucket)

    def add(self, doc: Mapping[str, Any]) -> None:
        created = float(doc["created"])
        self.counts["injected"][self.index(created)] += 1
        for attempt in doc.get("attempts", []):
            if attempt.get("outcome") == "failed":
                self.error_classes[attempt.get("error_class") or "unknown"] += 1
            if attempt.get("held"):
                self.held_attempts[attempt.get("error_class") or "unknown"] += 1
        self._held(doc)
        in_backlog = False
        done_at = None
        for entry in doc.get("history", []):
            at, to = float(entry["at"]), entry["to"]
            if entry["axis"] == STATE:
                now_in = to in BACKLOG
                if now_in != in_backlog:
                    self.events.append((self.sim(at), 1 if now_in else -1))
                    in_backlog = now_in
                if to == "done" and done_at is None:
                    done_at = at
                    self._done(doc, created, at)
                elif to in ("failed", "failed_attempt", "killed"):
                    self.counts[to][self.index(at)] += 1
                    if to == "failed":
                        self.counts["ideal"][self.index(created + ideal_time(doc))] += 1
            elif entry["axis"] == PUBLICATION and to == "published" and done_at is not None:
                self.counts["published"][self.index(at)] += 1
                self.latency["publish"][self.index(at)].append((at - done_at) * self.compression)

    def _held(self, doc: Mapping[str, Any]) -> None:
        held = held_file(doc, self.holds)
        if held is not None:
            self.held_seconds.append(held.seconds * self.compression)
            self.held_files.append((held, outcome(doc)))
            self.kept_back.update(held.kept_back_by)

    def _done(self, doc: Mapping[str, Any], created: float, at: float) -> None:
        index = self.index(at)
        self.counts["done"][index] += 1
        self.counts["bytes"][index] += int(doc.get("size", 0))
        total = (at - created) * self.compression
        transfer = time_at_service(doc)
        # When a service with no overhead around it would have finished the file: the yard-
        # stick of completed/expected (see Report.steady).
        self.counts["ideal"][self.index(created + ideal_time(doc))] += 1
        self.latency["done"][index].append(total)
        self.latency["overhead"][index].append(max(0.0, total - transfer * self.compression))
        for stage, seconds in stages(doc, at).items():
            self.latency[stage][index].append(seconds * self.compression)

    # -- the backlog, rebuilt ------------------------------------------------------------------
    def backlog_series(self, step: float, end: float) -> list[tuple[float, int]]:
        """(simulated time, backlog) every `step` simulated seconds up to `end`."""
        events = sorted(self.events)
        times = [t for t, _ in events]
        running, cumulative = 0, []
        for _, delta in events:
            running += delta
            cumulative.append(running)
        series = []
        t = 0.0
        while t <= end + 1e-9:
            k = bisect.bisect_right(times, t)
            series.append((t, cumulative[k - 1] if k else 0))
            t += step
        return series

    def last_index(self) -> int:
        indices = [i for counter in self.counts.values() for i in counter]
        return max(indices, default=0)

    def latencies(self, kind: str, first: int = 0, last: int | None = None) -> list[float]:
        return [
            v
            for i, values in self.latency[kind].items()
            if i >= first and (last is None or i <= last)
            for v in values
        ]


def time_at_service(doc: Mapping[str, Any]) -> float:
    """Wall seconds the transfer service held the file, over all its attempts."""
    return sum(
        float(a["ended"]) - float(a["submitted"])
        for a in doc.get("attempts", [])
        if a.get("ended") is not None
    )


def time_cooling_off(doc: Mapping[str, Any]) -> float:
    """Wall seconds of the retry policy's cool-offs: from each `retry` entry to the end of its
    cool-off (the entry's `until`), or to the next move if that came first (a kill). A file
    still waiting for the submitter after its cool-off is queued, not cooling off (entries
    without `until`, from earlier versions, end at the retry manager's move back to `new`)."""
    total, since, until = 0.0, None, None
    for entry in doc.get("history", []):
        if entry["axis"] != STATE:
            continue
        if since is not None:
            end = float(entry["at"]) if until is None else min(float(entry["at"]), until)
            total += end - since
            since = None
        if entry["to"] == "retry":
            since, until = float(entry["at"]), entry.get("until")
    return total


def ideal_time(doc: Mapping[str, Any]) -> float:
    """Seconds from injection to the end if nothing but the transfer service and the retry
    policy's cool-offs took time."""
    return time_at_service(doc) + time_cooling_off(doc)


STAGES = ("queued", "submitting", "at_service", "reporting")


def stages(doc: Mapping[str, Any], done_at: float) -> dict[str, float]:
    """Where the last attempt of a done file spent its time: waiting for the submitter (in
    `new`, or in `retry` after its cool-off), being submitted (from the intent to `submitted`:
    0 now that the submitter writes both at once; the job's creation is then part of the time at
    the service), at the transfer service, and waiting for the monitor to see that it ended
    (→ done). What the tuning looks at."""
    marks: dict[str, float] = {}
    for entry in doc.get("history", []):
        if entry["axis"] == STATE:
            marks[entry["to"]] = float(entry["at"])
            if entry["to"] == "retry" and entry.get("until") is not None:
                marks["new"] = float(entry["until"])  # submittable again from then on
    attempts = doc.get("attempts") or []
    ended = attempts[-1].get("ended") if attempts else None
    if "new" not in marks or "submitted" not in marks or ended is None:
        return {}
    return {
        "queued": max(0.0, marks["submitted"] - marks["new"]),
        "submitting": 0.0,  # the intent and the attempt are one write (`submitted`)
        "at_service": float(ended) - marks["submitted"],
        "reporting": max(0.0, done_at - float(ended)),
    }


# -- samples taken during the run ----------------------------------------------------------------
@dataclass
class Sample:
    at: float  # wall epoch
    seq: int  # updates of the files database so far
    docs: int
    totals: Mapping[str, Mapping[str, int]]
    backlog: int | None
    cpu: Mapping[str, float]  # process name → CPU seconds so far
    rss: Mapping[str, int] = field(default_factory=dict)  # process name → resident bytes
    fds: Mapping[str, int] = field(default_factory=dict)  # process name → open descriptors


def warmup_of(plan: Plan) -> float:
    """Simulated seconds of a run left out of its steady-state figures: long enough for the
    agents' first cycles and the completions' ramp (three mean transfer times), at most half
    of the run."""
    first = max(3 * plan.mean_duration, 2 * plan.interval, 0.1 * plan.duration)
    return min(0.5 * plan.duration, first)


def write_rate(samples: Sequence[Sample], start: float, end: float) -> float | None:
    """Writes per wall second to the files database between two wall times."""
    inside = [s for s in samples if start <= s.at <= end]
    if len(inside) < 2 or inside[-1].at <= inside[0].at:
        return None
    return (inside[-1].seq - inside[0].seq) / (inside[-1].at - inside[0].at)


def cpu_shares(samples: Sequence[Sample]) -> dict[str, float]:
    """Cores used by each process (by agent: instances summed) over the sampled time."""
    if len(samples) < 2:
        return {}
    first, last = samples[0], samples[-1]
    wall = last.at - first.at
    used: defaultdict[str, float] = defaultdict(float)
    for name, seconds in last.cpu.items():
        base = first.cpu.get(name, 0.0)
        used[name.split(" ")[0]] += max(0.0, seconds - base)
    most_first = sorted(used.items(), key=lambda kv: kv[1], reverse=True)
    return {name: round(seconds / wall, 3) for name, seconds in most_first} if wall else {}


def host_of(by: str) -> str:
    """The host of an agent instance `<host>-<slot>` (history's `by`)."""
    return by.rpartition("-")[0]


def work_by_host(
    docs: Iterable[Mapping[str, Any]],
    hosts: Sequence[str],
    killed: tuple[str, float] | None = None,
) -> dict[str, Any]:
    """How the agents' work split between the hosts (history entries written by each host's
    instances) and, when a host was killed at a wall time, how long its unfinished files
    waited for their next move by anyone (the other host taking its partitions over)."""
    moves: Counter[str] = Counter()
    before_kill: Counter[str] = Counter()
    waits: list[float] = []
    for doc in docs:
        history = doc.get("history", [])
        for h in history:
            host = host_of(str(h.get("by", "")))
            if host in hosts:
                moves[host] += 1
                if killed is not None and h["at"] <= killed[1]:
                    before_kill[host] += 1
        if killed is None:
            continue
        dead, at = killed
        before = [h for h in history if h["at"] <= at]
        after = [h["at"] for h in history if h["at"] > at]
        touched = any(host_of(str(h.get("by", ""))) == dead for h in before)
        was_final = bool(before) and model.has_ended(_state_at(doc, before))
        if touched and not was_final and after:
            waits.append(min(after) - at)
    total = sum(moves.values())
    result: dict[str, Any] = {
        "moves": dict(moves),
        "shares": {h: round(moves[h] / total, 3) if total else 0.0 for h in hosts},
    }
    if killed is not None:
        total = sum(before_kill.values())
        result["shares_before_kill"] = {
            h: round(before_kill[h] / total, 3) if total else 0.0 for h in hosts
        }
        result["killed"] = {"host": killed[0], "waits": percentiles(sorted(waits))}
        result["killed"]["files"] = len(waits)
        result["killed"]["max_wait"] = round(max(waits), 1) if waits else None
    return result


def _state_at(doc: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The axes' values after these first history entries (enough for model.is_final); an
    axis that never moved keeps the value it has now."""
    moved = {h["axis"] for h in doc.get("history", [])}
    state: dict[str, Any] = {a: (None if a in moved else doc.get(a)) for a in model.AXES}
    for h in history:
        state[h["axis"]] = h["to"]
    return state


class Resources(TypedDict):
    """A process's figures at "start", "middle", "end" and their "max"."""

    rss_mb: dict[str, float]  # resident memory, MB
    fds: dict[str, int]  # open file descriptors


def resources(samples: Sequence[Sample]) -> dict[str, Resources]:
    """Each process's resident memory (MB) and open file descriptors at the start, the middle
    and the end of the run (the first, middle and last sample that saw it), and their peaks."""
    table: dict[str, Resources] = {}
    for name in sorted({n for s in samples for n in s.rss}):
        seen = [s for s in samples if name in s.rss]
        points = {"start": seen[0], "middle": seen[len(seen) // 2], "end": seen[-1]}
        table[name] = {
            "rss_mb": {k: round(p.rss[name] / 1e6, 1) for k, p in points.items()}
            | {"max": round(max(s.rss[name] for s in seen) / 1e6, 1)},
            "fds": {k: p.fds.get(name, 0) for k, p in points.items()}
            | {"max": max(s.fds.get(name, 0) for s in seen)},
        }
    return table


# -- the report ----------------------------------------------------------------------------------
@dataclass
class Report:
    plan: Plan
    started: float
    injection_end: float
    drained: float
    bucket: float
    analysis: Analysis
    accounting: Accounting
    samples: list[Sample]
    refused: dict[str, str]
    refused_count: int
    upload_retries: int
    upload_lag: list[float]
    ceiling: float | None = None
    # Updates of each of the run's databases from the agents' start to their stop (files_db,
    # transfers_db, catalog_db, stats_db), and the request documents' own share of files_db's.
    writes: dict[str, int] = field(default_factory=dict)
    request_writes: int = 0
    # Who asked the store for what: agent → "database route METHOD" → [requests, seconds].
    store_requests: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    store_profile: dict[str, Any] | None = None  # where the store's time went (sim/profile.py)
    drain_unfinished: int = 0
    chaos: dict[str, Any] | None = None  # what the chaos thread did (sim/chaos.py)
    hosts: dict[str, Any] | None = None  # the work of each agent host (work_by_host)
    # The destinations with a size limit (sim/held.py, quota_figures), one each.
    quotas: list[dict[str, Any]] = field(default_factory=list)

    # -- windows ---------------------------------------------------------------------------------
    @property
    def warmup(self) -> float:
        """Simulated seconds left out of the steady-state figures at the start."""
        return warmup_of(self.plan)

    @property
    def window(self) -> tuple[int, int]:
        """First and last bucket of the steady state: whole buckets between the warm-up and
        the injection's end."""
        return math.ceil(self.warmup / self.bucket), math.floor(
            self.plan.duration / self.bucket
        ) - 1

    def _window_files(self, kinds: Sequence[str]) -> int:
        first, last = self.window
        return sum(self.analysis.counts[k][i] for k in kinds for i in range(first, last + 1))

    @functools.cached_property
    def steady(self) -> dict[str, Any]:
        """Steady-state figures over the window (computed once: the report, its summary line
        and the benchmark's table all read them)."""
        plan, analysis = self.plan, self.analysis
        first, last = self.window
        seconds = max(0.0, (last - first + 1) * self.bucket)
        # Expected in the window: the files a transfer service with nothing around it would
        # have finished in it (each file's injection time plus the time the service held it
        # and the retry policy's cool-offs).
        # In a steady state that is the injection rate; counting injections instead would
        # compare completions with injections shifted by the (20 s mean) transfer times, whose
        # edge effects swamp a 1 % criterion in a window of minutes.
        expected_files = self._window_files(["ideal"])
        injected = self._window_files(["injected"])
        ended = self._window_files(["done", "failed"])
        series = analysis.backlog_series(self.bucket / 10, plan.duration)
        middle = (self.warmup + plan.duration) / 2
        half = [(t, b) for t, b in series if middle <= t <= plan.duration]
        slope = _slope(half)
        mean_backlog = statistics.fmean(b for _, b in half) if half else 0.0
        growth = slope * (half[-1][0] - half[0][0]) if len(half) > 1 else 0.0
        per_tick = plan.files_per_second * plan.interval
        overhead = percentiles(analysis.latencies("overhead", first, last))
        wall_start = self.started + plan.wall(first * self.bucket)
        wall_end = self.started + plan.wall((last + 1) * self.bucket)
        rate = write_rate(self.samples, wall_start, wall_end)
        expected = plan.files_per_second * seconds
        figures: dict[str, Any] = {
            "window": [first * self.bucket, (last + 1) * self.bucket],
            "design_files": round(expected),
            "injected": injected,
            "ended": ended,
            "done": self._window_files(["done"]),
            "expected_files": expected_files,
            "ratio": round(ended / expected_files, 4) if expected_files else None,
            "ratio_to_injected": round(ended / injected, 4) if injected else None,
            "injected_vs_design": round(injected / expected, 4) if expected else None,
            "completed_per_hour": round(ended * HOUR / seconds) if seconds else None,
            "expected_per_hour": round(plan.files_per_second * HOUR),
            # The same per wall hour (the machine's load): times the compression.
            "completed_per_wall_hour": (
                round(ended * HOUR / seconds * plan.compression) if seconds else None
            ),
            "backlog_mean": round(mean_backlog, 1),
            "backlog_max": max((b for _, b in series), default=0),
            "backlog_growth": round(growth, 1),
            "backlog_bounded": growth <= 0.2 * mean_backlog + per_tick,
            "latency": percentiles(analysis.latencies("done", first, last)),
            "overhead": overhead,
            "publish": percentiles(analysis.latencies("publish")),
            "stages": {k: percentiles(analysis.latencies(k, first, last)) for k in STAGES},
            "store_writes_per_s": round(rate, 1) if rate is not None else None,
            "store_writes_per_s_simulated": (
                round(rate / plan.compression, 1) if rate is not None else None
            ),
        }
        figures["holds"] = bool(
            figures["ratio"] is not None
            and figures["ratio"] >= MIN_RATIO
            and figures["backlog_bounded"]
            and overhead["p95"] is not None
            and overhead["p95"] < MAX_P95_OVERHEAD
        )
        return figures

    @property
    def writes_per_file(self) -> dict[str, float] | None:
        """Document writes per injected file over the whole run, each database's share and
        the total; `requests` is the request documents' own writes (the rest of files_db's
        are heartbeats and leases). A file's deletion by the purge comes later (+1, not in a
        run: the report reads every request at its end)."""
        files = self.accounting.injected
        if not files or not self.writes:
            return None
        shares = {name: round(count / files, 3) for name, count in self.writes.items()}
        shares["total"] = round(sum(self.writes.values()) / files, 3)
        shares["requests"] = round(self.request_writes / files, 3)
        return shares

    def requests_per_file(self, top: int = 25) -> list[dict[str, Any]]:
        """The store requests of the run per injected file, the most frequent first: who asked,
        what (database, route, method), how many per file and the mean seconds to the answer
        (a `_changes` long poll's includes its wait)."""
        files = self.accounting.injected
        rows: list[dict[str, Any]] = [
            {
                "who": who,
                "request": what,
                "per_file": round(count / files, 3) if files else None,
                "mean_s": round(seconds / count, 4) if count else None,
            }
            for who, calls in self.store_requests.items()
            for what, (count, seconds) in calls.items()
            if count
        ]
        rows.sort(key=lambda r: -(r["per_file"] or 0))
        return rows[:top]

    def rows(self) -> list[dict[str, Any]]:
        analysis, counts = self.analysis, self.analysis.counts
        last = analysis.last_index()
        series = dict(analysis.backlog_series(self.bucket, (last + 1) * self.bucket))
        rows = []
        for i in range(last + 1):
            start = i * self.bucket
            wall_start = self.started + self.plan.wall(start)
            rate = write_rate(self.samples, wall_start, wall_start + self.plan.wall(self.bucket))
            rows.append(
                {
                    "simulated_start": start,
                    "injected": counts["injected"][i],
                    "done": counts["done"][i],
                    "failed": counts["failed"][i],
                    "failed_attempts": counts["failed_attempt"][i],
                    "published": counts["published"][i],
                    "bytes_done": counts["bytes"][i],
                    "backlog_end": series.get(start + self.bucket, 0),
                    "latency": percentiles(analysis.latency["done"].get(i, [])),
                    "overhead": percentiles(analysis.latency["overhead"].get(i, [])),
                    "publish": percentiles(analysis.latency["publish"].get(i, [])),
                    "store_writes_per_s": round(rate, 1) if rate is not None else None,
                }
            )
        return rows

    def to_dict(self) -> dict[str, Any]:
        steady = self.steady
        rate = steady["store_writes_per_s"]
        return {
            "plan": self.plan.to_dict(),
            "bucket": self.bucket,
            "wall": {
                "injection": round(self.injection_end - self.started, 1),
                "drain": round(self.drained - self.injection_end, 1),
            },
            "steady": steady,
            "store_ceiling_writes_per_s": round(self.ceiling, 1) if self.ceiling else None,
            "store_use_of_ceiling": (
                round(rate / self.ceiling, 3) if rate is not None and self.ceiling else None
            ),
            "writes_per_file": self.writes_per_file,
            "store_requests_per_file": self.requests_per_file(),
            "store_profile": self.store_profile,
            "cpu_cores": cpu_shares(self.samples),
            "resources": self.resources,
            "resource_samples": [
                {
                    "at": round(sample.at - self.started, 1),
                    "rss_mb": {k: round(v / 1e6, 1) for k, v in sample.rss.items()},
                    "fds": dict(sample.fds),
                }
                for sample in self.samples
            ],
            "failed_attempts_by_class": dict(self.analysis.error_classes.most_common()),
            "holds": {
                "files": len(self.analysis.held_seconds),
                "held_attempts_by_class": dict(self.analysis.held_attempts.most_common()),
                "kept_back_by_class": dict(self.analysis.kept_back.most_common()),
                "held_seconds": percentiles(self.analysis.held_seconds),
                "byte_quotas": self.quotas,
            },
            "accounting": self.accounting.to_dict(),
            "chaos": self.chaos,
            "hosts": self.hosts,
            "drain_unfinished": self.drain_unfinished,
            "uploads": {
                "refused": self.refused_count,
                "refused_examples": self.refused,
                "retried_calls": self.upload_retries,
                "lag": percentiles(self.upload_lag),
            },
            "rows": self.rows(),
        }

    def summary_line(self) -> str:
        s = self.steady
        use = ""
        if self.ceiling and s["store_writes_per_s"] is not None:
            use = (
                f" · store {s['store_writes_per_s']:.0f} writes/s of a {self.ceiling:.0f}/s "
                f"ceiling ({s['store_writes_per_s'] / self.ceiling:.0%})"
            )
        shares = self.writes_per_file
        if shares:
            use += f" · {shares['total']:.2f} writes/file ({writes_text(shares)})"
        return (
            f"{self.plan.scale:g}x: completed/expected {s['ratio']} · backlog max "
            f"{s['backlog_max']} (growth {s['backlog_growth']:+.0f}) · injection→done p50/p95/p99 "
            f"{_fmt(s['latency'])} s · without transfers {_fmt(s['overhead'])} s · "
            f"done→published {_fmt(s['publish'])} s{use} · "
            f"{'HOLDS' if s['holds'] else 'does not hold'} · accounting "
            f"{'exact' if self.accounting.exact else 'NOT exact'}"
        )

    def extra_lines(self) -> list[str]:
        """The accounting's counts, and what the chaos and the hosts did, when there were any."""
        lines = [f"accounting: {self.accounting.counts_line()}"]
        lag = percentiles(self.upload_lag)
        if lag["p95"] is not None:
            # The yardstick counts from the injection times: uploads that lag behind them (the
            # job wrappers waiting for the store) are counted against ASO (docs/performance.md,
            # CouchDB at 30x).
            line = f"uploads: lag behind the injection times p50/p95 {lag['p50']}/{lag['p95']} s"
            if lag["p95"] > self.plan.interval:
                line += " (more than an injection interval: the uploads limit this run)"
            lines.append(line)
        if self.analysis.held_seconds:
            held = percentiles(self.analysis.held_seconds)
            classes = ", ".join(f"{c} {n}" for c, n in self.analysis.held_attempts.most_common())
            back = ", ".join(f"{c} {n}" for c, n in self.analysis.kept_back.most_common())
            lines.append(
                f"holds: {len(self.analysis.held_seconds)} files held ({classes or 'no'} attempts"
                f" held; kept back before sending: {back or 'none'}), "
                f"held p50/p95 {held['p50']}/{held['p95']} s"
            )
        lines += [quota_line(q) for q in self.quotas]
        if self.store_profile:
            lines.append(profile_line(self.store_profile))
        if self.chaos is not None:
            c = self.chaos
            lines.append(
                f"chaos: {c['kills']} agent processes killed · {c['store_restarts']} store "
                f"restarts · {c['hosts_killed']} hosts killed · "
                f"{c.get('nodes_restarted', 0)} store nodes killed and restarted · outages: "
                + (", ".join(_outage_text(o) for o in self.plan.outages) or "none")
            )
        if self.hosts is not None:
            shares = " · ".join(f"{h} {v:.0%}" for h, v in self.hosts["shares"].items())
            line = f"hosts: share of the agents' moves {shares}"
            if "shares_before_kill" in self.hosts:
                before = self.hosts["shares_before_kill"].items()
                line += " (before the kill: " + " · ".join(f"{h} {v:.0%}" for h, v in before) + ")"
            if "killed" in self.hosts:
                k = self.hosts["killed"]
                line += (
                    f" · after {k['host']} died, its {k['files']} unfinished files waited "
                    f"p50/p95/max {_fmt(k['waits']).rsplit('/', 1)[0]}/{k['max_wait']} s "
                    "for their next move"
                )
            lines.append(line)
        resources = self.to_resources_line()
        if resources:
            lines.append(resources)
        return lines

    @functools.cached_property
    def resources(self) -> dict[str, Resources]:
        """Memory and open files per process (computed once: the JSON and the summary)."""
        return resources(self.samples)

    def to_resources_line(self) -> str:
        table = self.resources
        if not table:
            return ""
        rss = max(table.items(), key=lambda kv: kv[1]["rss_mb"]["max"])
        fds = max(table.items(), key=lambda kv: kv[1]["fds"]["max"])
        return (
            f"resources: largest RSS {rss[0]} {rss[1]['rss_mb']['max']} MB · most open files "
            f"{fds[0]} {fds[1]['fds']['max']}"
        )

    # -- plots -----------------------------------------------------------------------------------
    def plot(self, out: Path) -> list[Path]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        paths = []
        for name, draw in (("completed", self.draw_completed), ("backlog", self.draw_backlog)):
            fig, ax = plt.subplots(figsize=(8, 4))
            draw(ax)
            fig.tight_layout()
            paths.append(out / f"{name}.png")
            fig.savefig(paths[-1], dpi=100)
            plt.close(fig)
        return paths

    def draw_completed(self, ax: Any, label: str = "") -> None:
        """Files completed per hour (bars per bucket) against the expected rate."""
        counts, per_hour = self.analysis.counts, HOUR / self.bucket
        last = self.analysis.last_index()
        xs = [(i + 0.5) * self.bucket / 60 for i in range(last + 1)]
        ended = [(counts["done"][i] + counts["failed"][i]) * per_hour for i in range(last + 1)]
        ax.bar(xs, ended, width=self.bucket / 60 * 0.9, label=f"{label}completed", alpha=0.7)
        ax.axhline(
            self.plan.files_per_second * HOUR,
            color="red",
            linestyle="--",
            label=f"{label}expected ({self.plan.scale:g}x design)",
        )
        ax.axvline(self.plan.duration / 60, color="grey", linestyle=":", label="injection ends")
        ax.set_xlabel("simulated minutes")
        ax.set_ylabel("files per hour")
        ax.set_title(f"Files completed per hour, {self.plan.scale:g}x design load")
        ax.legend(loc="lower right", fontsize="small")

    def draw_backlog(self, ax: Any, label: str = "") -> None:
        last = self.analysis.last_index()
        series = self.analysis.backlog_series(self.bucket / 10, (last + 1) * self.bucket)
        ax.plot([t / 60 for t, _ in series], [b for _, b in series], label=f"{label}backlog")
        ax.axvline(self.plan.duration / 60, color="grey", linestyle=":", label="injection ends")
        ax.set_xlabel("simulated minutes")
        ax.set_ylabel("files not yet final")
        ax.set_title(f"Backlog, {self.plan.scale:g}x design load")
        ax.legend(loc="upper right", fontsize="small")


def _slope(points: Sequence[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


def quota_line(q: Mapping[str, Any]) -> str:
    """ "quota T2_X (20.0 GB, 0-120 s): ..." : what a destination with a size limit took,
    refused and held."""
    held = q["held_seconds"]
    others = "".join(f", {n} {end}" for end, n in q["held_outcomes"].items() if end != "done")
    return (
        f"quota {q['site']} ({gigabytes(q['limit_bytes'])}, {q['start']:.0f}-{q['end']:.0f} s): "
        f"{gigabytes(q['landed_bytes'])} landed in {q['landed_copies']} copies "
        f"({'within' if q['within_limit'] else 'OVER'} the limit; "
        f"{'as' if q['ledger_agrees'] else 'NOT as'} the files record), "
        f"{q['refused_copies']} copies refused (quota), {q['failed_for_room']} files failed for "
        f"room · {q['hold_starts']} "
        f"holds started ({q['hold_starts_by_admission']} by admission) · {q['files_held']} files "
        f"held ({q['files_kept_back']} kept back before sending), {q['held_done']} of them "
        f"done{others}, held p50/p95 {held['p50']}/{held['p95']} s"
    )


def gigabytes(size: int) -> str:
    return f"{size / 1e9:.1f} GB"


def _outage_text(outage: Mapping[str, Any]) -> str:
    what = f"site {outage['site']}" if "site" in outage else f"link {outage.get('link')}"
    full = f" full at {gigabytes(outage['bytes'])}" if outage.get("bytes") is not None else " full"
    how = {"timeout": " frozen", "quota": full, "permission": f" refusing {outage.get('user')}"}
    return (
        f"{what}{how.get(outage.get('class', ''), '')} {outage['start']:.0f}-{outage['end']:.0f} s"
    )


def _fmt(p: Mapping[str, float | None]) -> str:
    return "/".join("–" if p[k] is None else f"{p[k]:.0f}" for k in ("p50", "p95", "p99"))


WRITE_SHARES = {
    "files_db": "files",
    "transfers_db": "jobs",
    "catalog_db": "catalog",
    "stats_db": "stats",
}


def writes_text(shares: Mapping[str, float]) -> str:
    """ "files 5.10 (requests 5.00) · jobs 0.70 · ...": each database's writes per file."""
    parts = []
    for name, short in WRITE_SHARES.items():
        if name in shares:
            text = f"{short} {shares[name]:.2f}"
            if name == "files_db" and "requests" in shares:
                text += f" (requests {shares['requests']:.2f})"
            parts.append(text)
    return " · ".join(parts)


def profile_line(profile: Mapping[str, Any]) -> str:
    """ "store profile: ..." : where the store's time went (sim/profile.py)."""
    if "error" in profile:
        return f"store profile: {profile['error']}"
    if profile.get("engine") == "couchdb":
        per_file = profile.get("per_file", {})
        return "store profile (CouchDB, per file injected): " + " · ".join(
            f"{k} {v:g}" for k, v in per_file.items()
        )
    kinds = " · ".join(f"{k} {v:.0%}" for k, v in profile.get("kinds", {}).items())
    return (
        f"store profile ({profile['busy_share_of_span']:.0%} busy over {profile['span_s']:.0f} s):"
        f" {kinds}"
    )
