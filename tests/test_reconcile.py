"""The reconciler against real parts: the embedded store, XRootD sites with real files, the
embedded catalog. A clean run (requests cleaned and published by the real cleaner and
publisher, plus work in flight) reports nothing; then one disagreement of each kind is planted
(and a lost file besides), the agent reports them all and changes nothing, `aso reconcile --fix`
repairs the repairable ones through transitions the store accepts, the requests put back are
copied again by the real pipeline, and what is left is exactly what cannot be repaired."""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import logging
import os
import time
import uuid
from collections import Counter
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from aso import model, reconcile
from aso.agents import reconciler as reconciler_module
from aso.agents.cleaner import Cleaner
from aso.agents.gfal_worker import GfalWorker
from aso.agents.monitor import Monitor
from aso.agents.publisher import Publisher
from aso.agents.reconciler import Reconciler
from aso.agents.submitter import Submitter
from aso.catalog.embedded import EmbeddedCatalog
from aso.cli.reconcile import reconcile_cmd
from aso.config import Config
from aso.core.publication import make_block
from aso.files import GfalFiles
from aso.local.xrootd import export_path, write_file
from aso.model import AGENT, CLEANUP, PUBLICATION, STATE, Change
from aso.provision.designdocs import init_catalog_db
from aso.reconcile import (
    CATALOG_EXTRA,
    CATALOG_MISSING,
    DESTINATION_MISMATCH,
    DESTINATION_MISSING,
    LEFTOVER_TEMP,
    ORPHAN_TEMP,
    STUCK,
    CatalogState,
    Request,
)
from aso.runtime import Runner
from aso.store import Server
from aso.store import admin as store_admin
from aso.upload import judged_request
from tests.conftest import DESTINATION, SOURCES, preloaded_cli, sample_request
from tests.pipeline_helpers import run_until

DATASET = "/Prim/alice-rec-v1/USER"
OTHER_DATASET = "/Prim/alice-rec-v2/USER"
HOUR = 3600.0


@pytest.fixture()
def rec_config(gfal_config: Config, admin: Server):
    name = f"catalog_{gfal_config.store.files_db}"
    init_catalog_db(admin, name)
    yield dataclasses.replace(
        gfal_config,
        store=dataclasses.replace(gfal_config.store, catalog_db=name),
        reconciler=dataclasses.replace(
            gfal_config.reconciler, stuck_after=HOUR, orphan_grace=600.0
        ),
    )
    store_admin.delete_db(admin, name)


class Plant:
    """Requests with real files at the sites, in the states a test needs."""

    def __init__(self, config: Config, accounts: dict[str, Server]):
        self.config = config
        self.owner = accounts["alice"].db(config.store.files_db)
        self.agent = accounts["agent"].db(config.store.files_db)
        self.content: dict[str, bytes] = {}
        self.token = uuid.uuid4().hex[:8]

    def request(
        self,
        job: int,
        *,
        task: str,
        dataset: str | None = None,
        to: tuple[str, ...] = ("submitted", "done"),
        dest: bool = True,
        at: float | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        src = f"/store/temp/user/alice.rec/{self.token}/out_{job}.root"
        dst = f"/store/user/alice/rec/{self.token}/out_{job}.root"
        data = os.urandom(2000 + job)
        stored = write_file(self.config, SOURCES[0], src, data)
        if dest:
            write_file(self.config, DESTINATION, dst, data)
        doc = judged_request(
            user="alice",
            task=task,
            job_id=job,
            source=SOURCES[0],
            destination=DESTINATION,
            source_lfn=src,
            destination_lfn=dst,
            size=len(data),
            adler32=stored.adler32,
            publish=dataset is not None,
            publish_info={"dataset": dataset, "events": 10, "lumis": {"1": [job]}, "parents": []}
            if dataset
            else None,
            at=at,
        )
        self.content[doc["_id"]] = data
        doc["_rev"] = self.owner.create(doc)
        for i, state in enumerate(to):
            extra = fields if i == len(to) - 1 else {}
            doc = self.move(doc, STATE, state, at=at, **extra)
        return doc

    def move(self, doc: dict[str, Any], axis: str, to: str, **fields: Any) -> dict[str, Any]:
        at = fields.pop("at", None)
        doc = model.transition(doc, [Change(axis, to, "test")], AGENT, at=at, **fields)
        doc["_rev"] = self.agent.put(doc)
        return doc

    def temp(self, doc: dict[str, Any]) -> Any:
        return export_path(self.config, doc["source"], doc["source_lfn"])

    def dest(self, doc: dict[str, Any]) -> Any:
        return export_path(self.config, doc["destination"], doc["destination_lfn"])

    def rewrite_temp(self, doc: dict[str, Any]) -> None:
        write_file(self.config, doc["source"], doc["source_lfn"], self.content[doc["_id"]])


def step(agent: Any) -> dict[str, Any]:
    runner = Runner(agent)
    if agent.kinds:
        runner.workset.start()
    try:
        return runner.step(wait=False)
    finally:
        agent.close()


def cli(config: Config) -> typer.Typer:
    """`aso reconcile` as aso/cli/__init__.py registers it, on a preloaded config."""
    return preloaded_cli(config, commands={"reconcile": reconcile_cmd})


def run_reconcile(config: Config, admin: Server) -> reconcile.Report:
    catalog = EmbeddedCatalog(admin.db(config.store.catalog_db))
    return reconcile.reconcile(
        config, admin.db(config.store.files_db), catalog=catalog, files=GfalFiles(config)
    )


def found(report: reconcile.Report) -> Counter[tuple[str, str]]:
    return Counter((f.kind, f.subject) for f in report.findings)


def test_reconciler_finds_each_disagreement_and_repairs_what_it_can(
    rec_config: Config, accounts: dict[str, Server], admin: Server, caplog
):
    config = rec_config
    plant = Plant(config, accounts)
    db = admin.db(config.store.files_db)
    now = time.time()

    # --- a clean store: copied, cleaned and published by the real agents, and work in flight
    published = [
        plant.request(i, task="261121_200000:alice_rec_pub", dataset=DATASET) for i in range(3)
    ]
    plain = [plant.request(10 + i, task="261121_200001:alice_rec") for i in range(3)]
    # The cleaner takes the files without publication; the publisher cleans what it publishes.
    assert step(Cleaner(config, "c1"))["cleaned"] == 3
    report = step(Publisher(config, "p1"))
    assert (report["published"], report["cleaned"]) == (3, 3)
    blocks = EmbeddedCatalog(admin.db(config.store.catalog_db)).dataset_files(DATASET)
    assert [sorted(lfns) for lfns in blocks.values()] == [
        sorted(d["destination_lfn"] for d in published)
    ]
    in_flight = plant.request(20, task="261121_200002:alice_rec_new", to=(), dest=False)
    fresh_orphan = f"/store/temp/user/alice.rec/{plant.token}/fresh_unrecorded.root"
    write_file(config, SOURCES[1], fresh_orphan, 300)  # its request may be on its way

    clean = run_reconcile(config, admin)
    assert clean.findings == [] and clean.errors == [], clean
    assert clean.checked["requests"] == 7 and clean.checked["destinations"] == 6
    assert clean.checked["temp_files"] == 2  # the fresh one and the in-flight request's
    result = CliRunner().invoke(cli(config), ["reconcile"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "all agree" in result.stdout

    # --- one disagreement of each kind, and a lost file
    old = now - 2 * HOUR
    stuck = plant.request(
        30,
        task="261121_200003:alice_rec_stuck",
        to=("submitted",),
        dest=False,
        at=old,
        transfer={"job_id": str(uuid.uuid4()), "service": "gfal", "file_id": "x"},
        attempts=[{"job_id": "j", "service": "gfal", "submitted": old}],
    )
    orphan = f"/store/temp/user/alice.rec/{plant.token}/old_unrecorded.root"
    write_file(config, SOURCES[1], orphan, 400)
    os.utime(export_path(config, SOURCES[1], orphan), (old, old))
    leftover, recopy, lost = plain
    plant.rewrite_temp(leftover)  # the cleaner said cleaned: the copy came back
    plant.dest(recopy).unlink()  # destination gone, temporary copy still there...
    plant.rewrite_temp(recopy)  # ...(which is therefore no leftover)
    plant.dest(lost).unlink()  # destination gone, temporary copy gone: lost
    damaged = plant.request(31, task="261121_200004:alice_rec_bad")
    plant.dest(damaged).write_bytes(bytes(len(plant.content[damaged["_id"]])))  # same size
    # The catalog: block B holds `extra` (whose request waits for publication), and `missing`
    # says it is published in B, which does not hold it.
    task = "261121_200005:alice_rec_cat"
    extra = plant.request(40, task=task, dataset=OTHER_DATASET)
    block = make_block([extra])
    assert EmbeddedCatalog(accounts["agent"].db(config.store.catalog_db)).publish_block(block)
    missing = plant.request(41, task=task, dataset=OTHER_DATASET)
    missing = plant.move(missing, PUBLICATION, "published", publication_block=block.name)

    expected = Counter(
        {
            (STUCK, stuck["_id"]): 1,
            (ORPHAN_TEMP, orphan): 1,
            (LEFTOVER_TEMP, leftover["_id"]): 1,
            (DESTINATION_MISSING, recopy["_id"]): 1,
            (DESTINATION_MISSING, lost["_id"]): 1,
            (DESTINATION_MISMATCH, damaged["_id"]): 1,
            (CATALOG_MISSING, missing["_id"]): 1,
            (CATALOG_EXTRA, extra["_id"]): 1,
        }
    )
    report = run_reconcile(config, admin)
    assert report.errors == []
    assert found(report) == expected
    by_subject = {f.subject: f for f in report.findings}
    assert by_subject[stuck["_id"]].repair.action == reconcile.JOB_LOST
    assert by_subject[orphan].site == SOURCES[1]
    assert (by_subject[orphan].user, by_subject[orphan].size) == ("alice", 400)
    assert by_subject[orphan].age >= time.time() - old - 60
    assert by_subject[recopy["_id"]].repair.changes == (
        (STATE, "done", "new"),
        (CLEANUP, "cleaned", "pending"),
    )
    assert by_subject[damaged["_id"]].repair.delete_destination
    assert by_subject[damaged["_id"]].detail.startswith(f"destination copy at {DESTINATION}: ")
    assert by_subject[lost["_id"]].lost and by_subject[lost["_id"]].repair is None
    assert "LOST" in by_subject[lost["_id"]].detail
    assert by_subject[missing["_id"]].repair.changes == ((PUBLICATION, "published", "pending"),)
    assert by_subject[extra["_id"]].repair is None and by_subject[extra["_id"]].block == block.name

    # --- the agent reports the same, logs each finding, and changes nothing
    revs = {d["_id"]: d["_rev"] for d in db.get_many(d["_id"] for d in [*plain, stuck]).values()}
    with caplog.at_level(logging.WARNING, logger="aso.agent.reconciler"):
        cycle = step(Reconciler(config, "r1"))
    assert {k: cycle[k] for k in reconcile.KINDS} == {
        reconcile.CONFLICT: 0,
        STUCK: 1,
        ORPHAN_TEMP: 1,
        LEFTOVER_TEMP: 1,
        DESTINATION_MISSING: 2,
        DESTINATION_MISMATCH: 1,
        CATALOG_MISSING: 1,
        CATALOG_EXTRA: 1,
    }
    assert cycle["lost"] == 1 and cycle["check_errors"] == 0
    logged = [r for r in caplog.records if r.name == "aso.agent.reconciler"]
    assert any(r.levelno == logging.ERROR and lost["_id"] in r.getMessage() for r in logged)
    for kind, subject in expected:
        assert any(r.getMessage().startswith(f"{kind} {subject}") for r in logged), kind
    after = db.get_many(revs)
    assert {i: d["_rev"] for i, d in after.items()} == revs
    assert export_path(config, SOURCES[1], orphan).exists() and plant.temp(leftover).exists()

    # --- the command: a table per kind and exit 1; --fix repairs through legal transitions
    result = CliRunner().invoke(cli(config), ["reconcile"], env={"COLUMNS": "250"})
    assert result.exit_code == 1, result.output
    print(result.stdout)
    for title in cli_titles():
        assert title in result.stdout
    assert "8 disagreement(s)" in result.stdout and "1 file(s) LOST" in result.stdout
    assert "Orphan temporary files by user" in result.stdout
    oldest = reconcile.age_text(by_subject[orphan].age)
    assert f"alice\t1\t400\t{oldest}" in result.stdout.splitlines()  # a pipe: tab-separated
    result = CliRunner().invoke(cli(config), ["reconcile", "--kind", "nonsense"])
    assert result.exit_code == 2
    result = CliRunner().invoke(cli(config), ["reconcile", "--fix", "--json"])
    assert result.exit_code == 1, result.output  # the lost file and the catalog entry remain
    fixes = {
        (f["finding"]["kind"], f["finding"]["request_id"] or f["finding"]["path"]): f
        for f in json.loads(result.stdout)["fixes"]
    }
    assert {key for key, f in fixes.items() if f["repaired"]} == set(expected) - {
        (DESTINATION_MISSING, lost["_id"]),
        (CATALOG_EXTRA, extra["_id"]),
    }, fixes
    assert len(fixes) == 6  # report-only findings are not tried

    docs = db.get_many(d["_id"] for d in [stuck, leftover, recopy, lost, damaged, extra, missing])
    last = {i: d["history"][-1] for i, d in docs.items()}
    assert docs[stuck["_id"]][STATE] == "failed_attempt"
    assert docs[stuck["_id"]]["error_class"] == "job_lost"
    assert docs[stuck["_id"]]["attempts"][-1]["outcome"] == "failed"
    assert last[stuck["_id"]]["by"] == f"reconciler:{admin.user}"
    assert not export_path(config, SOURCES[1], orphan).exists()
    assert export_path(config, SOURCES[1], fresh_orphan).exists()  # within the grace
    assert not plant.temp(leftover).exists() and plant.dest(leftover).exists()
    assert docs[leftover["_id"]]["_rev"] == revs[leftover["_id"]]
    assert (docs[recopy["_id"]][STATE], docs[recopy["_id"]][CLEANUP]) == ("new", "pending")
    assert [(h["axis"], h["from"], h["to"]) for h in docs[recopy["_id"]]["history"][-2:]] == [
        (STATE, "done", "new"),
        (CLEANUP, "cleaned", "pending"),
    ]
    assert plant.temp(recopy).exists()
    assert (docs[damaged["_id"]][STATE], docs[damaged["_id"]][CLEANUP]) == ("new", "pending")
    assert not plant.dest(damaged).exists()  # the damaged copy made room for a good one
    assert docs[missing["_id"]][PUBLICATION] == "pending"
    assert docs[missing["_id"]]["publication_block"] is None
    assert docs[lost["_id"]]["_rev"] == revs[lost["_id"]]  # nothing touched
    assert docs[extra["_id"]][PUBLICATION] == "pending"

    # --- what is left is what cannot be repaired
    left = run_reconcile(config, admin)
    assert found(left) == Counter(
        {(DESTINATION_MISSING, lost["_id"]): 1, (CATALOG_EXTRA, extra["_id"]): 1}
    )

    # --- the requests put back are copied again by the normal pipeline
    again = [recopy["_id"], damaged["_id"], in_flight["_id"]]
    runners = [
        Runner(Submitter(config, "s1")),
        Runner(Monitor(config, "m1")),
        Runner(GfalWorker(config, "w1")),
    ]
    try:
        run_until(
            lambda: all(d[STATE] == "done" for d in db.get_many(again).values()),
            runners,
            timeout=30,
        )
    finally:
        runners[2].agent.close()
    for doc in (recopy, damaged):
        assert plant.dest(doc).read_bytes() == plant.content[doc["_id"]]
    assert found(run_reconcile(config, admin)) == found(left)


def cli_titles() -> list[str]:
    from aso.cli.reconcile import TITLES

    return [f"{title} (" for title in TITLES.values()]


# --- the checks as plain functions --------------------------------------------------------------
def request(**kw: Any) -> Request:
    doc = judged_request(
        user="alice",
        task="261121_120000:alice_t",
        job_id=1,
        source=SOURCES[0],
        destination=DESTINATION,
        source_lfn=f"/store/temp/user/alice/{uuid.uuid4().hex}.root",
        destination_lfn=f"/store/user/alice/{uuid.uuid4().hex}.root",
        size=1,
        adler32="00000001",
        publish=True,
        publish_info={"dataset": DATASET},
        at=kw.pop("created", 0.0),
    )
    doc["_rev"] = "1-x"
    for axis, to, at in kw.pop("moves", []):
        doc = model.transition(doc, [Change(axis, to, "t")], model.ADMIN, at=at)
    doc.update(kw)
    return Request.from_doc(doc)


def test_stuck_is_judged_per_axis_from_the_history():
    now = 100 * HOUR
    done = [(STATE, "submitted", 2), (STATE, "done", now - 10)]
    fresh_cleanup = request(moves=done)
    assert reconcile.find_stuck([fresh_cleanup], now, HOUR) == []
    # Done long ago: cleanup and publication have waited since then, each is reported.
    old_done = request(moves=[(STATE, "done", now - 2 * HOUR)])
    assert sorted(f.detail.split()[0] for f in reconcile.find_stuck([old_done], now, HOUR)) == [
        CLEANUP,
        PUBLICATION,
    ]
    # A retry past its cool-off is the submitter's, as a new file is: reported, not moved.
    retry = request(moves=[(STATE, "retry", now - 2 * HOUR)], retry_after=now - HOUR)
    [f] = reconcile.find_stuck([retry], now, HOUR)
    assert f.repair is None and "its cool-off ended 1.0 h ago" in f.detail, f.detail
    assert "up to the submitter" in f.detail, f.detail
    # A failed file's temporary copy is the cleaner's once its grace is over: stuck only when
    # it is still there `stuck_after` later.
    failed = request(moves=[(STATE, "failed", now - 2 * HOUR)])
    assert reconcile.find_stuck([failed], now, HOUR, failed_grace=2 * HOUR) == []
    [f] = reconcile.find_stuck([failed], now, HOUR, failed_grace=HOUR)
    assert f.detail.startswith("cleanup pending for 1.0 h; up to the cleaner, which discards"), (
        f.detail
    )
    gone = request(moves=[(STATE, "failed", 0.0), (CLEANUP, "cleaned", 1.0)])
    assert reconcile.find_stuck([gone], now, HOUR) == []


def test_a_published_file_in_another_block_gets_that_block_recorded():
    moves = [(STATE, "done", 1.0), (PUBLICATION, "published", 3)]
    doc = request(moves=moves, publication_block=DATASET + "#wrong")
    catalog = CatalogState(
        blocks={DATASET + "#right": [doc.destination_lfn], DATASET + "#wrong": ["/store/user/x"]},
        lfn_block={doc.destination_lfn: DATASET + "#right", "/store/user/x": DATASET + "#wrong"},
    )
    [f] = reconcile.find_catalog_missing([doc], catalog)
    assert f.repair.changes == () and f.repair.operation == "block_corrected"
    assert f.repair.args == {"block": DATASET + "#right"}
    assert f.repair.role == AGENT
    # The right block's file is not reported as extra; a file without a request is not either.
    assert reconcile.find_catalog_extra({doc.destination_lfn: doc}, catalog) == []


def test_a_retry_past_its_cool_off_is_left_to_the_submitter(files_db, accounts, store_config):
    """Issue 22: the submitter takes a `retry` once its cool-off is over (no write back to `new`
    first), so the reconciler proposes no repair for one: it reports it with the agent to look
    at, and `--fix` leaves the document as it was (no revision, no history entry)."""
    agent = accounts["agent"].db(files_db)
    doc = sample_request("alice")
    doc["_rev"] = accounts["alice"].db(files_db).create(doc)
    old = time.time() - 2 * HOUR
    for to in ("submitted", "failed_attempt", "retry"):
        doc = model.transition(doc, [Change(STATE, to, "t")], AGENT, at=old)
        if to == "submitted":
            doc["transfer"] = {"job_id": "j1", "service": "gfal", "file_id": doc["_id"]}
        if to == "retry":
            doc["retry_after"] = old + 60
        doc["_rev"] = agent.put(doc)
    [finding] = reconcile.find_stuck([Request.from_doc(doc)], time.time(), HOUR)
    assert finding.repair is None and "up to the submitter" in finding.detail, finding.detail
    assert reconcile.Fixer(store_config, None, agent, None).apply([finding]) == []
    assert agent.get(doc["_id"])["_rev"] == doc["_rev"]


def test_a_cycle_tells_a_few_findings_of_a_kind_and_counts_the_rest(
    rec_config: Config, accounts: dict[str, Server], caplog
):
    """A user's 30,000 requests recorded `done` with no file at the destination had made the
    agent log 30,000 ERROR lines a cycle: the first TOLD_PER_KIND of a kind are told at their
    level, the others at DEBUG, and how many more there were."""
    plant = Plant(rec_config, accounts)
    many = reconciler_module.TOLD_PER_KIND + 5
    for job in range(many):
        plant.request(job, task="261121_200003:alice_rec_many", dest=False)
    with caplog.at_level(logging.DEBUG, logger="aso.agent.reconciler"):
        cycle = step(Reconciler(rec_config, "r1"))
    assert cycle[DESTINATION_MISSING] == many
    told = [r for r in caplog.records if r.getMessage().startswith(DESTINATION_MISSING)]
    levels = Counter(r.levelno for r in told)
    assert levels == {logging.WARNING: reconciler_module.TOLD_PER_KIND, logging.DEBUG: 5}, levels
    more = [r.getMessage() for r in caplog.records if "more destination_missing" in r.getMessage()]
    assert more == [
        "5 more destination_missing findings (at DEBUG; `aso reconcile` lists them all)"
    ]


def test_a_long_pass_keeps_the_agent_s_watchdog_from_firing(
    rec_config: Config, accounts: dict[str, Server], monkeypatch
):
    """A pass over 135,000 `done` requests outlasts agents.hang_timeout (1,800 s): the watchdog
    would have killed the reconciler mid-pass every time. As it checks each file it re-arms the
    watchdog, so only a turn that waits on nothing is killed."""
    plant = Plant(rec_config, accounts)
    many = 12
    for job in range(many):
        plant.request(job, task="261130_000001:alice_rec_long", dest=False)
    armed: list[float] = []
    monkeypatch.setattr(faulthandler, "dump_traceback_later", lambda t, **kw: armed.append(t))
    cycle = step(Reconciler(rec_config, "r1"))
    assert cycle[DESTINATION_MISSING] == many
    # once a page of documents, once a site listed, once a file checked
    assert len(armed) >= many + len(reconcile.storage_sites(rec_config)) + 1, armed
    assert set(armed) == {rec_config.agents.hang_timeout}


def test_orphan_temporary_files_are_summed_up_per_user():
    """`aso reconcile`'s table of each user's orphan temporary files: the owner from the path
    (the hash of /store/temp/user/<name>.<hash>/ has no dot), files, bytes, the oldest's age;
    most bytes first; a file outside the users' areas is "?"'s."""

    def orphan(lfn: str, size: int, age: float) -> reconcile.Finding:
        return reconcile.Finding(ORPHAN_TEMP, "x", path=lfn, site=SOURCES[0],
                                 user=reconcile.temp_owner(lfn), size=size, age=age)  # fmt: skip

    findings = [
        orphan("/store/temp/user/alice.ab12/t/1.root", 100, 50.0),
        orphan("/store/temp/user/alice.ab12/t/2.root", 300, 7200.0),
        orphan("/store/temp/user/j.doe.x-9/t/1.root", 1000, 10.0),
        orphan("/store/temp/other/1.root", 5, 1.0),
        reconcile.Finding(STUCK, "not an orphan", request_id="r", size=10**9),
    ]
    assert reconcile.orphans_by_user(findings) == [
        reconcile.UserOrphans("j.doe", 1, 1000, 10.0),
        reconcile.UserOrphans("alice", 2, 400, 7200.0),
        reconcile.UserOrphans("?", 1, 5, 1.0),
    ]
