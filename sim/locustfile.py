"""Locust load test of the X.509 front end: job wrappers recording their transfer requests and
CRAB-style clients polling their tasks' status, each simulated user with a proxy file of its own.

`JobWrapper` is one slot of a worker node: it waits as long as a job runs, then records the
job's output and log in one `_bulk_docs` POST (what `aso upload` sends). `CrabClient` polls one
of its user's tasks as docs/status-api.md says: the counts per state (`task_states`,
group_level=3) and what changed since its last poll (by the store's sequence: `_changes` with
the task's ids), and now and then every file of the task (`by_task`), through
aso/monitoring/queries.py's own functions. Both ask
the front end who they are (`/_session`) first: the user their proxy maps to is the one whose
requests they record and whose tasks they poll.

Configuration, from the environment (`python -m aso.sim.bench_locust` sets it for a throw-away
store and front end; point it at any running front end the same way):

    --host / LOCUST_HOST     the front end, e.g. https://127.0.0.1:8443 (locust's own option)
    ASO_LOCUST_CA            CA file the front end's host certificate is verified against
    ASO_LOCUST_PROXIES       directory of proxy files x509up_*: simulated user number i takes
                             the i-th in name order (round robin when there are fewer)
    ASO_LOCUST_FILES_DB      the files database (default asynctransfer)
    ASO_LOCUST_CRAB_SHARE    share of the simulated users that are CRAB clients (default 0.5)
    ASO_LOCUST_JOB_WAIT      seconds a job runs, "MIN,MAX" (default 1,3)
    ASO_LOCUST_POLL_WAIT     seconds between a client's polls, "MIN,MAX" (default 1,3)
    ASO_LOCUST_TASKS         tasks per grid user that the jobs belong to (default 3)

    locust -f sim/locustfile.py --headless -u 50 -r 10 -t 60s --host https://127.0.0.1:8443
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
import uuid
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import gevent
from locust import HttpUser, between, events, stats, task
from locust.env import Environment
from locust.exception import StopUser

from aso import model
from aso.monitoring import queries
from aso.store import ChangesBatch, Database, ViewResult

# Stats names: locust's table gets one row per kind of request, not per URL.
VIEW_NAMES = {"task_states": "status counts", "by_task": "status files"}
CHANGES_NAME = "status since"  # the task's changes after the client's sequence
SEQ_NAME = "status seq"  # the store's sequence, where a client starts following a task
UPLOAD = "upload job"
# Sites of the default catalogue (aso config keys: sites.*), which the store knows: a request
# naming another site is refused (403). Against another deployment, use its sites.
SOURCES = ("T2_CH_CERN", "T2_IT_Pisa")
DESTINATION = "T2_DE_DESY"
# Source LFNs (so request ids) must be new in every run, also against a front end whose
# database already holds an earlier run's requests: a repeated id would be a 409, not a load.
RUN = uuid.uuid4().hex[:8]
_users = itertools.count()  # simulated users, in order of start: which proxy file each takes
_jobs = itertools.count(1)


def _seconds(name: str, default: str) -> tuple[float, float]:
    low, high = (float(x) for x in os.environ.get(name, default).split(","))
    return low, high


def _setting(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"{name} is not set (see sim/locustfile.py)")
    return value


@functools.cache
def _proxy_files() -> list[Path]:
    files = sorted(Path(_setting("ASO_LOCUST_PROXIES")).glob("x509up_*"))
    if not files:
        raise SystemExit(f"no x509up_* proxy files in {os.environ['ASO_LOCUST_PROXIES']}")
    return files


def files_db() -> str:
    return os.environ.get("ASO_LOCUST_FILES_DB") or "asynctransfer"


def task_names(user: str) -> list[str]:
    """The CRAB tasks of a grid user: the same names in the job wrappers and the clients."""
    count = int(os.environ.get("ASO_LOCUST_TASKS", "3"))
    return [f"261121_120000:{user}_crab_locust{k}" for k in range(count)]


def job_requests(user: str, task_name: str, job: int) -> list[dict[str, Any]]:
    """What a finished job stages out: its output file and its log, from one site."""
    source = random.choice(SOURCES)
    files = {"output": f"prim/proc/{RUN}/out_{job}.root",
             "log": f"prim/proc/{RUN}/log/cmsRun_{job}.log.tar.gz"}  # fmt: skip
    return [
        model.request_of(
            user=user,
            task=task_name,
            job_id=job,
            source=source,
            destination=DESTINATION,
            source_lfn=f"/store/temp/user/{user}.locust/{path}",
            destination_lfn=f"/store/user/{user}/{path}",
            file_type=kind,
            size=random.randint(1 << 20, 4 << 30),
            adler32=f"{random.getrandbits(32):08x}",
        )
        for kind, path in files.items()
    ]


class FrontEndUser(HttpUser):
    """A grid user's client: its own proxy, its own kept-alive TLS connection."""

    abstract = True
    grid_user: str
    tasks_of_user: list[str]

    def on_start(self) -> None:
        files = _proxy_files()
        self.client.cert = str(files[next(_users) % len(files)])
        self.client.verify = _setting("ASO_LOCUST_CA")
        # $REQUESTS_CA_BUNDLE would replace `verify`, and an $https_proxy must not see the
        # proxy's traffic: requests reads neither when trust_env is off.
        self.client.trust_env = False
        self.grid_user = self._whoami()
        self.tasks_of_user = task_names(self.grid_user)

    def _whoami(self) -> str:
        """The user the front end maps this proxy to (as `aso upload` finds it)."""
        with self.client.get("/_session", name="session", catch_response=True) as answer:
            name: str | None = _json(answer).get("userCtx", {}).get("name") if answer.ok else None
            if not name:
                answer.failure(f"no user for {self.client.cert}: {answer.status_code}")
                raise StopUser()
            return name


class JobWrapper(FrontEndUser):
    wait_time = between(*_seconds("ASO_LOCUST_JOB_WAIT", "1,3"))

    @task
    def stage_out(self) -> None:
        docs = job_requests(self.grid_user, random.choice(self.tasks_of_user), next(_jobs))
        path = f"/{quote(files_db(), safe='')}/_bulk_docs"
        with self.client.post(path, json={"docs": docs}, name=UPLOAD,
                              catch_response=True) as answer:  # fmt: skip
            problem = _upload_problem(answer, docs)
            if problem:
                answer.failure(problem)


def _upload_problem(answer: Any, docs: list[dict[str, Any]]) -> str | None:
    """Why the upload did not record every request, if it did not. `_bulk_docs` answers 201
    even when it refuses documents: each one's result says (as aso.upload reads it)."""
    if answer.status_code != 201:
        return f"{answer.status_code} {answer.text[:200]}"
    results = _json(answer, [])
    written = {r.get("id") for r in results if isinstance(r, dict) and not r.get("error")}
    missing = [d["_id"] for d in docs if d["_id"] not in written]
    return f"not recorded: {missing}: {answer.text[:200]}" if missing else None


class CrabClient(FrontEndUser):
    wait_time = between(*_seconds("ASO_LOCUST_POLL_WAIT", "1,3"))
    views: _Views
    pollers: dict[str, queries.Poller]

    def on_start(self) -> None:
        super().on_start()
        self.views = _Views(self.client, files_db())
        self.pollers = {}

    @task(5)
    def poll(self) -> None:
        """Counts, then the files changed since the last poll, followed through the store's
        sequence (docs/status-api.md, "Following a task")."""
        name = random.choice(self.tasks_of_user)
        queries.task_counts(self.views.db, name)
        poller = self.pollers.get(name)
        if poller is None:
            poller = self.pollers[name] = queries.Poller(self.views.db, name)
            poller.start()
        else:
            poller.poll()

    @task(1)
    def files(self) -> None:
        queries.task_files(self.views.db, random.choice(self.tasks_of_user))


class _Views:
    """Stands in for aso.store.Database in aso/monitoring/queries.py's functions, which call nothing
    but `view`: the same view requests, sent in docs/frontend.md's GET form through locust's client
    so
    that each is timed and counted under its kind."""

    def __init__(self, client: Any, db: str) -> None:
        self.client, self.name = client, db

    @property
    def db(self) -> Database:
        return cast(Database, self)

    def info(self) -> dict[str, Any]:
        with self.client.get(f"/{quote(self.name, safe='')}", name=SEQ_NAME,
                             catch_response=True) as answer:  # fmt: skip
            info = _json(answer)
            if answer.status_code != 200 or "update_seq" not in info:
                answer.failure(f"{answer.status_code} {answer.text[:200]}")
                return {"update_seq": "0"}
            return cast(dict[str, Any], info)

    def changes(self, since: str, *, doc_ids: list[str], **_: Any) -> ChangesBatch:
        path = f"/{quote(self.name, safe='')}/_changes"
        params = {"filter": "_doc_ids", "since": since}
        with self.client.post(path, params=params, json={"doc_ids": doc_ids}, name=CHANGES_NAME,
                              catch_response=True) as answer:  # fmt: skip
            got = _json(answer)
            if answer.status_code != 200 or "results" not in got:
                answer.failure(f"{answer.status_code} {answer.text[:200]}")
                return ChangesBatch([], since)
            return ChangesBatch(got["results"], str(got.get("last_seq", since)))

    def view(self, ddoc: str, name: str, **query: Any) -> ViewResult:
        path = f"/{quote(self.name, safe='')}/_design/{ddoc}/_view/{name}"
        params = {k: json.dumps(v) for k, v in query.items() if v is not None}
        with self.client.get(path, params=params, name=VIEW_NAMES.get(name, name),
                             catch_response=True) as answer:  # fmt: skip
            rows = _json(answer).get("rows") if answer.status_code == 200 else None
            if rows is None:
                answer.failure(f"{answer.status_code} {answer.text[:200]}")
                return ViewResult(rows=[])
            return ViewResult(rows=rows)


def _json(answer: Any, default: Any = None) -> Any:
    try:
        return answer.json()
    except ValueError:
        return {} if default is None else default


def _weights(crab_share: float) -> None:
    """Split the simulated users between the two kinds; a share of 0 or 1 leaves one out."""
    crab = round(min(max(crab_share, 0.0), 1.0) * 100)
    CrabClient.weight, JobWrapper.weight = max(crab, 1), max(100 - crab, 1)
    CrabClient.abstract, JobWrapper.abstract = crab == 0, crab == 100


_weights(float(os.environ.get("ASO_LOCUST_CRAB_SHARE", "0.5")))


@events.test_stop.add_listener  # type: ignore[untyped-decorator]  # unannotated in locust
def _let_the_csv_catch_up(environment: Environment, **_: Any) -> None:
    """Locust writes the --csv files from a greenlet every CSV_STATS_INTERVAL_SEC and closes
    them right after the users have stopped: without this pause the requests of the last
    second (those finished during --stop-timeout too) are missing from _stats.csv."""
    if getattr(environment.parsed_options, "csv_prefix", None):
        gevent.sleep(stats.CSV_STATS_INTERVAL_SEC + 0.5)
