"""The cleaner against real storage: it deletes a temporary copy only once the destination is
confirmed, never outside the temp area, and retries failed deletions with backoff; a file to be
published is the publisher's to clean, in the write that records it published."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest

from aso import model
from aso.actions import republish
from aso.agents.cleaner import Cleaner
from aso.agents.monitor import Monitor
from aso.agents.publisher import Publisher
from aso.catalog.embedded import EmbeddedCatalog
from aso.files import SimFiles, open_files
from aso.local.xrootd import export_path, write_file
from aso.model import AGENT, CLEANUP, STATE, Change
from aso.provision import storejs
from aso.provision.designdocs import init_catalog_db
from aso.runtime import Runner
from aso.store import admin as store_admin
from aso.upload import judged_request
from tests.conftest import DESTINATION, SOURCES, sample_request


def done_request(
    config,
    accounts,
    *,
    copy: bool = True,
    dest_content: bytes | None = None,
    source_lfn: str | None = None,
    publish_info: dict[str, Any] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """A request whose transfer is `done`: its temporary copy at the source and (unless told
    otherwise) its destination copy are real files."""
    doc = sample_request("alice", source=SOURCES[0], destination=DESTINATION, **kw)
    lfn = source_lfn or doc["source_lfn"]
    stored = write_file(config, SOURCES[0], lfn, os.urandom(3000))
    doc = judged_request(
        user="alice",
        task=doc["task"],
        job_id=doc["job_id"],
        source=SOURCES[0],
        destination=DESTINATION,
        source_lfn=lfn,
        destination_lfn=doc["destination_lfn"],
        size=stored.size,
        adler32=stored.adler32,
        publish=publish_info is not None,
        publish_info=publish_info,
    )
    if copy:
        data = export_path(config, SOURCES[0], lfn).read_bytes()
        write_file(config, DESTINATION, doc["destination_lfn"], dest_content or data)
    # A source outside alice's temporary area: only an admin may write such a request.
    writer = "alice" if storejs.in_temp_area("alice", lfn) else "admin"
    owner = accounts[writer].db(config.store.files_db)
    agent = accounts["agent"].db(config.store.files_db)
    doc["_rev"] = owner.create(doc)
    for to in ("submitted", "done"):
        doc = model.transition(doc, [Change(STATE, to, "test")], AGENT)
        doc["_rev"] = agent.put(doc)
    return doc


def clean(config, docs, cleaner=None) -> dict[str, dict[str, Any]]:
    cleaner = cleaner or Cleaner(config, "c1")
    runner = Runner(cleaner)
    runner.workset.start()
    runner.step(wait=False)
    cleaner.close()
    return cleaner.db.get_many([d["_id"] for d in docs])


def test_cleans_only_what_is_safe(gfal_config, accounts):
    good = done_request(gfal_config, accounts)
    no_copy = done_request(gfal_config, accounts, copy=False)
    bad_copy = done_request(gfal_config, accounts, dest_content=b"x" * 3000)  # wrong adler32
    outside = done_request(
        gfal_config, accounts, source_lfn="/store/user/alice/precious/not_temp.root"
    )
    bobs = done_request(gfal_config, accounts, source_lfn="/store/temp/user/bob.abc/out.root")
    stored = clean(gfal_config, [good, no_copy, bad_copy, outside, bobs])

    assert stored[good["_id"]][CLEANUP] == "cleaned"
    assert not export_path(gfal_config, SOURCES[0], good["source_lfn"]).exists()
    assert export_path(gfal_config, DESTINATION, good["destination_lfn"]).exists()
    assert stored[good["_id"]]["history"][-1]["reason"] == "temporary copy deleted"

    for doc, why in (
        (no_copy, "destination not confirmed (no such file)"),
        (bad_copy, "destination not confirmed (adler32"),
        (outside, "refused: /store/user/alice/precious/not_temp.root is not in alice's temporary"),
        (bobs, "refused: /store/temp/user/bob.abc/out.root is not in alice's temporary area"),
    ):
        after = stored[doc["_id"]]
        assert after[CLEANUP] == "cleanup_error" and after["cleanup_error"].startswith(why)
        assert after["cleanup_attempts"] == 1 and after["cleanup_retry_after"] > 0
        assert export_path(gfal_config, SOURCES[0], doc["source_lfn"]).exists()  # kept


def test_a_copy_already_gone_counts_as_cleaned(gfal_config, accounts):
    doc = done_request(gfal_config, accounts)
    export_path(gfal_config, SOURCES[0], doc["source_lfn"]).unlink()
    after = clean(gfal_config, [doc])[doc["_id"]]
    assert after[CLEANUP] == "cleaned"
    assert after["history"][-1]["reason"] == "temporary copy already gone"


def test_failed_deletions_back_off_and_succeed_later(gfal_config, accounts, watchdog):
    config = dataclasses.replace(
        gfal_config, cleaner=dataclasses.replace(gfal_config.cleaner, base_delay=0.2, max_delay=1.0)
    )
    doc = done_request(config, accounts)
    [site] = [s for s in watchdog.storage.status() if s.site == SOURCES[0]]
    with watchdog.paused():
        os.kill(site.pid, signal.SIGKILL)  # the source's storage is down
        first = clean(config, [doc])[doc["_id"]]
        assert first[CLEANUP] == "cleanup_error" and first["cleanup_error"].startswith(
            "deletion of "
        )
        assert first["cleanup_attempts"] == 1
        watchdog.storage.start()
    time.sleep(0.3)  # the backoff has passed
    second = clean(config, [doc])[doc["_id"]]
    assert second[CLEANUP] == "cleaned" and second["cleanup_error"] is None
    assert [h["to"] for h in second["history"] if h["axis"] == "cleanup"] == [
        "cleanup_error",
        "cleaned",
    ]
    assert not export_path(config, SOURCES[0], doc["source_lfn"]).exists()


def test_nothing_happens_before_the_copy_is_done(gfal_config, accounts):
    doc = sample_request("alice", source=SOURCES[0], destination=DESTINATION)
    accounts["alice"].db(gfal_config.store.files_db).create(doc)
    cleaner = Cleaner(gfal_config, "c1", files=SimFiles())
    clean(gfal_config, [doc], cleaner)
    assert cleaner.files.deleted == []


def sim_done_requests(config, accounts, n: int) -> list[dict[str, Any]]:
    """n `done` requests of the simulator's sites (no data: sim:// URLs)."""
    docs = []
    for _ in range(n):
        doc = sample_request("alice")
        agent = accounts["agent"].db(config.store.files_db)
        doc["_rev"] = accounts["alice"].db(config.store.files_db).create(doc)
        for to in ("submitted", "done"):
            doc = model.transition(doc, [Change(STATE, to, "t")], AGENT)
            doc["_rev"] = agent.put(doc)
        docs.append(doc)
    return docs


def test_sim_back_end_cleans_without_storage(sim_config, accounts):
    docs = sim_done_requests(sim_config, accounts, 3)
    cleaner = Cleaner(sim_config, "c1")
    stored = clean(sim_config, docs, cleaner)
    assert all(d[CLEANUP] == "cleaned" for d in stored.values())
    assert sorted(cleaner.files.sim.deleted) == sorted(
        f"sim://{d['source']}{d['source_lfn']}" for d in docs
    )


DATASET = "/Prim/alice-clean-v1/USER"


@pytest.fixture()
def cat_config(gfal_config, admin):
    """gfal_config with a catalog of its own; a block closes at once."""
    name = f"catalog_{gfal_config.store.files_db}"
    init_catalog_db(admin, name)
    yield dataclasses.replace(
        gfal_config,
        store=dataclasses.replace(gfal_config.store, catalog_db=name),
        publisher=dataclasses.replace(gfal_config.publisher, block_closure_timeout=0),
    )
    store_admin.delete_db(admin, name)


def publish_info(i: int) -> dict[str, Any]:
    return {"dataset": DATASET, "events": 10, "lumis": {"1": [i]}, "parents": []}


def publish(config, files=None) -> dict[str, Any]:
    runner = Runner(Publisher(config, "p1", files=files))
    runner.workset.start()
    try:
        return runner.step(wait=False)
    finally:
        runner.agent.close()


def test_a_published_file_is_cleaned_in_the_same_write(cat_config, accounts, admin):
    """The cleaner leaves a file waiting for publication alone; the publisher deletes its
    temporary copy (the destination confirmed first) and records it `published` and `cleaned`
    in one write: one new revision, one history entry per axis. A file without publication
    is the cleaner's as before."""
    to_publish = done_request(cat_config, accounts, publish_info=publish_info(1))
    not_published = done_request(cat_config, accounts)
    stored = clean(cat_config, [to_publish, not_published])
    assert stored[not_published["_id"]][CLEANUP] == "cleaned"
    assert stored[to_publish["_id"]]["_rev"] == to_publish["_rev"]  # not the cleaner's
    assert export_path(cat_config, SOURCES[0], to_publish["source_lfn"]).exists()

    report = publish(cat_config)
    assert (report["published"], report["cleaned"], report["cleanup_errors"]) == (1, 1, 0)
    after = accounts["agent"].db(cat_config.store.files_db).get(to_publish["_id"])
    assert (after["publication"], after[CLEANUP]) == ("published", "cleaned")
    assert int(after["_rev"].split("-")[0]) == int(to_publish["_rev"].split("-")[0]) + 1
    last = after["history"][-2:]
    assert [(h["axis"], h["to"], h["by"]) for h in last] == [
        ("publication", "published", "p1"),
        (CLEANUP, "cleaned", "p1"),
    ]
    assert last[1]["reason"] == "temporary copy deleted"
    assert not export_path(cat_config, SOURCES[0], to_publish["source_lfn"]).exists()
    assert export_path(cat_config, DESTINATION, to_publish["destination_lfn"]).exists()
    catalog = EmbeddedCatalog(admin.db(cat_config.store.catalog_db))
    assert [after["destination_lfn"]] in catalog.dataset_files(DATASET).values()


class CountedFiles:
    """Real storage, with the looks at each URL counted."""

    def __init__(self, config) -> None:
        self.files = open_files(config)
        self.looks: Counter[str] = Counter()

    def confirm(self, url: str, size: int, adler32: str) -> str | None:
        self.looks[url] += 1
        return self.files.confirm(url, size, adler32)

    def delete(self, url: str) -> bool:
        return self.files.delete(url)


def test_a_publisher_neither_publishes_nor_cleans_a_copy_it_cannot_confirm(
    cat_config, accounts, admin
):
    """The publisher confirms the destination before the catalog: a destination with the wrong
    adler32 is not published (`publication_failed` naming what was found) and its temporary
    copy is kept (only the cleaner deletes one whose publication failed). Once the right copy
    is there and its owner resets it (`aso publish --retry`), the publisher publishes it and
    deletes the temporary copy in the same write, after one look at the destination (the
    deletion does not look again)."""
    config = dataclasses.replace(
        cat_config, publisher=dataclasses.replace(cat_config.publisher, base_delay=0.2)
    )
    doc = done_request(config, accounts, dest_content=b"x" * 3000, publish_info=publish_info(2))
    files = CountedFiles(config)
    report = publish(config, files)
    assert (report["published"], report["unconfirmed"], report["failed"]) == (0, 1, 1)
    assert report["cleanup_errors"] == 0
    after = accounts["agent"].db(config.store.files_db).get(doc["_id"])
    assert (after["publication"], after[CLEANUP]) == ("publication_failed", "pending")
    assert after["publication_error"].startswith(
        f"not published: {doc['destination_lfn']} at {DESTINATION} is not the requested file "
        "(adler32 "
    )
    assert export_path(config, SOURCES[0], doc["source_lfn"]).exists()  # kept
    assert EmbeddedCatalog(admin.db(config.store.catalog_db)).dataset_files(DATASET) == {}

    # The right copy arrives at the destination; reset by its owner, it is published and cleaned.
    data = export_path(config, SOURCES[0], doc["source_lfn"]).read_bytes()
    write_file(config, DESTINATION, doc["destination_lfn"], data)
    owner = accounts["alice"].db(config.store.files_db)
    assert republish(owner, doc["task"], doc["job_id"], "alice").changed == {doc["_id"]: "pending"}
    files.looks.clear()
    report = publish(config, files)
    assert (report["published"], report["cleaned"], report["unconfirmed"]) == (1, 1, 0)
    assert list(files.looks.values()) == [1]  # one look at the destination, none at deletion
    final = accounts["agent"].db(config.store.files_db).get(doc["_id"])
    assert (final["publication"], final[CLEANUP]) == ("published", "cleaned")
    assert not export_path(config, SOURCES[0], doc["source_lfn"]).exists()


def test_the_monitor_deletes_at_done_what_no_publication_waits_for(gfal_config, accounts):
    """The monitor's deletion at `done` follows the cleaner's rules on real storage: a file
    without publication is cleaned (destination confirmed, temporary copy gone, the monitor
    named), one whose destination is wrong keeps its copy (`cleanup_error` with its backoff),
    one waiting for its block is the publisher's (unchanged). What it decided is a write the
    agent may make on the `done` document."""
    plain = done_request(gfal_config, accounts)
    bad_copy = done_request(gfal_config, accounts, dest_content=b"x" * 3000)
    to_publish = done_request(gfal_config, accounts, publish_info=publish_info(3))
    now = time.time()
    monitor = Monitor(gfal_config, "m1")
    try:
        decided = monitor.clean_at_done([plain, bad_copy, to_publish], now)
    finally:
        monitor.close()
    after = {doc["_id"]: doc for doc in decided}

    cleaned = after[plain["_id"]]
    assert cleaned[CLEANUP] == "cleaned"
    assert (cleaned["history"][-1]["by"], cleaned["history"][-1]["reason"]) == (
        "m1",
        "temporary copy deleted",
    )
    assert not export_path(gfal_config, SOURCES[0], plain["source_lfn"]).exists()
    assert export_path(gfal_config, DESTINATION, plain["destination_lfn"]).exists()

    kept = after[bad_copy["_id"]]
    assert kept[CLEANUP] == "cleanup_error"
    assert kept["cleanup_error"].startswith("destination not confirmed (adler32")
    assert kept["cleanup_attempts"] == 1 and kept["cleanup_retry_after"] > now
    assert export_path(gfal_config, SOURCES[0], bad_copy["source_lfn"]).exists()

    assert after[to_publish["_id"]] == to_publish  # the publisher's
    assert export_path(gfal_config, SOURCES[0], to_publish["source_lfn"]).exists()

    agent = accounts["agent"].db(gfal_config.store.files_db)
    for doc in (cleaned, kept):
        assert agent.put(doc).startswith(f"{int(doc['_rev'].split('-')[0]) + 1}-")


class HeldFiles:
    """The simulator's storage, whose deletions wait until released (a slow site)."""

    def __init__(self) -> None:
        self.files = SimFiles()
        self.release = threading.Event()
        self.asked: list[str] = []

    def confirm(self, url: str, size: int, adler32: str) -> str | None:
        return None

    def delete(self, url: str) -> bool:
        self.asked.append(url)
        assert self.release.wait(30)
        return self.files.delete(url)


def test_a_deletion_that_outlasts_the_monitors_wait_is_left_to_the_cleaner(sim_config, accounts):
    """A slow site does not hold the monitor's `done` writes beyond `cleaner.at_done_wait`:
    the file is written `done` with its cleanup pending (the cleaner's), and the site gets no
    more deletions from the monitor while one is still under way there."""
    config = dataclasses.replace(
        sim_config, cleaner=dataclasses.replace(sim_config.cleaner, at_done_wait=0.2)
    )
    first, second = sim_done_requests(config, accounts, 2)
    held = HeldFiles()
    monitor = Monitor(config, "m1", files=held)
    try:
        started = time.monotonic()
        assert monitor.clean_at_done([first], time.time()) == [first]  # not waited for
        assert time.monotonic() - started < 10
        assert monitor.clean_at_done([second], time.time()) == [second]  # the site is busy
        assert held.asked == [f"sim://{first['source']}{first['source_lfn']}"]
        held.release.set()
        deadline = time.monotonic() + 10
        while len(held.files.deleted) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        [after] = monitor.clean_at_done([second], time.time())  # the site is free again
        assert after[CLEANUP] == "cleaned" and after["history"][-1]["by"] == "m1"
    finally:
        monitor.close()
    stored = clean(config, [first])  # the cleaner takes the one left to it
    assert stored[first["_id"]][CLEANUP] == "cleaned"
    assert stored[first["_id"]]["history"][-1]["by"] == "c1"
