"""Helpers shared by the pipeline tests: uploading requests, driving agents in-process,
reading back states and jobs."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from aso.config import Config
from aso.model import STATE
from aso.provision.designdocs import init_databases
from aso.runtime import Runner
from aso.store import Database, Server
from aso.transfer.jobstore import JOB_TYPE, is_fence
from tests.conftest import sample_request

LINKS = [
    ("T2_CH_CERN", "T2_DE_DESY"),
    ("T2_IT_Pisa", "T2_DE_DESY"),
    ("T2_US_MIT", "T2_DE_DESY"),
    ("T2_CH_CERN", "T2_IT_Pisa"),
    ("T2_UK_ICL", "T1_US_FNAL"),
    ("T2_FR_GRIF", "T2_IT_Bari"),
]


def owner_db(accounts: dict[str, Server], config: Config, user: str = "alice") -> Database:
    return accounts[user].db(config.store.files_db)


def upload(
    accounts: dict[str, Server],
    config: Config,
    n: int,
    users=("alice", "bob"),
    links=LINKS[:2],
    **kw: Any,
) -> list[str]:
    ids = []
    for user in users:
        docs = [
            sample_request(
                user, source=links[i % len(links)][0], destination=links[i % len(links)][1], **kw
            )
            for i in range(n)
        ]
        assert all(r.ok for r in owner_db(accounts, config, user).bulk_write(docs))
        ids += [d["_id"] for d in docs]
    return ids


def states(db: Database, ids: list[str]) -> Counter[str]:
    return Counter(doc[STATE] for doc in db.get_many(ids).values())


def run_until(
    done: Callable[[], bool],
    runners: list[Runner],
    timeout: float = 60.0,
    describe: Callable[[], Any] | None = None,
) -> None:
    """Step the runners until `done()`; on timeout fail with what `describe()` says (e.g. the
    files per state: where the pipeline stopped)."""
    for runner in runners:
        runner.workset.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for runner in runners:
            runner.step(wait=False)
        if done():
            return
        time.sleep(0.1)
    where = f": {describe()}" if describe is not None else ""
    raise AssertionError(f"the pipeline did not finish in {timeout:.0f} s{where}")


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `predicate` until it holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def job_table(admin: Server, config: Config) -> list[dict[str, Any]]:
    """Every document of the job table: the jobs and the fences of jobs never made."""
    rows = admin.db(config.store.transfers_db).server.call(
        admin.client.post_all_docs, db=config.store.transfers_db, include_docs=True
    )["rows"]
    return [r["doc"] for r in rows if r["doc"].get("type") == JOB_TYPE]


def jobs_of(admin: Server, config: Config) -> list[dict[str, Any]]:
    """The jobs of the job table (not the fences of jobs never made)."""
    return [doc for doc in job_table(admin, config) if not is_fence(doc)]


def assert_each_file_in_one_job(admin: Server, config: Config, ids: list[str]) -> None:
    seen = Counter(fid for job in jobs_of(admin, config) for fid in job["files"])
    assert set(seen) == set(ids)
    assert [fid for fid, n in seen.items() if n > 1] == []


def plant_as_earlier_versions_left_them(
    admin: Server, config: Config, docs: list[dict[str, Any]]
) -> None:
    """Write `docs` (in states that earlier versions of 0.1.0 wrote and the store's validation
    no longer knows) as they were left: the files database's validation is taken away for the
    write (its design document deleted, as only a store admin can) and put back by `aso db
    init`'s own function. Each document gets its new revision."""
    db = admin.db(config.store.files_db)
    ddoc = db.get("_design/asyncstageout")
    assert ddoc is not None
    db.delete(ddoc["_id"], ddoc["_rev"])
    try:
        results = db.bulk_write(docs)
    finally:
        init_databases(admin, config)
    assert all(r.ok for r in results), results
    for doc, result in zip(docs, results, strict=True):
        doc["_rev"] = result.rev


def left_as(doc: dict[str, Any], axis: str, to: str, at: float, **fields: Any) -> dict[str, Any]:
    """`doc` moved to `to` on `axis` as an agent of an earlier version moved it (a state the
    model no longer knows: model.transition refuses it), its history entry appended."""
    entry = {"axis": axis, "from": doc[axis], "to": to, "at": at, "by": "earlier-agent"}
    return {**doc, axis: to, "history": [*doc["history"], entry], "last_update": at, **fields}
