"""Chaos during a simulation (`aso sim --chaos`, `make chaos`).

While the injection runs, a `Chaos` thread:

* kills (SIGKILL) a random agent process every `kill_every` wall seconds; its host's `aso run`
  starts it again, as in production;
* restarts the embedded document store `store_restarts` times, spread over the injection, each
  time down for `store_down` wall seconds (SIGKILL, then the same data directory and port);
* optionally kills one whole agent host (`kill_host`, with `--hosts 2`): its supervisor and
  every agent of it, for good, so that the other host must take its work over;
* optionally kills nodes of a local CouchDB cluster (`kill_nodes`, with `--nodes 3`), one
  after the other, each with SIGKILL and started again `store_down` wall seconds later: the
  agents of the hosts that talk to it meet a store that is gone, the others a cluster with one
  node missing.

Two faults are simulated-time windows of the plan, so the transfer service itself plays them
(aso/transfer/sim.py): the storage of the busiest destination site stops for a while (files in
flight to or from it fail with "connection refused") and the service fails every link out of
sites 000-009 for a while (a sixth of the traffic at 60 sites; class `service`).

Afterwards the report checks, from the documents and the job table, what must hold whatever
happened: every injected file final and in exactly one outcome, none copied twice at the same
time, every published file in the catalog exactly once (sim/report.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from aso.sim.workload import Plan, Workload

log = logging.getLogger("aso.sim.chaos")


@dataclass
class ChaosPlan:
    kill_every: float | None = 5.0  # wall seconds between two agent kills (None: no kills)
    store_restarts: int = 2
    store_down: float = 3.0  # wall seconds the store stays down each time
    storage_outage: tuple[float, float] = (0.2, 0.35)  # fractions of the injection
    link_outage: tuple[float, float] = (0.5, 0.65)
    outages: bool = True  # the storage outage and the failing link
    kill_host: str | None = None  # a host id to kill for good, at kill_host_at
    kill_host_at: float = 0.4  # fraction of the injection
    # Nodes of a local cluster to kill and start again, one after the other, evenly spread
    # over the injection (one node: midway).
    kill_nodes: tuple[int, ...] = ()
    seed: int = 1

    def __post_init__(self) -> None:
        if (self.kill_every is not None and self.kill_every <= 0) or min(
            self.store_down, self.store_restarts
        ) < 0:
            raise ValueError("chaos: kill_every must be positive, store times non-negative")
        for start, end in (self.storage_outage, self.link_outage):
            if not 0 <= start < end <= 1:
                raise ValueError("chaos: outage windows are fractions 0 <= start < end <= 1")


def busiest_destination(plan: Plan) -> str:
    """The home site of most users: the storage whose outage is felt most."""
    homes = Counter(user.home for user in Workload(plan, "chaos").users)
    return homes.most_common(1)[0][0]


def chaos_outages(plan: Plan, chaos: ChaosPlan) -> list[dict[str, Any]]:
    """The storage outage and the link failure, in simulated seconds of the plan."""
    if not chaos.outages:
        return []
    d = plan.duration
    return [
        {
            "site": busiest_destination(plan),
            "start": chaos.storage_outage[0] * d,
            "end": chaos.storage_outage[1] * d,
        },
        {
            # Every link out of sites 000-009 (a sixth of the traffic at 60 sites).
            "link": "T2_SM_Site00?>*",
            "start": chaos.link_outage[0] * d,
            "end": chaos.link_outage[1] * d,
        },
    ]


@dataclass
class Event:
    at: float  # wall epoch seconds
    what: str  # kill, store_down, store_up, host_killed, node_down, node_up
    target: str
    detail: str = ""


@dataclass
class ChaosLog:
    events: list[Event] = field(default_factory=list)

    def add(self, what: str, target: str, detail: str = "") -> None:
        self.events.append(Event(time.time(), what, target, detail))
        log.info("chaos: %s %s %s", what, target, detail)

    def count(self, what: str) -> int:
        return sum(e.what == what for e in self.events)

    def to_dict(self, started: float) -> dict[str, Any]:
        return {
            "kills": self.count("kill"),
            "store_restarts": self.count("store_up"),
            "hosts_killed": self.count("host_killed"),
            "nodes_restarted": self.count("node_up"),
            "events": [{**asdict(e), "at": round(e.at - started, 2)} for e in self.events],
        }


class Chaos(threading.Thread):
    """The faults of a `ChaosPlan` over `[start, end)` wall epoch seconds."""

    def __init__(
        self,
        chaos: ChaosPlan,
        agents: Callable[[], dict[str, psutil.Process]],
        store: Any | None,
        hosts: Callable[[], dict[str, Any]],
        start: float,
        end: float,
        tick: float | None = None,
    ):
        super().__init__(name="chaos", daemon=True)
        self.chaos, self.agents, self.store, self.hosts = chaos, agents, store, hosts
        self.start_at, self.end_at = start, end
        self.tick = tick  # wall seconds between injections: the store goes down just before one
        self.rng = random.Random(chaos.seed)
        self.log = ChaosLog()
        self._halt = threading.Event()

    def plan_times(self) -> list[tuple[float, str]]:
        """(wall time, action) of the store restarts and the host kill."""
        span = self.end_at - self.start_at
        n = self.chaos.store_restarts
        times = [(self.start_at + span * (k + 1) / (n + 1), "store") for k in range(n)]
        if self.tick:
            # Half a second before the next injection, so that its uploads meet the store down.
            times = [(self._before_tick(at), what) for at, what in times]
        if self.chaos.kill_host:
            times.append((self.start_at + span * self.chaos.kill_host_at, "host"))
        count = len(self.chaos.kill_nodes)
        for k, index in enumerate(self.chaos.kill_nodes):
            times.append((self.start_at + span * (k + 1) / (count + 1), f"node {index}"))
        return sorted(times)

    def _before_tick(self, at: float) -> float:
        assert self.tick
        ticks = math.ceil((at - self.start_at) / self.tick)
        return self.start_at + ticks * self.tick - min(0.5, self.tick / 4)

    def run(self) -> None:
        scheduled = self.plan_times()
        every = self.chaos.kill_every
        next_kill = self.start_at + every if every else float("inf")
        while not self._halt.is_set() and time.time() < self.end_at:
            now = time.time()
            if scheduled and now >= scheduled[0][0]:
                _, action = scheduled.pop(0)
                if action.startswith("node "):
                    self.restart_node(int(action.split()[1]))
                else:
                    {"store": self.restart_store, "host": self.kill_host}[action]()
                continue
            if every and now >= next_kill:
                self.kill_agent()
                next_kill = now + every
            self._halt.wait(0.2)

    def kill_agent(self) -> None:
        running = self.agents()
        if not running:
            return
        name = self.rng.choice(sorted(running))
        with contextlib.suppress(psutil.Error):
            running[name].send_signal(signal.SIGKILL)
            self.log.add("kill", name, f"pid {running[name].pid}")

    def restart_store(self) -> None:
        if self.store is None:
            self.log.add("skipped", "store", "an external store is not restarted")
            return
        pid = self.store.status().pid
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).wait(10)
        self.log.add("store_down", "store", f"pid {pid} killed")
        self._halt.wait(self.chaos.store_down)
        self.log.add("store_up", "store", self.store.start())

    def restart_node(self, index: int) -> None:
        """SIGKILL one node of the local cluster, then start it again on its data."""
        node = getattr(self.store, "node", None)
        if node is None:
            self.log.add("skipped", f"node {index}", "the store is not a local cluster")
            return
        member = node(index)
        pid = member.kill()
        self.log.add("node_down", member.name, f"pid {pid} killed")
        self._halt.wait(self.chaos.store_down)
        self.log.add("node_up", member.name, member.start())

    def kill_host(self) -> None:
        host = self.chaos.kill_host
        supervisor = self.hosts().get(host or "")
        if supervisor is None:
            self.log.add("skipped", f"host {host}", "no such host")
            return
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(supervisor.pid)
            victims = [process, *process.children(recursive=True)]
            for victim in victims:
                with contextlib.suppress(psutil.Error):
                    victim.send_signal(signal.SIGKILL)
            self.log.add("host_killed", f"host {host}", f"{len(victims)} processes")

    def stop(self) -> None:
        self._halt.set()
        self.join(60)
