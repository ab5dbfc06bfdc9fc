"""`aso demo`: real work for a running ASO on its embedded defaults.

Writes files of mixed sizes into the temp areas of the source sites (as jobs would have left
them), records a transfer request for each (as job wrappers do, through the upload path),
then follows the requests with a progress bar until every one has ended, and prints what
became of them. It is how the README shows the pipeline working end to end.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from aso import model
from aso.config import Config
from aso.local import pki
from aso.store import Database, Server, Settings
from aso.upload import UploadReport, judged_request, upload

ENDED = (*model.FINAL[model.STATE], "failed_attempt")  # what the demo follows files to


@dataclass
class DemoPlan:
    files: int = 200
    users: tuple[str, ...] = ("alice", "bob")
    sources: tuple[str, ...] = ("T2_CH_CERN", "T2_IT_Pisa")
    destination: str = "T2_DE_DESY"
    min_size: int = 1024
    max_size: int = 4 << 20
    seed: int | None = None


def demo_dataset(user: str, run: str) -> str:
    """Each user's demo task publishes into a dataset of its own."""
    return f"/Demo/{user}-crab_demo_{run}/USER"


def through_frontend(config: Config, users: Sequence[str]) -> dict[str, Database]:
    """Each user's files database through the front end, as that user: a fresh proxy from the
    user's certificate and key in `frontend.demo_certs` (written by `aso certs demo`)."""
    certs = config.path(config.frontend.demo_certs)
    host, _, port = config.frontend.listen.rpartition(":")
    url = f"https://{'127.0.0.1' if host in ('', '0.0.0.0', '::') else host}:{port}"
    capath = str(config.path(config.frontend.capath))
    dbs = {}
    for user in users:
        cert, key = certs / f"{user}-cert.pem", certs / f"{user}-key.pem"
        if not (cert.is_file() and key.is_file()):
            raise ValueError(f"no certificate for {user} in {certs}: run `aso certs demo {certs}`")
        proxy = pki.renew_proxy(cert, key, certs / f"x509up_{user}")
        server = Server(url, settings=Settings.of(config.store), verify=capath, cert=str(proxy))
        dbs[user] = server.db(config.store.files_db)
    return dbs


def write_and_upload(
    config: Config, dbs: Mapping[str, Database], plan: DemoPlan, write: Callable[..., Any]
) -> tuple[list[str], UploadReport]:
    """Write plan.files files at the sources and record their requests, each user's through
    `dbs[user]`; returns the ids."""
    rng = random.Random(plan.seed)
    run = time.strftime("%y%m%d_%H%M%S", time.gmtime()) + "_" + uuid.uuid4().hex[:6]
    docs = []
    for i in range(plan.files):
        user = plan.users[i % len(plan.users)]
        source = plan.sources[(i // len(plan.users)) % len(plan.sources)]
        path = f"{user}/Demo/crab_demo/{run}/0000/output_{i}.root"
        source_lfn = f"/store/temp/user/{path}"
        size = int(rng.uniform(plan.min_size, plan.max_size))
        stored = write(config, source, source_lfn, size)
        docs.append(
            judged_request(
                user=user,
                task=f"{run}:{user}_crab_demo",
                job_id=str(i // len(plan.users) + 1),
                source=source,
                destination=plan.destination,
                source_lfn=source_lfn,
                destination_lfn=f"/store/user/{path}",
                size=size,
                adler32=stored.adler32,
                publish=True,
                publish_info={
                    "dataset": demo_dataset(user, run),
                    "events": rng.randint(100, 5000),
                    "lumis": {"1": [i + 1]},
                },
            )
        )
    report = UploadReport()
    for user in plan.users:
        mine = upload(dbs[user], [d for d in docs if d["user"] == user])
        report.recorded += mine.recorded
        report.already += mine.already
        report.refused.update(mine.refused)
    return [d["_id"] for d in docs], report


@dataclass
class Freeze:
    """One embedded site's XRootD frozen (SIGSTOP: it takes connections and answers none)
    from `start` seconds into the demo's run for `seconds`, then let go (SIGCONT): how ASO
    rides out a storage that hangs. `aso run` may kill and start again a site frozen past
    `storage.hang_timeout`; letting go of a server that is gone is nothing."""

    site: str
    start: float
    seconds: float
    pid_of: Callable[[str], int | None]
    pid: int | None = None
    thawed: bool = False

    def tick(self, elapsed: float) -> str | None:
        """Freeze or let go when it is time; what was done, for the console."""
        if self.pid is None and not self.thawed and elapsed >= self.start:
            self.pid = self.pid_of(self.site)
            if self.pid is None:
                self.thawed = True
                return f"{self.site}: no server of ours runs, nothing frozen"
            os.kill(self.pid, signal.SIGSTOP)
            return f"froze {self.site} (pid {self.pid}) for {self.seconds:.0f} s"
        if self.pid is not None and not self.thawed and elapsed >= self.start + self.seconds:
            self.thaw()
            return f"let {self.site} go again after {elapsed - self.start:.0f} s"
        return None

    def thaw(self) -> None:
        if self.pid is not None and not self.thawed:
            with contextlib.suppress(ProcessLookupError):  # killed meanwhile by `aso run`
                os.kill(self.pid, signal.SIGCONT)
        self.thawed = True


@dataclass(frozen=True)
class Waits:
    """How long a group of the demo's files took from their request to their copy done."""

    group: str
    files: int
    done: int
    p50: float | None
    p95: float | None
    longest: float | None

    def row(self) -> tuple[str, ...]:
        def seconds(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f}"

        figures = (self.p50, self.p95, self.longest)
        return (self.group, str(self.files), str(self.done), *map(seconds, figures))


def waits(docs: Sequence[Mapping[str, Any]], site: str) -> list[Waits]:
    """The files from or to `site` and the others: how long each waited for its copy."""
    groups: dict[str, list[Mapping[str, Any]]] = {f"from or to {site}": [], "the others": []}
    for doc in docs:
        touches = site in (doc["source"], doc["destination"])
        groups[f"from or to {site}" if touches else "the others"].append(doc)
    out = []
    for group, members in groups.items():
        took = sorted(_done_at(d) - float(d["created"]) for d in members if d["state"] == "done")
        longest = took[-1] if took else None
        p50, p95 = _quantile(took, 0.5), _quantile(took, 0.95)
        out.append(Waits(group, len(members), len(took), p50, p95, longest))
    return out


def hold_changes(
    holds: Sequence[Mapping[str, Any]], since: float
) -> list[tuple[str, str, str, str, str]]:
    """What the holds' histories say happened after `since` (epoch seconds), in order: (seconds
    into the run, site, whose files, the hold's state, who and why), for the demo's table."""
    changes = []
    for hold in holds:
        whose = hold["user"] or "every user's"
        for entry in hold.get("history") or []:
            if entry["at"] >= since:
                said = f"{entry['by']}: {entry['reason']}"
                changes.append((entry["at"] - since, hold["site"], whose, entry["state"], said))
    return [(f"{at:.0f}", *rest) for at, *rest in sorted(changes)]


def _done_at(doc: Mapping[str, Any]) -> float:
    return max(float(h["at"]) for h in doc["history"] if h["axis"] == "state" and h["to"] == "done")


def _quantile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank quantile of sorted `values`."""
    if not values:
        return None
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def follow(
    db: Database,
    ids: Sequence[str],
    timeout: float,
    interval: float = 1.0,
    console: Any = None,
    on_tick: Callable[[float], str | None] | None = None,
) -> Counter[str]:
    """Wait until every request has ended (or `timeout`), with a progress bar; `on_tick`
    is called with the seconds since the start at each look (what it says is printed)."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    started = time.monotonic()
    deadline = started + timeout
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("transfers ended", total=len(ids))
        while True:
            said = on_tick(time.monotonic() - started) if on_tick else None
            if said:
                progress.console.print(said, markup=False, highlight=False)
            counts = Counter(doc[model.STATE] for doc in db.get_many(ids).values() if doc)
            ended = sum(counts[s] for s in ENDED)
            progress.update(
                bar,
                completed=ended,
                description=f"done {counts['done']}, failed "
                f"{counts['failed_attempt'] + counts['failed']}",
            )
            if ended == len(ids) or time.monotonic() > deadline:
                return counts
            time.sleep(interval)
