"""Nothing is published or recorded done that is not at its destination, on real storage (XRootD
servers, gfal2), the real store and the embedded catalog.

* The publisher confirms every file at its destination before the catalog: a request its owner
  created `done`/`not_needed`/`pending` (a job that "wrote its output at the destination
  already") for a file that is not there, or is there with another size or adler32, is never
  published; its publication error names what was found and follows the backoff to
  `publication_failed`; the rest of its block is published. A destination that cannot be
  asked holds the publication (an error with its backoff), never a guess.
* The monitor records `done` only a copy confirmed at the destination: by the service's own
  checksum comparison (the gfal worker, FTS3 with verification), else by a look of its own; a
  copy reported done whose file is missing or different is a failed attempt.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from aso import sites
from aso.actions import republish
from aso.agents.gfal_worker import GfalWorker
from aso.agents.monitor import Monitor
from aso.agents.publisher import Publisher
from aso.agents.submitter import Submitter
from aso.catalog.embedded import EmbeddedCatalog
from aso.config import Config
from aso.core import request
from aso.core.destination import (
    CONFIRMED,
    DIFFERENT,
    UNANSWERED,
    UNCHECKED,
    awaits_a_look,
    found,
    not_done,
    unchecked,
)
from aso.files import MISSING, Confirmer, Look, open_files
from aso.local.pki import Pki
from aso.local.xrootd import adler32_hex, export_path, write_file
from aso.model import CLEANUP, PUBLICATION, STATE
from aso.provision.designdocs import init_catalog_db
from aso.runtime import Runner
from aso.store import admin as store_admin
from aso.transfer import errors
from aso.transfer.base import DONE, FAILED, FileStatus, FileTransfer, JobRequest
from aso.transfer.fts3 import Fts3Service
from aso.upload import judged_request, upload
from tests.conftest import DESTINATION, SOURCES
from tests.fts3_double import Fts3Double
from tests.pipeline_helpers import jobs_of, run_until, states
from tests.test_fts3 import double_for

DATASET = "/Prim/alice-ghost-v1/USER"
TASK = "261121_200000:alice_ghost"


class CountedFiles:
    """Real storage, with the looks at each URL counted."""

    def __init__(self, config: Config) -> None:
        self.files = open_files(config)
        self.looks: Counter[str] = Counter()

    def confirm(self, url: str, size: int, adler32: str) -> str | None:
        self.looks[url] += 1
        return self.files.confirm(url, size, adler32)

    def delete(self, url: str) -> bool:
        return self.files.delete(url)


@pytest.fixture()
def cat_config(gfal_config: Config, admin: Any) -> Any:
    """gfal_config with a catalog of its own; a block closes at once; a publication is tried
    three times, 0.1 s apart at first."""
    name = f"catalog_{gfal_config.store.files_db}"
    init_catalog_db(admin, name)
    yield dataclasses.replace(
        gfal_config,
        store=dataclasses.replace(gfal_config.store, catalog_db=name),
        publisher=dataclasses.replace(
            gfal_config.publisher,
            block_closure_timeout=0,
            max_attempts=3,
            base_delay=0.1,
            max_delay=0.5,
        ),
    )
    store_admin.delete_db(admin, name)


def at_destination(
    config: Config, accounts: Any, n: int, *, there: bytes | None, size: int, adler32: str
) -> dict[str, Any]:
    """A request alice records through the upload API as her job wrapper would for a file it
    wrote at its destination itself (`already_at_destination`: created `done`, cleanup
    `not_needed`, publication `pending`); `there`: what is really at the destination (None:
    nothing)."""
    token = uuid.uuid4().hex[:8]
    doc = judged_request(
        user="alice",
        task=TASK,
        job_id=str(n),
        source=SOURCES[0],
        destination=DESTINATION,
        source_lfn=f"/store/temp/user/alice.abc/ghost/{token}.root",
        destination_lfn=f"/store/user/alice/ghost/{token}.root",
        size=size,
        adler32=adler32,
        publish=True,
        publish_info={"dataset": DATASET, "events": 10, "lumis": {"1": [n]}, "parents": []},
        already_at_destination=True,
    )
    if there is not None:
        write_file(config, DESTINATION, doc["destination_lfn"], there)
    owner = accounts["alice"].db(config.store.files_db)
    assert upload(owner, [doc]).recorded == [doc["_id"]]
    stored = owner.get(doc["_id"])
    assert (stored[STATE], stored[CLEANUP], stored[PUBLICATION]) == (
        "done",
        "not_needed",
        "pending",
    )
    return stored


def publish(config: Config, files: Any = None) -> dict[str, Any]:
    runner = Runner(Publisher(config, "p1", files=files))
    runner.workset.start()
    try:
        return runner.step(wait=False)
    finally:
        runner.agent.close()


def stored(config: Config, accounts: Any, docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return accounts["agent"].db(config.store.files_db).get_many(d["_id"] for d in docs)


def catalog_lfns(config: Config, admin: Any) -> list[list[str]]:
    blocks = EmbeddedCatalog(admin.db(config.store.catalog_db)).dataset_files(DATASET)
    return sorted(blocks.values())


# --- the publisher -------------------------------------------------------------------------------
def test_a_file_that_is_not_at_its_destination_is_never_published(cat_config, accounts, admin):
    """Three requests created `done` for files that are not at their destination as they
    claim (nothing there; another size; another adler32) and one that is: the one is
    published in the block (the rest of the block does not wait); each of the three ends
    `publication_failed` at once, in one write, naming what was found (trying again cannot make
    it appear: a user's 10,000 false claims had cost ten writes each), never in the catalog.
    Its owner resets one whose file is there now (`aso publish --retry`): it is published."""
    config = cat_config
    real = os.urandom(3000)
    ghost = at_destination(config, accounts, 0, there=None, size=3000, adler32=adler32_hex(real))
    short = at_destination(
        config, accounts, 1, there=real[:2000], size=3000, adler32=adler32_hex(real[:2000])
    )
    other = os.urandom(3000)
    forged = at_destination(config, accounts, 2, there=real, size=3000, adler32=adler32_hex(other))
    good = at_destination(config, accounts, 3, there=real, size=3000, adler32=adler32_hex(real))
    bad = [ghost, short, forged]
    why = {
        ghost["_id"]: f"({MISSING})",
        short["_id"]: "(size 2000, expected 3000)",
        forged["_id"]: f"(adler32 {adler32_hex(real)}, expected {adler32_hex(other)})",
    }
    before = stored(config, accounts, bad)

    report = publish(config)
    assert (report["blocks"], report["published"], report["unconfirmed"]) == (1, 1, 3)
    assert (report["failed"], report["errors"]) == (3, 0)
    assert catalog_lfns(config, admin) == [[good["destination_lfn"]]]
    after = stored(config, accounts, [*bad, good])
    assert after[good["_id"]][PUBLICATION] == "published"
    for doc in bad:
        now = after[doc["_id"]]
        assert (now[PUBLICATION], now["publication_attempts"]) == ("publication_failed", 1)
        reason = (
            f"not published: {doc['destination_lfn']} at {DESTINATION} is not the requested "
            f"file {why[doc['_id']]}"
        )
        assert now["publication_error"] == reason and now["history"][-1]["reason"] == reason
        assert now["publication_block"] is None and now["publication_retry_after"] is None
        moves = [h["to"] for h in now["history"] if h["axis"] == PUBLICATION]
        assert moves == ["publication_failed"]
        generation = int(before[doc["_id"]]["_rev"].split("-")[0])
        assert now["_rev"].startswith(f"{generation + 1}-")  # one write

    # Given up is given up: nothing more happens, and the catalog never held them.
    time.sleep(0.6)
    publish(config)
    assert stored(config, accounts, bad) == {d["_id"]: after[d["_id"]] for d in bad}
    assert catalog_lfns(config, admin) == [[good["destination_lfn"]]]

    # The ghost's job wrote its file after all: its owner resets it, and it is published.
    write_file(config, DESTINATION, ghost["destination_lfn"], real)
    owner = accounts["alice"].db(config.store.files_db)
    reset = republish(owner, TASK, ghost["job_id"], "alice")
    assert reset.changed == {ghost["_id"]: "pending"}
    report = publish(config)
    assert (report["published"], report["unconfirmed"]) == (1, 0)
    final = stored(config, accounts, bad)
    assert final[ghost["_id"]][PUBLICATION] == "published"
    assert {final[d["_id"]][PUBLICATION] for d in (short, forged)} == {"publication_failed"}
    assert sorted(lfn for block in catalog_lfns(config, admin) for lfn in block) == sorted(
        [good["destination_lfn"], ghost["destination_lfn"]]
    )


def test_a_destination_that_cannot_be_asked_holds_the_publication(
    cat_config, accounts, admin, watchdog
):
    """The destination's storage is down: the file is not published on a guess; it waits
    (`publication_error` with its backoff, one attempt spent, not failed), and is published
    once the storage answers again."""
    config = cat_config
    data = os.urandom(3000)
    doc = at_destination(config, accounts, 0, there=data, size=3000, adler32=adler32_hex(data))
    [site] = [s for s in watchdog.storage.status() if s.site == DESTINATION]
    with watchdog.paused():
        os.kill(site.pid, signal.SIGKILL)
        report = publish(config)
        watchdog.storage.start()
    assert (report["published"], report["unconfirmed"], report["failed"]) == (0, 1, 0)
    waiting = stored(config, accounts, [doc])[doc["_id"]]
    assert (waiting[PUBLICATION], waiting["publication_attempts"]) == ("publication_error", 1)
    assert waiting["publication_error"].startswith(
        f"not published yet: {doc['destination_lfn']} at {DESTINATION} could not be checked ("
    )
    assert catalog_lfns(config, admin) == []

    time.sleep(0.3)  # the backoff
    report = publish(config)
    assert report["published"] == 1
    assert stored(config, accounts, [doc])[doc["_id"]][PUBLICATION] == "published"
    assert catalog_lfns(config, admin) == [[doc["destination_lfn"]]]


def test_a_look_that_has_not_answered_leaves_the_file_waiting_unwritten(
    cat_config, accounts, admin, monkeypatch
):
    """A destination that answers slowly (a large file's checksum): the publisher does not
    wait for it beyond its bound, writes nothing (no attempt spent: the storage is not
    failing), and the next cycle publishes the file with what that same look found."""
    monkeypatch.setattr("aso.agents.publisher.LOOK_WAIT", 0.2)
    config = cat_config
    data = os.urandom(3000)
    doc = at_destination(config, accounts, 0, there=data, size=3000, adler32=adler32_hex(data))
    held = HeldFiles(config)
    publisher = Publisher(config, "p1", files=held)
    runner = Runner(publisher)
    runner.workset.start()
    try:
        report = runner.step(wait=False)
        assert (report["looking"], report["published"], report["unconfirmed"]) == (1, 0, 0)
        assert stored(config, accounts, [doc])[doc["_id"]]["_rev"] == doc["_rev"]  # unwritten
        held.release.set()
        deadline = time.monotonic() + 10
        while not all(f.done() for _, f in publisher.confirmer.late.values()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        report = runner.step(wait=False)
        assert report["published"] == 1
    finally:
        held.release.set()
        publisher.close()
    assert list(held.looks.values()) == [1]
    assert catalog_lfns(config, admin) == [[doc["destination_lfn"]]]


# --- the monitor ---------------------------------------------------------------------------------
def copy_files(config: Config, accounts: Any, admin: Any, n: int) -> list[dict[str, Any]]:
    """n real files copied by the gfal worker to the destination, their jobs finished in the
    job table, and the monitor not run yet: the requests are still `submitted`."""
    token = uuid.uuid4().hex[:8]
    docs = []
    for i in range(n):
        lfn = f"/store/temp/user/alice.abc/copied/{token}/out_{i}.root"
        stored_file = write_file(config, SOURCES[0], lfn, 2000 + i)
        docs.append(
            judged_request(
                user="alice",
                task="261121_200100:alice_copied",
                job_id=str(i),
                source=SOURCES[0],
                destination=DESTINATION,
                source_lfn=lfn,
                destination_lfn=f"/store/user/alice/copied/{token}/out_{i}.root",
                size=stored_file.size,
                adler32=stored_file.adler32,
            )
        )
    assert upload(accounts["alice"].db(config.store.files_db), docs).ok
    ids = [d["_id"] for d in docs]
    worker = GfalWorker(config, "w1")
    try:

        def copied() -> bool:
            entries = [e for job in jobs_of(admin, config) for e in job["files"].values()]
            return len(entries) == n and all(e["state"] == DONE for e in entries)

        run_until(copied, [Runner(Submitter(config, "s1")), Runner(worker)], 120)
    finally:
        worker.close()
    db = admin.db(config.store.files_db)
    assert states(db, ids) == Counter(submitted=n)
    return list(db.get_many(ids).values())


def monitor(config: Config, files: Any = None) -> dict[str, Any]:
    runner = Runner(Monitor(config, "m1", files=files))
    runner.workset.start()
    try:
        return runner.step(wait=False)
    finally:
        runner.agent.close()


def unverified(config: Config) -> Config:
    """Jobs that ask for no checksum verification: the service's "done" confirms nothing."""
    return dataclasses.replace(
        config, transfer=dataclasses.replace(config.transfer, verify_checksum=False)
    )


def test_a_copy_reported_done_that_is_not_at_the_destination_is_a_failed_attempt(
    gfal_config, accounts, admin
):
    """Jobs without checksum verification: the gfal service reports three copies done; one
    destination has been deleted since, one replaced by a shorter file. The monitor looks at
    each destination once: the intact copy is done (and its temporary copy deleted without a
    second look), the two others are failed attempts of class checksum_mismatch, with what
    was found."""
    config = unverified(gfal_config)
    intact, gone, cut = copy_files(config, accounts, admin, 3)
    export_path(config, DESTINATION, gone["destination_lfn"]).unlink()
    write_file(config, DESTINATION, cut["destination_lfn"], b"x" * 100)
    files = CountedFiles(config)
    report = monitor(config, files)
    assert (report["looked"], report["unconfirmed"], report["done"], report["failed"]) == (
        3,
        2,
        1,
        2,
    )
    assert sorted(files.looks.values()) == [1, 1, 1]  # one look per file, none at deletion
    after = stored(config, accounts, [intact, gone, cut])
    assert after[intact["_id"]][STATE] == "done"
    assert after[intact["_id"]][CLEANUP] == "cleaned"
    assert not export_path(config, SOURCES[0], intact["source_lfn"]).exists()
    for doc, found_there in ((gone, MISSING), (cut, f"size 100, expected {cut['size']}")):
        now = after[doc["_id"]]
        assert (now[STATE], now["error_class"]) == ("failed_attempt", errors.CHECKSUM)
        assert now["failure_reason"] == (
            f"reported done by the transfer service, but {doc['destination_lfn']} at "
            f"{DESTINATION} is not the requested file: {found_there}"
        )
        assert now["attempts"][-1]["outcome"] == "failed"
        assert export_path(config, SOURCES[0], doc["source_lfn"]).exists()  # kept


def test_a_destination_that_cannot_be_asked_keeps_the_copy_waiting(
    gfal_config, accounts, admin, watchdog
):
    """Jobs without checksum verification, the destination's storage down when the monitor
    looks: the file is neither done nor failed; it is `done` once the storage answers."""
    config = unverified(gfal_config)
    [doc] = copy_files(config, accounts, admin, 1)
    [site] = [s for s in watchdog.storage.status() if s.site == DESTINATION]
    with watchdog.paused():
        os.kill(site.pid, signal.SIGKILL)
        report = monitor(config)
        watchdog.storage.start()
    assert (report["looked"], report["unconfirmed"], report["done"], report["failed"]) == (
        1,
        1,
        0,
        0,
    )
    assert stored(config, accounts, [doc])[doc["_id"]]["_rev"] == doc["_rev"]  # untouched
    report = monitor(config)
    assert (report["looked"], report["done"]) == (1, 1)
    assert stored(config, accounts, [doc])[doc["_id"]][STATE] == "done"


def test_a_copy_the_service_verified_is_done_without_a_look_of_the_monitor(
    gfal_config, accounts, admin
):
    """Jobs with checksum verification (the default): the gfal worker compared the
    destination's adler32 with the request's, so its "done" is the confirmation; the monitor
    does not look again (the deletion of the temporary copy looks once, as the cleaner's rule
    wants)."""
    docs = copy_files(gfal_config, accounts, admin, 2)
    files = CountedFiles(gfal_config)
    report = monitor(gfal_config, files)
    assert (report["looked"], report["done"]) == (0, 2)
    assert sorted(files.looks.values()) == [1, 1]  # the deletions' own looks
    assert all(d[STATE] == "done" for d in stored(gfal_config, accounts, docs).values())


# --- FTS3 ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fts_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def fts_proxies(fts_pki: Pki) -> dict[str, Path]:
    return {name: fts_pki.proxy_file(fts_pki.user(name)) for name in ("aso-service", "alice")}


@pytest.fixture()
def fts_double(fts_pki: Pki) -> Any:
    """The FTS3 double (tests/fts3_double.py) over HTTPS, as tests/test_fts3.py runs it."""
    with double_for(fts_pki) as double:
        yield double


def fts_config(
    config: Config, fts_pki: Pki, fts_double: Fts3Double, proxy: Path, verify: bool
) -> Config:
    return dataclasses.replace(
        config,
        transfer=dataclasses.replace(config.transfer, backend="fts3", verify_checksum=verify),
        fts3=dataclasses.replace(
            config.fts3,
            endpoint=fts_double.url,
            proxy=str(proxy),
            capath=str(fts_pki.capath),
            timeout=10.0,
        ),
    )


def submitted_at_fts(
    config: Config, accounts: Any, fts_proxies: dict[str, Path], n: int
) -> tuple[str, list[dict[str, Any]]]:
    """n requests of alice submitted to FTS3 in one job (as the submitter would), real files at
    the source; the FTS job id."""
    token = uuid.uuid4().hex[:8]
    docs = []
    for i in range(n):
        lfn = f"/store/temp/user/alice.abc/fts/{token}/out_{i}.root"
        source_file = write_file(config, SOURCES[0], lfn, 1500 + i)
        docs.append(
            judged_request(
                user="alice",
                task="261121_200200:alice_fts",
                job_id=str(i),
                source=SOURCES[0],
                destination=DESTINATION,
                source_lfn=lfn,
                destination_lfn=f"/store/user/alice/fts/{token}/out_{i}.root",
                size=source_file.size,
                adler32=source_file.adler32,
            )
        )
    owner = accounts["alice"].db(config.store.files_db)
    assert upload(owner, docs).ok
    docs = [owner.get(d["_id"]) for d in docs]
    service = Fts3Service(config)
    try:
        job_id = service.submit(
            JobRequest(
                key=f"test:{token}",
                files=tuple(
                    FileTransfer(
                        file_id=d["_id"],
                        source=sites.temp_pfn(config, d["source"], d["source_lfn"]),
                        destination=sites.pfn(config, d["destination"], d["destination_lfn"]),
                        size=d["size"],
                        adler32=d["checksum"]["adler32"],
                    )
                    for d in docs
                ),
                user="alice",
                task=docs[0]["task"],
                source_site=SOURCES[0],
                destination_site=DESTINATION,
                verify_checksum=config.transfer.verify_checksum,
                credentials=str(fts_proxies["alice"]),
            )
        )
    finally:
        service.close()
    agent = accounts["agent"].db(config.store.files_db)
    for i, doc in enumerate(docs):
        now = time.time()
        lease = {"owner": "test", "until": now, "job_key": job_id}
        docs[i] = request.submitted(doc, job_id, "fts3", "test", now, lease)
        docs[i]["_rev"] = agent.put(docs[i])
    return job_id, docs


def test_fts3_reports_a_copy_verified_only_when_its_job_checked_the_destination(
    gfal_config, accounts, fts_pki, fts_double, fts_proxies
):
    """FTS3's FINISHED is a confirmation when the job asked FTS to compare the destination's
    checksum with the request's (ASO asks "both"); a job without verification reports its
    copies unverified, and a failed file is never verified."""
    for verify in (True, False):
        config = fts_config(gfal_config, fts_pki, fts_double, fts_proxies["aso-service"], verify)
        job_id, docs = submitted_at_fts(config, accounts, fts_proxies, 2)
        fts_double.set_file_state(job_id, 0, "FINISHED")
        fts_double.set_file_state(job_id, 1, "FAILED", reason="TRANSFER error")
        service = Fts3Service(config)
        try:
            job = service.status([job_id])[job_id]
        finally:
            service.close()
        assert job is not None
        finished, failed = job.files[docs[0]["_id"]], job.files[docs[1]["_id"]]
        assert (finished.state, finished.verified) == (DONE, verify)
        assert (failed.state, failed.verified) == (FAILED, False)


def test_fts3_without_verification_a_finished_copy_is_looked_at(
    gfal_config, accounts, admin, fts_pki, fts_double, fts_proxies
):
    """FTS3 jobs without checksum verification: FTS reports two files FINISHED; one is at the
    destination as requested (done), the other is not there (a failed attempt)."""
    config = fts_config(gfal_config, fts_pki, fts_double, fts_proxies["aso-service"], verify=False)
    job_id, (there, missing) = submitted_at_fts(config, accounts, fts_proxies, 2)
    data = export_path(config, SOURCES[0], there["source_lfn"]).read_bytes()
    write_file(config, DESTINATION, there["destination_lfn"], data)  # FTS's copy
    fts_double.set_file_state(job_id, 0, "FINISHED")
    fts_double.set_file_state(job_id, 1, "FINISHED")
    report = monitor(config)
    assert (report["looked"], report["done"], report["failed"]) == (2, 1, 1)
    after = stored(config, accounts, [there, missing])
    assert after[there["_id"]][STATE] == "done"
    lost = after[missing["_id"]]
    assert (lost[STATE], lost["error_class"]) == ("failed_attempt", errors.CHECKSUM)
    assert lost["failure_reason"].endswith(f"is not the requested file: {MISSING}")


# --- the decisions, as plain functions ------------------------------------------------------------
def test_what_a_done_copy_needs_before_it_is_done():
    doc = {
        "_id": "r1",
        "destination": DESTINATION,
        "destination_lfn": "/store/user/alice/f.root",
        "checksum": {"adler32": "0000abcd"},
    }
    verified = FileStatus("r1", DONE, "FINISHED", checksum="abcd", verified=True)
    unseen = FileStatus("r1", DONE, "FINISHED")
    assert not awaits_a_look(verified, None) and not_done(doc, verified, None) is None
    assert awaits_a_look(unseen, None) and awaits_a_look(unseen, unchecked("refused"))
    assert not_done(doc, unseen, found(None)) is None and found(None).verdict == CONFIRMED
    assert found(MISSING).verdict == DIFFERENT
    assert not_done(doc, unseen, found(MISSING)) == (
        f"reported done by the transfer service, but /store/user/alice/f.root at {DESTINATION} "
        f"is not the requested file: {MISSING}"
    )
    wrong = FileStatus("r1", DONE, "FINISHED", checksum="ffff", verified=True)
    assert not_done(doc, wrong, None) == "checksum mismatch: destination ffff, request 0000abcd"
    assert unchecked("x").verdict == UNCHECKED


class HeldFiles:
    """Real storage whose looks wait until released (a slow site, a checksum of a big file)."""

    def __init__(self, config: Config) -> None:
        self.files = open_files(config)
        self.release = threading.Event()
        self.looks: Counter[str] = Counter()

    def confirm(self, url: str, size: int, adler32: str) -> str | None:
        self.looks[url] += 1
        assert self.release.wait(30)
        return self.files.confirm(url, size, adler32)

    def delete(self, url: str) -> bool:
        return self.files.delete(url)


def test_a_slow_look_is_not_repeated_and_its_finding_serves_the_next_call(gfal_config):
    """A look that outlasts the wait is `unanswered` this time; its site gets no new looks
    while it lasts; the next call for the same file takes what it found, without a second
    look."""
    data = os.urandom(1000)
    lfns = [f"/store/user/alice/slow/{uuid.uuid4().hex}.root" for _ in range(2)]
    for lfn in lfns:
        write_file(gfal_config, DESTINATION, lfn, data)
    looks = [
        Look(lfn, DESTINATION, sites.pfn(gfal_config, DESTINATION, lfn), 1000, adler32_hex(data))
        for lfn in lfns
    ]
    held = HeldFiles(gfal_config)
    confirmer = Confirmer(held)
    try:
        first = confirmer.look_all(looks[:1], within=0.2)
        assert first[lfns[0]].verdict == UNANSWERED
        busy = confirmer.look_all(looks[1:], within=0.2)  # the site is still busy
        assert busy[lfns[1]].verdict == UNANSWERED and held.looks[looks[1].url] == 0
        held.release.set()
        deadline = time.monotonic() + 10
        while not confirmer.late[lfns[0]][1].done() and time.monotonic() < deadline:
            time.sleep(0.05)
        again = confirmer.look_all(looks, within=10)
        assert {key: f.verdict for key, f in again.items()} == {
            lfns[0]: CONFIRMED,
            lfns[1]: CONFIRMED,
        }
        assert list(held.looks.values()) == [1, 1]  # the slow one was not looked at twice
    finally:
        held.release.set()
        confirmer.close()
