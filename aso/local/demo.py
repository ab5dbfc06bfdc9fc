"""`aso demo`: real work for a running ASO on its embedded defaults.

Writes files of mixed sizes into the temp areas of the source sites (as jobs would have left
them), records a transfer request for each (as job wrappers do, through the upload path),
then follows the requests with a progress bar until every one has ended, and prints what
became of them. It is how the README shows the pipeline working end to end.
"""

from __future__ import annotations

import random
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


def follow(
    db: Database, ids: Sequence[str], timeout: float, interval: float = 1.0, console: Any = None
) -> Counter[str]:
    """Wait until every request has ended (or `timeout`), with a progress bar."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    deadline = time.monotonic() + timeout
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("transfers ended", total=len(ids))
        while True:
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
