"""The simulator's synthetic work: who injects what, when, from where to where.

Plain functions over a `Plan`, deterministic for a seed. The design load is the paper's 300k
files a day; `Plan.scale` multiplies it. Users run tasks of jobs at the sites; every job stages
out one output (published into the task's dataset) and, for half of the users, a log too.
Each user copies to one home site (as CRAB users do); a job runs at any of the sites.

Times: the plan is written in *simulated* seconds. `compression` runs it that many times faster
in wall time: injection rates are multiplied by it and every simulated duration handed to the
agents (transfer times, cool-offs, block closure) is divided by it. Polling intervals, leases
and heartbeats are the service's own overheads and stay as they are.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypedDict

from aso import model

DESIGN_FILES_PER_DAY = 300_000
DAY = 86_400.0

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgtp])(i?))?b?\s*$", re.IGNORECASE)
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size(text: str) -> int:
    """Bytes of `1000000`, `500MB`, `20GB`, `1.5TB` (powers of 1000) or `20GiB` (of 1024), the
    size limits of `aso sim --quota`; ValueError for anything else."""
    match = _SIZE.match(text)
    size = 0
    if match:
        number, prefix, binary = match.groups()
        power = _POWERS[prefix.lower()] if prefix else 0
        size = int(float(number) * (1024 if binary else 1000) ** power)
    if size < 1:
        raise ValueError(f"{text!r} is not a size such as 500MB, 20GB, 1.5TB, 20GiB or 1000000")
    return size


def parse_duration(text: str) -> float:
    """Seconds of `90`, `90s`, `15m`, `2h` or `1d` (`aso sim`'s and the benchmarks' options);
    ValueError for anything else."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration such as 90, 90s, 15m, 2h or 1d")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass
class Plan:
    scale: float = 1.0  # multiple of the design load
    users: int = 200
    sites: int = 60
    interval: float = 60.0  # simulated seconds between two injections
    duration: float = 3600.0  # simulated seconds of injection
    compression: float = 1.0  # simulated seconds per wall second
    log_users: float = 0.5  # share of the users whose jobs also stage out a log
    jobs_per_task: tuple[int, int] = (100, 1000)  # a task's size is drawn in this range
    mean_size: float = 500e6  # bytes: outputs are drawn log-normally around it
    seed: int = 1
    # The transfer service (simulated seconds) and what the agents wait (simulated seconds).
    mean_duration: float = 20.0
    distribution: str = "exponential"
    failure_rate: float = 0.02
    transfer_timeout: float = 3600.0  # a longer transfer fails (class timeout), as in FTS
    retry_delay: float = 60.0
    block_timeout: float = 300.0
    outages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        positive = ("scale", "interval", "duration", "compression", "mean_duration")
        for name in (*positive, "transfer_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.users < 1 or self.sites < 2:
            raise ValueError("the simulation needs at least 1 user and 2 sites")
        if not 0 <= self.failure_rate <= 1 or not 0 <= self.log_users <= 1:
            raise ValueError("failure_rate and log_users are fractions between 0 and 1")

    @property
    def files_per_second(self) -> float:
        """Simulated files per simulated second at this scale."""
        return self.scale * DESIGN_FILES_PER_DAY / DAY

    @property
    def files_per_job(self) -> float:
        return 1.0 + self.log_users

    @property
    def expected_files(self) -> int:
        return round(self.files_per_second * self.duration)

    def wall(self, simulated: float) -> float:
        """Wall seconds of a simulated duration."""
        return simulated / self.compression

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["files_per_day"] = self.scale * DESIGN_FILES_PER_DAY
        return data


def site_names(count: int) -> list[str]:
    return [f"T2_SM_Site{i:03d}" for i in range(count)]


def user_names(count: int) -> list[str]:
    return [f"simuser{i:04d}" for i in range(count)]


@dataclass
class UserState:
    name: str
    home: str  # where the user's files go
    logs: bool  # the user's jobs stage out their logs too
    task: str = ""
    dataset: str = ""
    jobs_left: int = 0
    next_job: int = 1
    tasks: int = 0


class _JobFields(TypedDict):
    """What the requests of one job share (model.request_of's keywords)."""

    user: str
    task: str
    job_id: str
    source: str
    destination: str
    at: float


@dataclass(frozen=True)
class Job:
    user: str
    task: str
    job_id: int
    docs: tuple[dict[str, Any], ...]


class Workload:
    """Draws jobs for the injections of a plan; `tick(k)` gives the jobs of injection k."""

    def __init__(self, plan: Plan, run: str):
        self.plan = plan
        self.run = run  # a token that makes every LFN of this run unique
        self.rng = random.Random(plan.seed)
        self.sites = site_names(plan.sites)
        self.users = [
            UserState(name, self.rng.choice(self.sites), self.rng.random() < plan.log_users)
            for name in user_names(plan.users)
        ]
        self._carry = 0.0  # fractional jobs owed from earlier ticks

    @property
    def ticks(self) -> int:
        return max(1, math.ceil(self.plan.duration / self.plan.interval))

    def jobs_at_tick(self) -> int:
        """Whole jobs for one injection; the fractions carry over so no file is lost."""
        plan = self.plan
        self._carry += plan.files_per_second * plan.interval / plan.files_per_job
        whole = int(self._carry)
        self._carry -= whole
        return whole

    def tick(self, at: float) -> list[Job]:
        """The jobs of one injection, stamped `at` (wall epoch seconds)."""
        return [self.job(self.rng.choice(self.users), at) for _ in range(self.jobs_at_tick())]

    def _next_task(self, user: UserState) -> None:
        user.tasks += 1
        low, high = self.plan.jobs_per_task
        user.jobs_left = self.rng.randint(low, high)
        user.next_job = 1
        name = f"{self.run}:{user.name}_sim_{user.tasks}"
        user.task = name
        user.dataset = f"/SimPrimary/{user.name}-sim_{self.run.replace(':', '_')}_{user.tasks}/USER"

    def job(self, user: UserState, at: float) -> Job:
        if user.jobs_left <= 0:
            self._next_task(user)
        job_id = user.next_job
        user.next_job += 1
        user.jobs_left -= 1
        site = self.rng.choice(self.sites)
        base = f"{user.name}/SimPrimary/sim_{user.tasks}/{self.run.replace(':', '_')}"
        size = max(1, int(self.rng.lognormvariate(math.log(self.plan.mean_size) - 0.5, 1.0)))
        common: _JobFields = {
            "user": user.name,
            "task": user.task,
            "job_id": str(job_id),
            "source": site,
            "destination": user.home,
            "at": at,
        }
        docs = [
            model.request_of(
                **common,
                source_lfn=f"/store/temp/user/{base}/output_{job_id}.root",
                destination_lfn=f"/store/user/{base}/output_{job_id}.root",
                size=size,
                adler32=f"{self.rng.getrandbits(32):08x}",
                publish=True,
                publish_info={"dataset": user.dataset, "events": self.rng.randint(100, 10000)},
            )
        ]
        if user.logs:
            docs.append(
                model.request_of(
                    **common,
                    source_lfn=f"/store/temp/user/{base}/log/cmsRun_{job_id}.log.tar.gz",
                    destination_lfn=f"/store/user/{base}/log/cmsRun_{job_id}.log.tar.gz",
                    size=max(1, size // 200),
                    adler32=f"{self.rng.getrandbits(32):08x}",
                    file_type="log",
                )
            )
        return Job(user.name, user.task, job_id, tuple(docs))


def injections(plan: Plan) -> Iterator[float]:
    """Simulated times of the injections: 0, interval, 2·interval, ... before `duration`."""
    k = 0
    while k * plan.interval < plan.duration:
        yield k * plan.interval
        k += 1
