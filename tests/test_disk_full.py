"""A full disk under the real store: uploads fail with a retryable error and write nothing of
the refused call; once there is room again (and the store has been restarted: pouchdb-server's
LevelDB keeps refusing writes after an ENOSPC until then, and a CouchDB node stops itself when
its database files cannot be written), the same upload succeeds, and the uploads that had
succeeded report their files as already recorded (on CouchDB, whose `_bulk_docs` is not all or
nothing, the refused call's files that were written too).

The store's data directory is a small tmpfs mounted for the test (root, as `make test` runs
here); where mounting is not allowed the test says so and is skipped."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from aso.provision.designdocs import init_databases
from aso.store import Server, StoreError
from aso.upload import judged_request, upload
from tests.conftest import ENGINE, own_store
from tests.storage_helpers import tmpfs


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    with tmpfs(mount, "size=6m"):
        yield mount


def batch(token: str, k: int) -> list[dict]:
    return [
        judged_request(
            user="alice",
            task="261122_080000:alice_full",
            job_id=str(k * 100 + i),
            source="T2_CH_CERN",
            destination="T2_DE_DESY",
            source_lfn=f"/store/temp/user/alice/{token}/{k}_{i}.root",
            destination_lfn=f"/store/user/alice/{token}/{k}_{i}.root",
            size=1,
            adler32="00000001",
        )
        for i in range(100)
    ]


def test_a_full_disk_is_a_retryable_error_that_writes_nothing(small_disk: Path):
    with own_store(small_disk) as (config, store):
        admin = Server.from_config(config, account="admin")
        init_databases(admin, config)
        db = admin.db(config.store.files_db)
        token = uuid.uuid4().hex[:8]
        uploaded: list[list[dict]] = []
        refused: StoreError | None = None
        for k in range(1000):  # about 90 batches fill 6 MB
            docs = batch(token, k)
            try:
                report = upload(db, docs)
            except StoreError as exc:
                refused = exc
                break
            assert report.ok and len(report.recorded) == 100
            uploaded.append(docs)
        assert refused is not None, "the disk never filled"
        assert refused.retryable
        if ENGINE == "pouchdb":
            assert refused.status == 500 and "No space left on device" in str(refused)
            # Nothing of the refused call was written: all or nothing, no half-written batch.
            assert not any(db.get_many(d["_id"] for d in docs).values())
            assert store.status().answering  # the store itself lives on, and reads work
            assert db.get(uploaded[-1][-1]["_id"]) is not None
        else:
            # CouchDB answers 500 (enospc) until its database processes have crashed often
            # enough that the node stops: the client sees a store that went away.
            assert refused.status in (0, 500), refused

        subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
        store.stop()
        store.start()
        assert db.get(uploaded[-1][-1]["_id"]) is not None
        again = upload(db, docs)
        if ENGINE == "pouchdb":
            assert len(again.recorded) == 100 and not again.refused
        else:
            # CouchDB's _bulk_docs is not all or nothing (one shard may have written its part
            # before the disk filled): the retried upload finds those already recorded.
            assert len(again.recorded) + len(again.already) == 100 and not again.refused
        replayed = upload(db, uploaded[-1])  # a wrapper that retried a call that had worked
        assert len(replayed.already) == 100 and not replayed.recorded
