"""A file's whole life on real parts, with failures injected: 300 files through the submitter,
monitor, gfal worker, retry manager, cleaner and publisher over real XRootD storage and the
embedded catalog. Missing sources and bad checksums end `failed` with the right reason; a
destination server stopped for a while is ridden out; every other file ends done, cleaned and
published. Checked from the documents, the storage (the temp areas hold exactly the files that
were not transferred) and the catalog (exactly the published files, in blocks of the right
size)."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from aso.agents.cleaner import Cleaner
from aso.agents.gfal_worker import GfalWorker
from aso.agents.hold_checker import HoldChecker
from aso.agents.monitor import Monitor
from aso.agents.publisher import Publisher
from aso.agents.retry_manager import RetryManager
from aso.agents.submitter import Submitter
from aso.catalog.embedded import EmbeddedCatalog
from aso.local.xrootd import export_path, write_file
from aso.model import CLEANUP, PUBLICATION, STATE
from aso.monitoring.queries import all_holds
from aso.provision.designdocs import init_catalog_db
from aso.runtime import Runner
from aso.store import admin as store_admin
from aso.upload import judged_request
from tests.conftest import DESTINATION, SOURCES
from tests.pipeline_helpers import run_until

USERS = ("alice", "bob")
BLOCK = 40


@pytest.fixture()
def life_config(gfal_config, admin):
    name = f"catalog_{gfal_config.store.files_db}"
    init_catalog_db(admin, name)
    config = dataclasses.replace(
        gfal_config,
        store=dataclasses.replace(gfal_config.store, catalog_db=name),
        publisher=dataclasses.replace(gfal_config.publisher, max_files_per_block=BLOCK),
        retry=dataclasses.replace(gfal_config.retry, base_delay=0.5, jitter=0.0, max_attempts=6),
        cleaner=dataclasses.replace(gfal_config.cleaner, base_delay=0.5),
        gfal=dataclasses.replace(gfal_config.gfal, retries=1, retry_delay=0.3),
        # The outage may trip the destination's breaker: its hold is looked at soon.
        holds=dataclasses.replace(
            gfal_config.holds, first_check=1.0, max_check_interval=2.0, interval=0.5
        ),
    )
    yield config
    store_admin.delete_db(admin, name)


def dataset(user: str, token: str) -> str:
    return f"/Life/{user}-crab_life_{token}/USER"


def upload_life(config, accounts, n: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """n files per user; some with no source file, some with a wrong checksum."""
    rng = random.Random(7)
    token = uuid.uuid4().hex[:8]
    docs, fate = [], {}
    for user in USERS:
        batch = []
        for i in range(n):
            source = SOURCES[i % 2]
            lfn = f"/store/temp/user/{user}.x/life/{token}/out_{i}.root"
            size = rng.randint(1, 256 << 10)
            kind = "missing" if i % 50 == 7 else "bad_checksum" if i % 50 == 23 else "good"
            adler32 = "0a1b2c3d"
            if kind != "missing":
                adler32 = write_file(config, source, lfn, size).adler32
            if kind == "bad_checksum":
                adler32 = "deadbeef" if adler32 != "deadbeef" else "beefdead"
            doc = judged_request(
                user=user,
                task=f"261121_200000:{user}_life_{token}",
                job_id=str(i),
                source=source,
                destination=DESTINATION,
                source_lfn=lfn,
                destination_lfn=f"/store/user/{user}/life/{token}/out_{i}.root",
                size=size,
                adler32=adler32,
                publish=True,
                publish_info={"dataset": dataset(user, token), "events": i},
            )
            fate[doc["_id"]] = kind
            batch.append(doc)
        assert all(r.ok for r in accounts[user].db(config.store.files_db).bulk_write(batch))
        docs += batch
    return docs, fate


def all_agents(config) -> list[Runner]:
    return [
        Runner(agent)
        for agent in (
            Submitter(config, "s1"),
            Monitor(config, "m1"),
            GfalWorker(config, "w1"),
            RetryManager(config, "r1"),
            Cleaner(config, "c1"),
            Publisher(config, "p1"),
            HoldChecker(config, "h1"),
        )
    ]


def where_files_are(db, ids: list[str]) -> Counter:
    """Files per (state, cleanup, publication, hold of the last attempt): where a run stopped."""
    return Counter(
        (d[STATE], d[CLEANUP], d[PUBLICATION], (d.get("attempts") or [{}])[-1].get("held"))
        for d in db.get_many(ids).values()
    )


def settled(doc: dict[str, Any]) -> bool:
    return doc[STATE] == "failed" or (
        doc[STATE] == "done" and doc[CLEANUP] == "cleaned" and doc[PUBLICATION] == "published"
    )


def test_three_hundred_files_end_where_they_should(life_config, accounts, admin, watchdog):
    docs, fate = upload_life(life_config, accounts, 150)
    ids = [d["_id"] for d in docs]
    db = admin.db(life_config.store.files_db)
    runners = all_agents(life_config)
    outage = {"done": False}

    def destination_outage() -> None:
        """The destination's server stops for a while once copies are under way."""
        while len([d for d in db.get_many(ids).values() if d[STATE] == "done"]) < 30:
            time.sleep(0.2)
        with watchdog.paused():
            [site] = [s for s in watchdog.storage.status() if s.site == DESTINATION]
            os.kill(site.pid, signal.SIGKILL)
            time.sleep(3)
            watchdog.storage.start()
        outage["done"] = True

    thread = threading.Thread(target=destination_outage, daemon=True)
    thread.start()
    try:
        run_until(
            lambda: outage["done"] and all(settled(d) for d in db.get_many(ids).values()),
            runners,
            timeout=240,
            describe=lambda: where_files_are(db, ids),
        )
    finally:
        for runner in runners:
            runner.agent.close()
    stored = db.get_many(ids)

    # The documents: each file in the right final state, with the right reason.
    outcome = Counter((fate[i], d[STATE]) for i, d in stored.items())
    unexpected = [
        (d["source_lfn"], d[STATE], d.get("failure_reason"))
        for i, d in stored.items()
        if fate[i] == "good" and d[STATE] != "done"
    ]
    assert outcome == {
        ("good", "done"): 288,
        ("missing", "failed"): 6,
        ("bad_checksum", "failed"): 6,
    }, unexpected
    for doc_id, doc in stored.items():
        if fate[doc_id] == "missing":
            assert doc["failure_reason"].startswith("permanent error (source_missing)")
        elif fate[doc_id] == "bad_checksum":
            assert doc["failure_reason"] == "checksum mismatch in 2 attempts"
        else:
            assert (doc[CLEANUP], doc[PUBLICATION]) == ("cleaned", "published")

    # A hold the outage started (the destination's breaker) was released by a look, not
    # left standing or failed.
    assert all(h["state"] == "released" for h in all_holds(db)), all_holds(db)

    # The storage: the temp areas hold exactly the files that were not transferred.
    for doc_id, doc in stored.items():
        temp = export_path(life_config, doc["source"], doc["source_lfn"]).exists()
        copied = export_path(life_config, DESTINATION, doc["destination_lfn"]).exists()
        assert temp == (fate[doc_id] == "bad_checksum"), (fate[doc_id], doc["source_lfn"])
        assert copied == (fate[doc_id] == "good")

    # The catalog: exactly the published files, in blocks of BLOCK (the last one of a task
    # closes with what is left when the task is over).
    catalog = EmbeddedCatalog(admin.db(life_config.store.catalog_db))
    for user in USERS:
        mine = [d for d in stored.values() if d["user"] == user]
        blocks = catalog.dataset_files(mine[0]["publish_info"]["dataset"])
        published = sorted(d["destination_lfn"] for d in mine if d[STATE] == "done")
        assert sorted(lfn for lfns in blocks.values() for lfn in lfns) == published
        sizes = sorted(len(lfns) for lfns in blocks.values())
        full, rest = divmod(len(published), BLOCK)
        assert sizes == ([rest] if rest else []) + [BLOCK] * full
