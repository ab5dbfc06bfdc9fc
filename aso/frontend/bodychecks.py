"""The gate's checks of request bodies that cost, in processes of their own.

Parsing and judging JSON holds the interpreter: in the front end's own process one user's
bodies, checked in its threads, made every other client wait for the reactor (another user's
`GET /_session` took seconds). A body of `IN_PROCESS_FROM` bytes or more, or of more than
`IN_PROCESS_VALUES` values (counted on its bytes: 64 KiB of `[{},{},...]` had cost 45 ms), is
checked by one of `frontend.body_processes` worker processes (spawned, not forked: the front
end runs threads); the front end's thread only waits for the answer, and each user has at most
`turns` bodies at the workers at once, so that one user's bodies never hold every worker.
Smaller bodies stay in the thread, where a round trip to a process would cost more than the
check. A body that would be forwarded larger than `frontend.max_body` is refused where it was
made, not sent back to the front end first.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import logging
import multiprocessing
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, fields
from typing import Any

from aso.config import Config
from aso.frontend import gate, routes

log = logging.getLogger("aso.frontend")

IN_PROCESS_FROM = 64 * 1024
IN_PROCESS_VALUES = 2000
TRIM_FROM = 1 << 20  # a worker gives its free memory back after a body this large
# A Forward's fields but its route, which travels by name (a route holds functions).
_CARRIED = tuple(f.name for f in fields(gate.Forward) if f.name != "route")

# A worker process's route table and body bound, set once when it starts.
_table: tuple[routes.Route, ...] = ()
_max_body = 0


_LIBC = ctypes.util.find_library("c")


def give_back_memory() -> None:
    """Return the C heap's free pages to the system (glibc keeps them in each thread's arena:
    a parsed 58 MiB body had left the front end 800 MB larger for good)."""
    with contextlib.suppress(OSError, AttributeError, TypeError):  # not glibc: nothing to trim
        ctypes.CDLL(_LIBC).malloc_trim(0)


def costly(body: bytes) -> bool:
    """Whether checking `body` costs more than a round trip to a worker (its bytes, or its
    values as parse_json bounds them: a container's first item, and one after each comma)."""
    if len(body) >= IN_PROCESS_FROM:
        return True
    return body.count(b",") + body.count(b"{") + body.count(b"[") >= IN_PROCESS_VALUES


@dataclass(frozen=True)
class Asked:
    """A request as the gate judges it: its method, target, body, the audiences of the user's
    roles and the content type it came with (picklable: it travels to the workers)."""

    method: bytes
    target: bytes
    body: bytes
    audiences: frozenset[str]
    content_type: bytes
    caller: str = ""  # the name the client maps to (a route of a user's own document)


def bounded_check(
    asked: Asked, table: tuple[routes.Route, ...], max_body: int
) -> gate.GateRefusal | gate.Forward:
    """gate.check's verdict, and a body that would be forwarded larger than `max_body` refused:
    re-serialised (non-ASCII escaped, numbers as Python writes them), a body may grow (60 MiB
    of 4-byte characters had become 180 MiB)."""
    verdict = gate.check(
        asked.method,
        asked.target,
        asked.body,
        asked.audiences,
        table,
        asked.content_type,
        asked.caller,
    )
    if isinstance(verdict, gate.Forward) and verdict.body and len(verdict.body) > max_body:
        reason = f"the body as forwarded exceeds frontend.max_body ({len(verdict.body)} bytes)"
        return gate.GateRefusal(413, "too_large", reason)
    return verdict


def _start_worker(config: Config) -> None:
    global _table, _max_body
    _table, _max_body = routes.table(config), config.frontend.max_body


def _check_in_worker(asked: Asked) -> gate.GateRefusal | tuple[str, dict[str, Any]]:
    """(In a worker.) The verdict, a Forward as (its route's name, its other fields)."""
    verdict = bounded_check(asked, _table, _max_body)
    if len(asked.body) >= TRIM_FROM:
        give_back_memory()
    if isinstance(verdict, gate.GateRefusal):
        return verdict
    return verdict.route.name, {name: getattr(verdict, name) for name in _CARRIED}


class Stopped(RuntimeError):
    """A body's check asked for after the front end began to stop."""


class BodyChecks:
    """gate.check for the front end's threads, a large body's check in a worker process."""

    def __init__(self, config: Config, table: tuple[routes.Route, ...], processes: int):
        self.config, self.table, self.processes = config, table, processes
        self.max_body = config.frontend.max_body
        self.by_name = {route.name: route for route in table}
        self.turns = max(1, processes // 2)  # a user's bodies at the workers at once
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._turns: dict[str, threading.Semaphore] = {}
        self._waiting: collections.Counter[str] = collections.Counter()
        self._stopped = False

    def check(self, user: str, asked: Asked) -> gate.GateRefusal | gate.Forward:
        """(In a thread.) The gate's verdict on one request of `user`."""
        if self.processes == 0 or not costly(asked.body):
            return bounded_check(asked, self.table, self.max_body)
        with self._turn_of(user):
            return self._in_worker(asked)

    @contextlib.contextmanager
    def _turn_of(self, user: str) -> Iterator[None]:
        """One of the user's turns at the workers, waited for (its semaphore dropped when
        nobody of the user's holds or waits for one)."""
        with self._lock:
            turn = self._turns.setdefault(user, threading.Semaphore(self.turns))
            self._waiting[user] += 1
        try:
            with turn:
                yield
        finally:
            with self._lock:
                self._waiting[user] -= 1
                if not self._waiting[user]:
                    del self._waiting[user], self._turns[user]

    def _in_worker(self, asked: Asked) -> gate.GateRefusal | gate.Forward:
        for tries_left in (1, 0):
            pool = self._running_pool()
            try:
                outcome = pool.submit(_check_in_worker, asked).result()
                break
            except BrokenProcessPool:
                # A worker died (killed, out of memory): new ones, and the body is checked
                # once more (nothing was forwarded); a second death is the front end's 500.
                self._discard(pool)
                if not tries_left:
                    raise
        if isinstance(outcome, gate.GateRefusal):
            return outcome
        name, carried = outcome
        return gate.Forward(route=self.by_name[name], **carried)

    def _running_pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._stopped:  # checks still queued at shutdown: no new workers started for them
                raise Stopped("the front end is stopping")
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    self.processes,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_worker,
                    initargs=(self.config,),
                )
            return self._pool

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        log.warning("a body-check process died: new ones for the next bodies")
        pool.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        with self._lock:
            pool, self._pool, self._stopped = self._pool, None, True
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
