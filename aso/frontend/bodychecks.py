"""The gate's checks of large request bodies, in processes of their own.

Parsing and judging JSON holds the interpreter: in the front end's own process one user's
1 MiB bodies, checked in its threads, made every other client wait for the reactor (another
user's `GET /_session` took seconds). A body of `IN_PROCESS_FROM` bytes or more is checked by
one of `frontend.body_processes` worker processes (spawned, not forked: the front end runs
threads); the front end's thread only waits for the answer. Smaller bodies stay in the thread,
where a round trip to a process would cost more than the check.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import fields
from typing import Any

from aso.config import Config
from aso.frontend import gate, routes

log = logging.getLogger("aso.frontend")

IN_PROCESS_FROM = 64 * 1024
TRIM_FROM = 1 << 20  # a worker gives its free memory back after a body this large
# A Forward's fields but its route, which travels by name (a route holds functions).
_CARRIED = tuple(f.name for f in fields(gate.Forward) if f.name != "route")

# A worker process's route table, built once when it starts.
_table: tuple[routes.Route, ...] = ()


_LIBC = ctypes.util.find_library("c")


def give_back_memory() -> None:
    """Return the C heap's free pages to the system (glibc keeps them in each thread's arena:
    a parsed 58 MiB body had left the front end 800 MB larger for good)."""
    with contextlib.suppress(OSError, AttributeError, TypeError):  # not glibc: nothing to trim
        ctypes.CDLL(_LIBC).malloc_trim(0)


def _start_worker(config: Config) -> None:
    global _table
    _table = routes.table(config)


def _check_in_worker(
    method: bytes, target: bytes, body: bytes, audiences: frozenset[str], content_type: bytes
) -> gate.GateRefusal | tuple[str, dict[str, Any]]:
    """(In a worker.) gate.check's verdict, a Forward as (its route's name, its other fields)."""
    verdict = gate.check(method, target, body, audiences, _table, content_type)
    if len(body) >= TRIM_FROM:
        give_back_memory()
    if isinstance(verdict, gate.GateRefusal):
        return verdict
    return verdict.route.name, {name: getattr(verdict, name) for name in _CARRIED}


class BodyChecks:
    """gate.check for the front end's threads, a large body's check in a worker process."""

    def __init__(self, config: Config, table: tuple[routes.Route, ...], processes: int):
        self.config, self.table, self.processes = config, table, processes
        self.by_name = {route.name: route for route in table}
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def check(
        self,
        method: bytes,
        target: bytes,
        body: bytes,
        audiences: frozenset[str],
        content_type: bytes,
    ) -> gate.GateRefusal | gate.Forward:
        """(In a thread.) The gate's verdict on one request."""
        if self.processes == 0 or len(body) < IN_PROCESS_FROM:
            return gate.check(method, target, body, audiences, self.table, content_type)
        for tries_left in (1, 0):
            pool = self._running_pool()
            try:
                outcome = pool.submit(
                    _check_in_worker, method, target, body, audiences, content_type
                ).result()
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
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
