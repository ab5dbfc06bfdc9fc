"""What every agent shares: identity, heartbeats, the partition of work, the daemon loop.

An agent module (agents/*.py) gives the core logic as plain functions over documents and a
small `Agent` subclass naming its work kinds, its partition key and its `cycle`. This module
runs it the way Rucio's daemons run theirs: a thin loop that refreshes the work set, keeps the
instance's heartbeat, works out which part of the work is this instance's, runs one cycle,
sleeps (on the `_changes` long poll, so new work wakes it), and stops cleanly on SIGTERM/SIGINT.

Partition: the live instances of an agent are those whose heartbeat is younger than
`agents.heartbeat_expiry`; sorted by name, instance i of n takes the documents whose partition
key hashes to i modulo n. When an instance dies its heartbeat expires and the others take its
part; a write that races (two instances for a moment think a document theirs) is settled by the
store: one write wins, the other gets a 409 and skips the document.

Errors: a store error cuts a cycle short and the loop tries again. Any other error in a cycle is
logged with its traceback, counted (`aso_agent_cycle_errors_total`) and retried after a growing
pause: it never ends the process, which would only be restarted into the same error. An agent
that fails on one document goes on with the rest and tries it again next cycle; after
`agents.set_aside_after` errors in a row it sets the document aside (`Cycle.acted_on`: a
terminal or parked state with the reason, counted in `aso_documents_set_aside_total`).

Each cycle gets a `Cycle` context (instance, partition, store, clock, figures, the write
helper and the error policy) rather than hooks assigned to the agent.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import logging
import math
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from aso import metrics, model
from aso.config import Config
from aso.core import request
from aso.feedrelay import RELAY_ENV, feed_for
from aso.store import Conflict, Database, Server, StoreError
from aso.workqueue import ChangesWorkSet

log = logging.getLogger("aso.agent")


def set_aside_reason(agent: str, doc: Mapping[str, Any], exc: BaseException) -> str:
    """The reason an agent records on a request it could not act on (`exc`), after logging it
    with the traceback and counting it: the request then leaves the agent's work, so that one
    document cannot stop it or the files that come after it."""
    metrics.SET_ASIDE.labels(agent).inc()
    log.error(
        "%s: request %s set aside: %s",
        agent,
        doc.get("_id"),
        exc,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return error_reason(agent, exc)


def error_reason(agent: str, exc: BaseException) -> str:
    """What went wrong, for people: the agent, the error, and where in the code."""
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" at {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno}" if where else ""
    return f"{agent} could not act on this request ({type(exc).__name__}{at}): {exc}"[:4096]


def cycle_line(report: Mapping[str, Any]) -> str:
    """What a cycle did, in one line for the log: its work, time and every count it made (the
    files' own stories are in their documents, and at DEBUG)."""
    counts = ", ".join(
        f"{key} {value}"
        for key, value in report.items()
        if key not in ("work", "seconds") and isinstance(value, int | float) and value
    )
    return f"cycle of {report.get('seconds', 0):.2f} s over {report.get('work', 0)} files: {counts}"


class StopFlag:
    """Stop request set from a signal handler. A plain attribute, no lock: a handler runs
    between two bytecodes of the main thread, and one that takes a lock the interrupted code
    holds (threading.Event.set inside Event.wait) deadlocks the process for good."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, waking within 0.1 s of a stop request."""
        deadline = time.monotonic() + timeout
        while not self._set:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(0.1, left))
        return self._set

    def install(self, *signals: signal.Signals) -> None:
        for sig in signals or (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.set())


def default_instance() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def partition_of(key: str, parts: int) -> int:
    digest = hashlib.sha1(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % parts


@dataclass
class Membership:
    """Which instances of one agent are alive, and which of them this one is."""

    instance: str
    live: list[str] = field(default_factory=list)

    @property
    def index(self) -> int:
        return self.live.index(self.instance) if self.instance in self.live else 0

    @property
    def size(self) -> int:
        return max(1, len(self.live))

    def mine(self, key: str) -> bool:
        return partition_of(key, self.size) == self.index


class Heartbeat:
    """The instance's heartbeat document in the files database."""

    def __init__(self, db: Database, agent: str, instance: str):
        self.db, self.agent, self.instance = db, agent, instance
        self.doc_id = model.heartbeat_id(agent, instance)
        self.started = time.time()
        self.cycles = 0
        self.totals: dict[str, float] = {}
        self.metrics: str | None = None  # host:port of this instance's /metrics
        self._rev: str | None = None

    def beat(self, last_cycle: Mapping[str, Any] | None = None, stopped: bool = False) -> None:
        now = time.time()
        doc: dict[str, Any] = {
            "_id": self.doc_id,
            "type": model.HEARTBEAT_TYPE,
            "agent": self.agent,
            "instance": self.instance,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": self.started,
            "last_seen": now,
            "stopped": now if stopped else None,
            "cycles": self.cycles,
            "totals": self.totals,
            "metrics": self.metrics,
        }
        if last_cycle is not None:
            doc["last_cycle"] = dict(last_cycle)
        for _ in range(3):
            if self._rev:
                doc["_rev"] = self._rev
            try:
                self._rev = self.db.put(doc)
                return
            except Conflict:
                current = self.db.get(self.doc_id)
                self._rev = current["_rev"] if current else None
                doc.pop("_rev", None)

    def live_instances(self, expiry: float) -> list[str]:
        prefix = f"heartbeat:{self.agent}:"
        beats = self.db.all_docs(prefix, prefix + "\ufff0")
        now = time.time()
        live = {
            doc["instance"]
            for doc in beats
            if not doc.get("stopped") and now - doc["last_seen"] < expiry
        }
        live.add(self.instance)
        return sorted(live)


class DocumentErrors:
    """The harness's error policy for single documents: an error of the agent's own on one
    request leaves it as it is for the next cycle, `agents.set_aside_after` - 1 times in a row;
    then the agent sets it aside (aso/core/request.py set_aside) with the reason this gives, so
    that one document cannot hold up the agent for good. Kept by the runner across cycles."""

    def __init__(self, agent: str, set_aside_after: int):
        self.agent = agent
        self.set_aside_after = set_aside_after
        self.in_a_row: dict[str, int] = {}  # request id → errors of ours on it in a row

    def failed(self, doc: Mapping[str, Any], exc: BaseException) -> str | None:
        """None: leave `doc` for the next cycle; else the reason to set it aside with."""
        doc_id = str(doc.get("_id"))
        errors = self.in_a_row.get(doc_id, 0) + 1
        if errors < self.set_aside_after:
            self.in_a_row[doc_id] = errors
            metrics.DOCUMENT_ERRORS.labels(self.agent).inc()
            log.warning(
                "%s: request %s: error %d of %d before it is set aside: %s",
                self.agent,
                doc_id,
                errors,
                self.set_aside_after,
                error_reason(self.agent, exc),
                exc_info=(type(exc), exc, exc.__traceback__),
            )
            return None
        self.in_a_row.pop(doc_id, None)
        return set_aside_reason(self.agent, doc, exc)

    def succeeded(self, doc: Mapping[str, Any]) -> None:
        """The agent acted on `doc` without an error: its count starts again."""
        self.in_a_row.pop(str(doc.get("_id")), None)


@dataclass
class Cycle:
    """What the harness hands an agent for one cycle, instead of hooks assigned to it (as
    Rucio's daemons get their heartbeat, partition and session from the loop): who and where
    it is, its part of the work, the store, the clock, the cycle's figures, and the two things
    every agent does the same way (write and count; guard each document with the error policy).
    """

    instance: str
    partition: Membership
    db: Database
    work: list[dict[str, Any]]  # this instance's part of the work set
    # The whole work set, for global counts (a site's active files over every instance's links).
    everything: Mapping[str, dict[str, Any]]
    errors: DocumentErrors
    clock: Callable[[], float] = time.time
    # The cycle's figures: the heartbeat's last cycle and totals, the metrics' counts.
    report: dict[str, Any] = field(default_factory=dict)
    # The harness's work set learns every document written (at once, not from the feed).
    on_written: Callable[[list[dict[str, Any]]], None] = lambda docs: None
    # A long cycle calls it as it makes progress (a file checked): the harness re-arms its hang
    # watchdog and keeps the heartbeat fresh, so only a turn that waits on nothing is killed.
    alive: Callable[[], None] = lambda: None
    now: float = field(init=False)  # the cycle's start, from `clock`

    def __post_init__(self) -> None:
        self.now = self.clock()

    def counts(self, *keys: str) -> dict[str, Any]:
        """The report, with each of `keys` at 0 unless counted already (so that the heartbeat
        shows a zero rather than nothing)."""
        for key in keys:
            self.report.setdefault(key, 0)
        return self.report

    def count(self, key: str, n: int = 1) -> None:
        self.report[key] = self.report.get(key, 0) + n

    def write(self, updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Write `updates` in one bulk request; returns the documents as written. One that
        conflicts (someone acted on it first: another instance, the owner's kill) is left as it
        is, counted in report["conflicts"] and logged."""
        if not updates:
            return []
        written = []
        for doc, result in zip(updates, self.db.bulk_write(updates), strict=True):
            if result.ok:
                written.append(dict(doc, _rev=result.rev))
                continue
            self.count("conflicts")
            log.debug(
                "%s: file %s left as it is: %s (%s)",
                self.errors.agent,
                doc["_id"],
                result.error,
                result.reason,
            )
        self.note_written(written)
        return written

    def note_written(self, docs: list[dict[str, Any]]) -> None:
        """Documents written by another call than `write` (Database.write_decided)."""
        self.on_written(docs)

    def acted_on(
        self, act: Callable[..., dict[str, Any] | None], doc: dict[str, Any], *args: Any
    ) -> dict[str, Any] | None:
        """`act(doc, *args)` (the document to write for `doc`, or None: nothing to write yet),
        guarded: an error of ours leaves `doc` as it is (None) for the next cycle, then gives
        `doc` set aside once the error policy says so."""
        try:
            result = act(doc, *args)
        except Exception as exc:
            reason = self.errors.failed(doc, exc)
            return (
                None if reason is None else request.set_aside(doc, self.instance, self.now, reason)
            )
        self.errors.succeeded(doc)
        return result


class Agent:
    """Base of the agents: name, work kinds, partition key, one cycle of work."""

    name = "agent"
    # Work kinds of the files database this agent follows; none: the agent finds its work
    # elsewhere (the gfal worker's job table) and its cycle runs every `idle` seconds.
    kinds: tuple[str, ...] = ()

    # Whether `observe` wants every document of the `_changes` feed (not only the work).
    observes = False
    # Counts of a cycle's report that say what waits, not what was done: a cycle with only
    # these waits for new work as an idle one does.
    waiting: tuple[str, ...] = ()
    # Queue kinds whose requests `observe` is also given, from the queue view, whenever the
    # work set starts (after `forget`): what was written before the feed's start position.
    observed_kinds: tuple[str, ...] = ()

    def __init__(
        self, config: Config, instance: str | None = None, *, server: Server | None = None
    ):
        """`server`: the store as this agent sees it (default: the agent account of
        `config`'s store; a test gives another, e.g. its in-memory store)."""
        self.config = config
        self.instance = instance or default_instance()
        self.server = server if server is not None else Server.from_config(config, account="agent")
        self.db = self.server.db(config.store.files_db)

    def partition_key(self, doc: Mapping[str, Any]) -> str:
        return cast(str, doc["_id"])

    def cycle(self, ctx: Cycle) -> None:
        """Act on this instance's part of the work (`ctx.work`), writing through `ctx.write`
        and counting what was done in `ctx.report` (the heartbeat's and the metrics' figures)."""
        raise NotImplementedError

    def observe(self, doc: Mapping[str, Any]) -> None:
        """Every document of the `_changes` feed, when `observes` is set."""

    def due_without_work(self) -> bool:
        """Whether the next cycle runs even with no work of its kinds (a periodic pass of an
        agent that follows the feed: the cleaner's discard of failed files' copies)."""
        return False

    def forget(self) -> None:
        """The work set starts (again, after a gap in the feed): what `observe` learnt so far
        is replaced by what the queue view's `observed_kinds` and the feed tell from now on."""

    def close(self) -> None:
        """Release back-end resources."""

    @property
    def idle(self) -> float:
        """Seconds to wait when a cycle did nothing (agents with work kinds wait on the feed)."""
        return self.config.agents.poll_interval

    def pause(self, mine: list[dict[str, Any]]) -> tuple[float, bool]:
        """After a cycle that did nothing: how long to wait, and whether a change in the
        database should end the wait early (the feed) or only time. Agents whose work is to
        ask someone else at a steady pace (the monitor polling the transfer service) wait on
        time: woken by every unrelated write, their polls bunched up after each upload."""
        return self.idle, bool(self.kinds)


class PeriodicAgent(Agent):
    """An agent without work kinds that acts every `interval` seconds (at once when it starts)
    and only as the first live instance. It wakes every min(interval, heartbeat interval)
    seconds so that its heartbeat stays fresh."""

    def __init__(
        self, config: Config, instance: str | None = None, *, server: Server | None = None
    ):
        super().__init__(config, instance, server=server)
        self.last_run: float | None = None  # monotonic time of the last run

    @property
    def interval(self) -> float:
        raise NotImplementedError

    @property
    def idle(self) -> float:
        return min(self.interval, self.config.agents.heartbeat_interval)

    def take_turn(self, membership: Membership) -> bool:
        """True (and the run is recorded as started) when this instance should act now."""
        if membership.index != 0:
            return False
        now = time.monotonic()
        if self.last_run is not None and now - self.last_run < self.interval:
            return False
        self.last_run = now
        return True


class Runner:
    """Runs one agent instance until stopped."""

    def __init__(self, agent: Agent):
        self.agent = agent
        self.config = agent.config
        self.stop_event = StopFlag()
        self.heartbeat = Heartbeat(agent.db, agent.name, agent.instance)
        self.membership = Membership(agent.instance, [agent.instance])
        observer = agent.observe if agent.observes else None
        feed = feed_for(agent.db, self.config, os.environ.get(RELAY_ENV))
        self.workset = ChangesWorkSet(
            agent.db,
            agent.kinds,
            observer=observer,
            feed=feed,
            observed_kinds=agent.observed_kinds,
            on_start=agent.forget,
        )
        self.errors = DocumentErrors(agent.name, self.config.agents.set_aside_after)
        self.clock: Callable[[], float] = time.time
        self._last_beat = 0.0
        self._last_cycle: dict[str, Any] = {}
        self._last_feed = -math.inf  # monotonic time of the last read of the changes feed

    def install_signal_handlers(self) -> None:
        self.stop_event.install()
        # `kill -USR1 PID` writes every thread's Python stack into the agent's log (stderr):
        # what a stuck agent is waiting for. faulthandler writes from the signal handler
        # itself, so it answers even when no Python code can run (a thread holding the GIL).
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)

    def arm_watchdog(self) -> None:
        """(Re)start the countdown of `agents.hang_timeout` for the loop's next turn (or, from
        `Cycle.alive`, for the rest of a long one). A turn that outlasts it means the agent
        waits on something that will not come (a request never answered, a lock never
        released): faulthandler's own thread, which needs no Python lock, then writes every
        thread's stack into the log and exits with code 1, and the supervisor starts the agent
        again. A stuck agent looks alive and does nothing; a
        restarted one takes its work back (its leases are in its instance name)."""
        if self.config.agents.hang_timeout > 0:
            faulthandler.dump_traceback_later(self.config.agents.hang_timeout, exit=True)

    def run(self, *, once: bool = False) -> None:
        agent = self.agent
        log.info("%s %s starting (store %s)", agent.name, agent.instance, agent.server.url)
        self.arm_watchdog()  # start-up talks to the store too
        self.serve_metrics()
        self._beat(force=True)
        if agent.kinds:
            self.workset.start()
        failures = 0  # cycles failed in a row by an error of the agent's own
        try:
            while not self.stop_event.is_set():
                self.arm_watchdog()
                try:
                    self.step(wait=not once)
                    failures = 0
                except StoreError as exc:
                    # The store is down or refusing: back off, keep what we know, try again.
                    log.warning("%s %s: store error, retrying: %s", agent.name, agent.instance, exc)
                    metrics.AGENT_STORE_ERRORS.labels(agent.name).inc()
                    self.stop_event.wait(min(30.0, self.config.agents.poll_interval))
                except Exception:
                    # A bug, or a back end failing in a way it should not: exiting would only
                    # have the supervisor start us into the same error. Log it, count it, pause
                    # longer each time (up to a heartbeat interval, so that the instance keeps
                    # its part of the work) and count it in the heartbeat for the operator.
                    failures += 1
                    agents = self.config.agents
                    pause = min(agents.heartbeat_interval, agents.poll_interval * 2**failures)
                    log.exception(
                        "%s %s: cycle failed (%d in a row), next try in %.0f s",
                        agent.name,
                        agent.instance,
                        failures,
                        pause,
                    )
                    metrics.AGENT_CYCLE_ERRORS.labels(agent.name).inc()
                    self.heartbeat.totals["cycle_errors"] = (
                        self.heartbeat.totals.get("cycle_errors", 0) + 1
                    )
                    self.stop_event.wait(pause)
                if once:
                    break
        finally:
            faulthandler.cancel_dump_traceback_later()  # stopping: the grace period rules now
            agent.close()
            with contextlib.suppress(StoreError):
                self.heartbeat.beat(self._last_cycle, stopped=True)
            log.info("%s %s stopped", agent.name, agent.instance)

    def context(
        self,
        work: list[dict[str, Any]],
        everything: Mapping[str, dict[str, Any]] | None = None,
    ) -> Cycle:
        """The context of a cycle over `work` (this instance's part of `everything`)."""
        return Cycle(
            instance=self.agent.instance,
            partition=self.membership,
            db=self.agent.db,
            work=work,
            everything=self.workset.docs if everything is None else everything,
            errors=self.errors,
            clock=self.clock,
            on_written=self._apply_own_writes,
            alive=self._still_alive,
        )

    def _still_alive(self) -> None:
        self.arm_watchdog()
        self._beat()

    def read_feed(self, wait: float | None = None) -> None:
        """Apply the changes since the last read (a long poll of up to `wait` seconds)."""
        self._last_feed = time.monotonic()
        self.workset.refresh(wait=wait)

    def feed_due_in(self) -> float:
        """Seconds until the feed may be read again: each instance reads it at most once per
        `agents.feed_interval`, so that under load a read gathers many changes. Every agent
        reads every change: woken by each one, six agents made ~10 feed requests per file."""
        return max(0.0, self._last_feed + self.config.agents.feed_interval - time.monotonic())

    def step(self, wait: bool = True) -> dict[str, Any]:
        agent = self.agent
        if agent.kinds and self.feed_due_in() == 0:
            self.read_feed()
        self._beat()
        mine = [
            doc
            for doc in self.workset.docs.values()
            if self.membership.mine(agent.partition_key(doc))
        ]
        started = time.monotonic()
        report: dict[str, Any] = {}
        if mine or not agent.kinds or agent.due_without_work():
            ctx = self.context(mine)
            agent.cycle(ctx)
            report = ctx.report
        seconds = time.monotonic() - started
        report = {"work": len(mine), "seconds": round(seconds, 3), **report}
        metrics.AGENT_CYCLES.labels(agent.name).inc()
        metrics.AGENT_CYCLE_SECONDS.labels(agent.name).observe(seconds)
        metrics.AGENT_WORK.labels(agent.name).set(len(mine))
        self._last_cycle = report
        busy = self._did_something(report)
        if busy:
            log.info("%s %s: %s", agent.name, agent.instance, cycle_line(report))
        self.heartbeat.cycles += 1
        for key, value in report.items():
            if isinstance(value, int | float) and key not in ("work", "seconds"):
                self.heartbeat.totals[key] = self.heartbeat.totals.get(key, 0) + value
        if wait and not busy:
            seconds, on_feed = agent.pause(mine)
            if on_feed:
                # Nothing to do: wait on the feed, so that new work wakes us at once (once the
                # feed interval has passed: what changes meanwhile is read in one go).
                pause = self.feed_due_in()
                if pause and self.stop_event.wait(min(pause, seconds)):
                    return report
                self.read_feed(wait=max(0.0, seconds - pause))
            else:
                self.stop_event.wait(seconds)
        return report

    def _did_something(self, report: Mapping[str, Any]) -> bool:
        """Whether a cycle moved anything: counts of what waits (`Agent.waiting`: files held
        back, held, deferred) are no work done (round 30: a submitter with held files cycled
        67 times a second, each reading the holds)."""
        quiet = ("work", "seconds", *self.agent.waiting)
        return any(isinstance(v, int) and v > 0 for k, v in report.items() if k not in quiet)

    def _beat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_beat < self.config.agents.heartbeat_interval:
            return
        self._last_beat = now
        self.heartbeat.beat(self._last_cycle)
        live = self.heartbeat.live_instances(self.config.agents.heartbeat_expiry)
        if live != self.membership.live:
            log.info(
                "%s %s: live instances %s (I am %d of %d)",
                self.agent.name,
                self.agent.instance,
                live,
                live.index(self.agent.instance) + 1,
                len(live),
            )
        self.membership.live = live

    def serve_metrics(self) -> None:
        """Serve this instance's Prometheus metrics (metrics.port upward) and say where in the
        heartbeat, for `aso metrics targets`."""
        settings, agent = self.config.metrics, self.agent
        port = metrics.serve_agent(settings.host, settings.port)
        if port is not None:
            self.heartbeat.metrics = metrics.address(settings.host, port)
            metrics.AGENT_INFO.labels(agent.name, agent.instance, socket.gethostname()).set(1)

    def _apply_own_writes(self, docs: list[dict[str, Any]]) -> None:
        known = self.workset.docs
        before = {doc["_id"]: known[doc["_id"]] for doc in docs if doc["_id"] in known}
        metrics.record_writes(self.agent.name, docs, before)
        self.workset.apply(docs)
