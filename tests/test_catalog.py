"""The two catalogs behind aso.catalog.base: the embedded one (a database of the session's real
store) and DBS3 through its official client (dbs3-client, pycurl) against an HTTPS double of
DBS's reader and writer (tests/dbs_double.py) with a throw-away CA and a proxy certificate.

Both back ends run the same contract tests; each then has its own: the request DBS receives, the
error mapping, races between publishers of the embedded store, and `aso catalog ls|blocks`."""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from aso.catalog.base import Block, BlockConflict, Catalog, CatalogError, CatalogFile, block_name
from aso.catalog.dbs import DbsCatalog, DbsSettings
from aso.catalog.embedded import EmbeddedCatalog, block_document
from aso.cli.catalog import catalog_app
from aso.config import Config
from aso.local.pki import Pki
from aso.local.stores import free_port
from aso.provision.designdocs import database_design, init_catalog_db
from aso.store import Server, Settings
from aso.store import admin as store_admin
from tests.conftest import preloaded_cli
from tests.dbs_double import DbsDouble

SITE = "T2_DE_DESY"
_n = itertools.count()


def new_dataset(user: str = "alice") -> str:
    return f"/GenericTTbar/{user}-crab_{uuid.uuid4().hex[:8]}-0123456789abcdef0123456789abcdef/USER"


def new_file(dataset: str, **kw: Any) -> CatalogFile:
    processed = dataset.split("/")[2]
    args: dict[str, Any] = {
        "lfn": f"/store/user/alice/GenericTTbar/{processed}/0000/out_{next(_n)}.root",
        "size": 1000 + next(_n),
        "adler32": "0a1b2c3d",
        "events": 100,
        "lumis": {"1": [1, 2, 3]},
    }
    args.update(kw)
    return CatalogFile(**args)


def new_block(dataset: str, files: list[CatalogFile] | None = None, n: int = 3) -> Block:
    files = files if files is not None else [new_file(dataset) for _ in range(n)]
    name = block_name(dataset, [f.lfn for f in files])
    return Block(name, dataset, "alice", SITE, tuple(files))


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def service_proxy(pki: Pki) -> Path:
    return pki.proxy_file(pki.user("aso-service"))


@pytest.fixture
def dbs(pki: Pki) -> Iterator[DbsDouble]:
    with DbsDouble(pki) as double:
        yield double


def dbs_catalog(dbs: DbsDouble, pki: Pki, proxy: Path, **kw: Any) -> DbsCatalog:
    settings = DbsSettings(
        url=dbs.writer_url, proxy=str(proxy), capath=str(pki.capath), timeout=10.0, **kw
    )
    return DbsCatalog(settings)


@pytest.fixture
def catalog_db(admin: Server) -> Iterator[str]:
    name = f"aso_catalog_{uuid.uuid4().hex[:8]}"
    assert init_catalog_db(admin, name) is True
    yield name
    store_admin.delete_db(admin, name)


@dataclasses.dataclass
class Harness:
    kind: str
    catalog: Catalog
    dbs: DbsDouble | None = None

    def stored(self, block: Block) -> dict[str, CatalogFile]:
        """What the back end keeps of each file of a block (lumis, parents, size, ...)."""
        if isinstance(self.catalog, EmbeddedCatalog):
            details = self.catalog.block_details(block.name)
            assert details is not None
            return {f.lfn: f for f in details}
        assert self.dbs is not None
        out = {}
        for f in block.files:
            rec = self.dbs.files[f.lfn]
            lumis: dict[str, list[int]] = {}
            for run, lumi in self.dbs.file_lumis(f.lfn):
                lumis.setdefault(str(run), []).append(lumi)
            out[f.lfn] = CatalogFile(
                f.lfn,
                rec["file_size"],
                rec["adler32"],
                rec["event_count"],
                lumis,
                tuple(self.dbs.file_parents(f.lfn)),
            )
        return out


@pytest.fixture(params=["embedded", "dbs"])
def harness(request: pytest.FixtureRequest, accounts: dict[str, Server]) -> Iterator[Harness]:
    if request.param == "embedded":
        name = request.getfixturevalue("catalog_db")
        yield Harness("embedded", EmbeddedCatalog(accounts["agent"].db(name)))
        return
    double = request.getfixturevalue("dbs")
    cat = dbs_catalog(
        double, request.getfixturevalue("pki"), request.getfixturevalue("service_proxy")
    )
    yield Harness("dbs", cat, double)
    cat.close()


# --- the contract, both back ends ------------------------------------------------------------


def test_publish_creates_dataset_and_block_once(harness: Harness):
    cat = harness.catalog
    dataset = new_dataset()
    block = new_block(dataset)
    assert cat.dataset_files(dataset) == {}
    assert cat.blocks(dataset) is None  # type: ignore[attr-defined]

    assert cat.publish_block(block) is True
    assert cat.block_files(block.name) == block.lfns()
    assert cat.dataset_files(dataset) == {block.name: block.lfns()}
    [summary] = cat.blocks(dataset)  # type: ignore[attr-defined]
    assert summary["block"] == block.name
    assert summary["files"] == 3
    assert summary["size"] == sum(f.size for f in block.files)
    assert summary["origin_site"] == SITE

    # The same block again (a retry after a crash, a second publisher): nothing new.
    assert cat.publish_block(block) is False
    assert cat.publish_block(dataclasses.replace(block, files=block.files[::-1])) is False
    assert cat.dataset_files(dataset) == {block.name: block.lfns()}
    assert len(cat.blocks(dataset)) == 1  # type: ignore[attr-defined]
    if harness.dbs is not None:
        assert len(harness.dbs.requests_to("POST", "bulkblocks")) == 1
        assert list(harness.dbs.datasets) == [dataset]


def test_second_block_of_a_dataset(harness: Harness):
    cat = harness.catalog
    dataset = new_dataset()
    first, second = new_block(dataset), new_block(dataset, n=2)
    assert cat.publish_block(first) is True
    assert cat.publish_block(second) is True
    assert cat.dataset_files(dataset) == {first.name: first.lfns(), second.name: second.lfns()}
    files = cat.files(dataset)  # type: ignore[attr-defined]
    assert sorted(f["lfn"] for f in files) == sorted(first.lfns() + second.lfns())
    assert {f["block"] for f in files} == {first.name, second.name}
    assert all(f["events"] == 100 and f["adler32"] == "0a1b2c3d" for f in files)


def test_same_name_with_other_files_is_a_conflict(harness: Harness):
    cat = harness.catalog
    dataset = new_dataset()
    block = new_block(dataset)
    assert cat.publish_block(block) is True
    impostor = dataclasses.replace(block, files=(*block.files[:2], new_file(dataset)))
    with pytest.raises(BlockConflict) as caught:
        cat.publish_block(impostor)
    assert caught.value.retryable is False
    assert block.name in str(caught.value)
    assert cat.block_files(block.name) == block.lfns()  # never overwritten
    assert cat.dataset_files(dataset) == {block.name: block.lfns()}


def test_a_file_already_in_another_block_is_a_conflict(harness: Harness):
    cat = harness.catalog
    dataset = new_dataset()
    first = new_block(dataset)
    assert cat.publish_block(first) is True
    shared = first.files[1]
    fresh = new_file(dataset)
    second = new_block(dataset, [fresh, shared])
    with pytest.raises(BlockConflict) as caught:
        cat.publish_block(second)
    message = str(caught.value)
    assert shared.lfn in message and first.name in message and fresh.lfn not in message
    assert cat.block_files(second.name) is None
    assert cat.dataset_files(dataset) == {first.name: first.lfns()}
    # The same file in a block of another dataset is refused too: an LFN is in one block.
    other = new_block(new_dataset("bob"), [shared])
    with pytest.raises(BlockConflict):
        cat.publish_block(other)


def test_parents_lumis_and_metadata_are_kept(harness: Harness):
    cat = harness.catalog
    dataset = new_dataset()
    parents = new_block(dataset, n=2)  # DBS wants parents it knows: publish them first
    assert cat.publish_block(parents) is True
    p1, p2 = parents.lfns()
    child = new_file(
        dataset, events=4242, lumis={"2": [7, 8], "10": [1]}, parents=(p1, p2), size=123456
    )
    lonely = new_file(dataset, lumis={}, parents=(p2,), events=0)  # no lumis at all
    block = new_block(dataset, [lonely, child])
    assert cat.publish_block(block) is True
    stored = harness.stored(block)
    assert sorted(stored[child.lfn].parents) == [p1, p2]
    assert {run: sorted(ls) for run, ls in stored[child.lfn].lumis.items()} == {
        "2": [7, 8],
        "10": [1],
    }
    assert (stored[child.lfn].events, stored[child.lfn].size) == (4242, 123456)
    assert stored[child.lfn].adler32 == "0a1b2c3d"
    assert stored[lonely.lfn].parents == (p2,)
    assert dict(stored[lonely.lfn].lumis) == {}


def test_unknown_block_and_dataset(harness: Harness):
    cat = harness.catalog
    dataset = new_dataset()
    assert cat.block_files(f"{dataset}#{uuid.uuid4()}") is None
    assert cat.dataset_files(dataset) == {}
    assert cat.files(dataset) is None  # type: ignore[attr-defined]


def test_malformed_blocks_are_refused_before_anything_is_written(harness: Harness):
    cat = harness.catalog
    dataset = new_dataset()
    good = new_block(dataset)
    bad = [
        dataclasses.replace(good, files=()),
        dataclasses.replace(good, name="/Other/name-x/USER#abc"),
        dataclasses.replace(good, files=(good.files[0], good.files[0])),
    ]
    for block in bad:
        with pytest.raises(CatalogError) as caught:
            cat.publish_block(block)
        assert caught.value.retryable is False
    if harness.dbs is not None:
        assert harness.dbs.requests == []  # not even a look-up
    assert cat.dataset_files(dataset) == {}


def test_a_cycles_blocks_in_one_call_have_each_its_own_outcome(harness: Harness):
    """publish_blocks (the publisher hands a cycle's blocks over together): each block gets
    what publish_block would have answered it, in order, whatever the others get."""
    cat = harness.catalog
    dataset, other_dataset = new_dataset(), new_dataset("bob")
    old = new_block(dataset)
    assert cat.publish_block(old) is True
    shared = new_file(dataset)
    blocks = [
        new_block(dataset),  # new
        old,  # already there
        dataclasses.replace(
            old, files=(*old.files[:2], new_file(dataset))
        ),  # its name, other files
        new_block(dataset, [new_file(dataset), old.files[0]]),  # a file of another block
        dataclasses.replace(old, files=()),  # malformed
        new_block(other_dataset, [shared]),  # a new dataset, a file...
        new_block(other_dataset, [shared, new_file(other_dataset)]),  # ...that this one has too
        new_block(other_dataset, n=2),
    ]
    outcomes = cat.publish_blocks(blocks)
    assert outcomes[0] is True and outcomes[1] is False and outcomes[5] is True
    assert outcomes[7] is True
    for i in (2, 3, 6):
        assert isinstance(outcomes[i], BlockConflict), (i, outcomes[i])
    assert isinstance(outcomes[3], BlockConflict) and outcomes[3].elsewhere == {
        old.files[0].lfn: old.name
    }
    assert isinstance(outcomes[6], BlockConflict)
    assert outcomes[6].elsewhere == {shared.lfn: blocks[5].name}
    assert isinstance(outcomes[4], CatalogError) and outcomes[4].retryable is False
    assert cat.dataset_files(dataset) == {b.name: b.lfns() for b in (old, blocks[0])}
    assert cat.dataset_files(other_dataset) == {b.name: b.lfns() for b in (blocks[5], blocks[7])}
    assert cat.publish_blocks([]) == []


def test_the_embedded_catalog_takes_a_cycles_blocks_in_a_few_requests(
    accounts: dict[str, Server], catalog_db: str, monkeypatch: pytest.MonkeyPatch
):
    """Four requests for a batch of new blocks (read, datasets, blocks, read again), however
    many; one at a time, each block took three or four (issue 22). The catalog's first
    batch also asks once how many copies the store keeps (EmbeddedCatalog.settle)."""
    cat = _catalog_of(accounts, catalog_db)
    requests: list[Any] = []
    real = cat.db.server.call  # every request of the client goes through it

    def counted(send: Any, *args: Any, **kw: Any) -> Any:
        requests.append(send)
        return real(send, *args, **kw)

    monkeypatch.setattr(cat.db.server, "call", counted)
    for n in (1, 40):
        requests.clear()
        datasets = [new_dataset() for _ in range(n)]
        blocks = [new_block(d) for d in datasets for _ in range(2)]
        assert cat.publish_blocks(blocks) == [True] * len(blocks)
        assert len(requests) == (5 if n == 1 else 4), requests
        assert all(cat.dataset_files(d) for d in datasets)


# --- DBS: what the client sends, and what its failures become ---------------------------------
# --- DBS: what the client sends, and what its failures become ---------------------------------


def test_dbs_request_is_crabs_block_dump(dbs: DbsDouble, pki: Pki, service_proxy: Path):
    cat = dbs_catalog(dbs, pki, service_proxy, acquisition_era="CRAB", processing_version=1)
    dataset = new_dataset()
    parents = new_block(dataset, n=1)
    assert cat.publish_block(parents) is True
    child = new_file(dataset, parents=parents.lfns(), lumis={"1": [5], "3": [1, 2]})
    block = new_block(dataset, [child, new_file(dataset)])
    assert cat.publish_block(block) is True

    # Look-ups on the reader, the insert on the writer, in that order.
    calls = [(r.method, r.server, r.api) for r in dbs.requests[-3:]]
    assert calls == [
        ("GET", "DBSReader", "blocks"),
        ("GET", "DBSReader", "files"),
        ("POST", "DBSWriter", "bulkblocks"),
    ]
    post = dbs.requests_to("POST", "bulkblocks")[-1]
    assert post.status == 200
    assert post.dn == pki.user("aso-service").dn  # the proxy's end entity
    assert post.headers["Content-Type"] == "application/json"
    assert post.headers["UserID"].endswith("@" + post.headers["UserID"].split("@")[1])
    dump = post.body
    assert set(dump) == {
        "dataset_conf_list",
        "file_conf_list",
        "files",
        "processing_era",
        "primds",
        "dataset",
        "acquisition_era",
        "block",
        "file_parent_list",
    }
    _, primary, processed, tier = dataset.split("/")
    config = {
        "release_version": "CMSSW_X",
        "pset_hash": "0123456789abcdef0123456789abcdef",
        "app_name": "cmsRun",
        "output_module_label": "o",
        "global_tag": "None",
    }
    assert dump["dataset_conf_list"] == [config]
    assert sorted(dump["file_conf_list"], key=lambda c: c["lfn"]) == [
        {**config, "lfn": lfn} for lfn in block.lfns()
    ]
    assert dump["primds"] == {"primary_ds_name": primary, "primary_ds_type": "mc"}
    assert dump["dataset"]["dataset"] == dataset
    assert dump["dataset"]["processed_ds_name"] == processed
    assert dump["dataset"]["data_tier_name"] == tier == "USER"
    assert dump["dataset"]["dataset_access_type"] == "VALID"
    assert dump["dataset"]["physics_group_name"] == "CRAB3"
    assert dump["acquisition_era"] == {"acquisition_era_name": "CRAB", "start_date": 0}
    assert dump["processing_era"]["processing_version"] == 1
    assert dump["block"] == {
        "block_name": block.name,
        "origin_site_name": SITE,
        "open_for_writing": 0,
        "file_count": 2,
        "block_size": sum(f.size for f in block.files),
    }
    files = {f["logical_file_name"]: f for f in dump["files"]}
    assert files[child.lfn] == {
        "logical_file_name": child.lfn,
        "file_type": "EDM",
        "check_sum": "NOTSET",
        "adler32": "0a1b2c3d",
        "event_count": 100,
        "file_size": child.size,
        "file_lumi_list": [
            {"lumi_section_num": 5, "run_num": 1},
            {"lumi_section_num": 1, "run_num": 3},
            {"lumi_section_num": 2, "run_num": 3},
        ],
    }
    assert dump["file_parent_list"] == [
        {"logical_file_name": child.lfn, "parent_logical_file_name": parents.lfns()[0]}
    ]


def test_dbs_refusals_are_not_retryable(dbs: DbsDouble, pki: Pki, service_proxy: Path):
    cat = dbs_catalog(dbs, pki, service_proxy)
    dataset = new_dataset()
    # A real refusal: DBS does not know the parent (dbs2go: 400, DBS error 101).
    orphan = new_block(dataset, [new_file(dataset, parents=("/store/user/alice/nowhere.root",))])
    with pytest.raises(CatalogError) as caught:
        cat.publish_block(orphan)
    assert caught.value.retryable is False
    assert "HTTP 400" in str(caught.value) and "unable to find parent lfn" in str(caught.value)
    assert dbs.requests_to("POST", "bulkblocks")[-1].status == 400
    # An injected 400 with DBS's error body.
    block = new_block(dataset)
    dbs.fail_next(400, method="POST", api="bulkblocks")
    with pytest.raises(CatalogError) as caught:
        cat.publish_block(block)
    assert caught.value.retryable is False
    assert "injected failure" in str(caught.value)
    assert dbs.blocks == {}


@pytest.mark.parametrize(
    "failure",
    [
        dict(status=503, api="bulkblocks", method="POST"),  # DBS's own JSON error
        dict(status=502, api="bulkblocks", body="<html><body>Bad Gateway</body></html>"),
        dict(status=503, api="bulkblocks", body="Service Unavailable", content_type="text/plain"),
        dict(status=500, api="blocks", method="GET"),
        dict(status=429, api="files", method="GET"),
    ],
    ids=["503-json", "502-html", "503-text", "500-reader", "429-reader"],
)
def test_dbs_overload_is_retryable(
    dbs: DbsDouble, pki: Pki, service_proxy: Path, failure: dict[str, Any]
):
    cat = dbs_catalog(dbs, pki, service_proxy)
    block = new_block(new_dataset())
    dbs.fail_next(**failure)
    with pytest.raises(CatalogError) as caught:
        cat.publish_block(block)
    assert caught.value.retryable is True
    assert str(failure["status"]) in str(caught.value)
    assert block.name not in dbs.blocks
    assert cat.publish_block(block) is True  # the next attempt goes through
    assert cat.block_files(block.name) == block.lfns()


def test_dbs_unreachable_is_retryable(pki: Pki, service_proxy: Path):
    settings = DbsSettings(
        url=f"https://127.0.0.1:{free_port()}/dbs/int/phys03/DBSWriter",
        proxy=str(service_proxy),
        capath=str(pki.capath),
        timeout=5.0,
    )
    with pytest.raises(CatalogError) as caught:
        DbsCatalog(settings).publish_block(new_block(new_dataset()))
    assert caught.value.retryable is True
    assert "cannot reach DBS" in str(caught.value)


def test_dbs_credentials_problems_are_retryable(dbs: DbsDouble, pki: Pki, tmp_path: Path):
    # No proxy file (expired and removed, renewal late): wait for it.
    missing = dbs_catalog(dbs, pki, tmp_path / "x509up_missing")
    with pytest.raises(CatalogError) as caught:
        missing.publish_block(new_block(new_dataset()))
    assert caught.value.retryable is True and "credentials" in str(caught.value)
    # A proxy from a CA DBS does not trust: the handshake fails, nothing is written.
    stranger = Pki.create(tmp_path / "other")
    untrusted = dbs_catalog(dbs, pki, stranger.proxy_file(stranger.user("mallory")))
    with pytest.raises(CatalogError) as caught:
        untrusted.publish_block(new_block(new_dataset()))
    assert caught.value.retryable is True
    assert dbs.requests == []
    # The server thread counts the refused handshake after the client has given up.
    deadline = time.monotonic() + 5
    while dbs.refused_connections == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dbs.refused_connections >= 1


def test_dbs_insert_refused_because_a_racer_inserted_it(
    dbs: DbsDouble, pki: Pki, service_proxy: Path
):
    cat = dbs_catalog(dbs, pki, service_proxy)
    block = new_block(new_dataset())
    assert cat.publish_block(block) is True
    # A reader that has not seen the block yet: the insert is tried and DBS refuses it (400,
    # block exists); the catalog looks again and finds the same files.
    dbs.fail_next(200, method="GET", api="blocks", body="[]", content_type="application/json")
    assert cat.publish_block(block) is False
    refused = dbs.requests_to("POST", "bulkblocks")[-1]
    assert refused.status == 400
    assert len(dbs.blocks) == 1
    # The same with a block sharing a file: DBS refuses it on its unique LFN; a conflict.
    other = new_block(block.dataset, [block.files[0], new_file(block.dataset)])
    dbs.fail_next(200, method="GET", api="files", body="[]", content_type="application/json")
    with pytest.raises(BlockConflict) as caught:
        cat.publish_block(other)
    assert block.files[0].lfn in str(caught.value)
    assert dbs.requests_to("POST", "bulkblocks")[-1].status == 400
    assert set(dbs.blocks) == {block.name}


def test_dbs_reader_url_and_settings_from_config(dbs: DbsDouble, pki: Pki, service_proxy: Path):
    config = Config(source=pki.root / "aso.toml")
    config.dbs = SimpleNamespace(  # type: ignore[attr-defined]
        url=dbs.writer_url,
        reader_url="",
        proxy=str(service_proxy),
        capath=str(pki.capath),
        acquisition_era="ASOTEST",
        processing_version=3,
        global_tag="GT_X",
        release_version="CMSSW_14_0_0",
    )
    cat = DbsCatalog.from_config(config)
    assert cat.settings.reader == dbs.reader_url
    block = new_block(new_dataset())
    assert cat.publish_block(block) is True
    dump = dbs.bulk_dumps[-1]
    assert dump["acquisition_era"]["acquisition_era_name"] == "ASOTEST"
    assert dump["processing_era"]["processing_version"] == 3
    assert dump["dataset_conf_list"][0]["global_tag"] == "GT_X"
    assert dump["dataset_conf_list"][0]["release_version"] == "CMSSW_14_0_0"
    with pytest.raises(CatalogError):
        DbsCatalog.from_config(Config())  # no [dbs] section


# --- embedded: races, rights, the store going away -------------------------------------------


def _race(n: int, work: Any) -> list[Any]:
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except CatalogError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def _catalog_of(accounts: dict[str, Server], name: str) -> EmbeddedCatalog:
    # A server (connection pool) per publisher, as separate processes would have.
    agent = accounts["agent"]
    server = Server(agent.url, agent.user, agent._password, Settings(retries=1, backoff=0.1))
    return EmbeddedCatalog(server.db(name))


def test_embedded_two_publishers_of_one_block_insert_it_once(
    accounts: dict[str, Server], catalog_db: str
):
    dataset = new_dataset()
    for _ in range(3):
        block = new_block(dataset, n=5)
        catalogs = [_catalog_of(accounts, catalog_db) for _ in range(2)]
        results = _race(2, lambda i, b=block, c=catalogs: c[i].publish_block(b))
        assert sorted(results) == [False, True], results
    cat = catalogs[0]
    assert len(cat.blocks(dataset)) == 3
    rows = cat.db.view("catalog", "files").rows
    assert len(rows) == len({r["key"] for r in rows}) == 15  # every file once


@pytest.mark.parametrize("together", [False, True], ids=["one", "with-others"])
def test_embedded_overlapping_blocks_at_once_never_share_a_file(
    accounts: dict[str, Server], catalog_db: str, together: bool
):
    dataset = new_dataset()

    def publish(catalog: EmbeddedCatalog, block: Block) -> bool:
        if not together:
            return catalog.publish_block(block)
        # In a cycle's batch beside a block of its own (publish_blocks' checks, not the
        # one-block path's).
        outcome, beside = catalog.publish_blocks([block, new_block(dataset)])
        assert beside is True
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    for _ in range(4):
        shared = new_file(dataset)
        blocks = [new_block(dataset, [shared, new_file(dataset)]) for _ in range(3)]
        catalogs = [_catalog_of(accounts, catalog_db) for _ in blocks]
        results = _race(3, lambda i, b=blocks, c=catalogs: publish(c[i], b[i]))
        winners = [b for b, r in zip(blocks, results, strict=True) if r is True]
        assert len(winners) <= 1, results
        for r in results:
            assert r is True or isinstance(r, CatalogError), r
            if isinstance(r, CatalogError) and not isinstance(r, BlockConflict):
                assert r.retryable  # stepped back after a race: try again later
        holders = catalogs[0].db.view("catalog", "files", key=shared.lfn).rows
        assert len(holders) == len(winners)
    # Whatever stepped back can be published by trying again: one block per shared file.
    published = catalogs[0].dataset_files(dataset)
    lfns = [lfn for files in published.values() for lfn in files]
    assert len(lfns) == len(set(lfns))


def test_embedded_a_block_that_may_be_withdrawn_is_not_relied_on(
    accounts: dict[str, Server], catalog_db: str, monkeypatch: pytest.MonkeyPatch
):
    """A publisher records a block's files published in a block another one wrote ("already
    published", or held elsewhere) only when that block stays: not while another block shares
    a file with it (published at the same moment: its writer withdraws one of them), nor when
    the `files` view names a block that is gone (a cluster's view reads one copy, which may
    still show a block withdrawn since). Else files were recorded published in no block."""
    dataset = new_dataset()
    writer, catalog = _catalog_of(accounts, catalog_db), _catalog_of(accounts, catalog_db)
    shared, alone = new_file(dataset), new_file(dataset)
    racing = new_block(dataset, [shared, alone])
    other = new_block(dataset, [shared, new_file(dataset)])
    # Two publishers' blocks sharing a file, both written, neither after-check done yet.
    assert writer.publish_blocks([]) == []
    writer._ensure_datasets([racing])
    for block in (racing, other):
        [result] = writer.db.bulk_write([block_document(block, time.time())])
        assert result.ok, result
    # The same block again: there, with these files, but about to be withdrawn.
    again = catalog.publish_blocks([racing])[0]
    assert isinstance(again, CatalogError) and not isinstance(again, BlockConflict), again
    assert again.retryable
    # A block holding a file the other two hold: neither can be relied on yet.
    third = catalog.publish_blocks([new_block(dataset, [shared, new_file(dataset)])])[0]
    assert isinstance(third, CatalogError) and not isinstance(third, BlockConflict), third
    assert third.retryable
    # Settled (the racing block withdrawn): the other block is relied on.
    writer.db.bulk_write([{"_id": racing.name, "_rev": writer.db.get(racing.name)["_rev"],
                           "_deleted": True}])  # fmt: skip
    settled = catalog.publish_blocks([new_block(dataset, [shared, new_file(dataset)])])[0]
    assert isinstance(settled, BlockConflict) and settled.elsewhere == {shared.lfn: other.name}
    # Written by another publisher between this one's look and its write, beside a block
    # sharing a file with it: there with these files, but about to be withdrawn.
    late, beside = new_block(dataset), new_block(dataset)
    beside = new_block(dataset, [late.files[0], *beside.files])
    ensure = catalog._ensure_datasets

    def meanwhile(blocks: Any) -> Any:
        for block in (late, beside):
            writer.db.bulk_write([block_document(block, time.time())])
        return ensure(blocks)

    monkeypatch.setattr(catalog, "_ensure_datasets", meanwhile)
    found = catalog.publish_blocks([late])[0]
    assert isinstance(found, CatalogError) and not isinstance(found, BlockConflict), found
    assert found.retryable
    monkeypatch.setattr(catalog, "_ensure_datasets", ensure)
    # A view that still shows the withdrawn block (a copy behind): not relied on.
    view = catalog.db.view

    def behind(ddoc: str, name: str, **kw: Any) -> Any:
        rows = view(ddoc, name, **kw)
        if name == "files":
            rows.rows.append({"key": alone.lfn, "value": {"block": racing.name}})
        return rows

    monkeypatch.setattr(catalog.db, "view", behind)
    stale = catalog.publish_blocks([new_block(dataset, [alone, new_file(dataset)])])[0]
    assert isinstance(stale, CatalogError) and not isinstance(stale, BlockConflict), stale
    assert stale.retryable


def test_embedded_a_holder_sharing_another_of_its_files_is_not_relied_on(
    accounts: dict[str, Server], catalog_db: str
):
    """A file held by one block only, which shares another of its files with a third block
    (two publishers' blocks written at the same moment): that holder is about to be withdrawn
    by its writer, so the file is not recorded published in it (a 3-node run left such a file
    in no block)."""
    dataset = new_dataset()
    writer, catalog = _catalog_of(accounts, catalog_db), _catalog_of(accounts, catalog_db)
    shared, alone = new_file(dataset), new_file(dataset)
    racing = new_block(dataset, [shared, alone])
    other = new_block(dataset, [shared, new_file(dataset)])
    writer._ensure_datasets([racing])
    for block in (racing, other):
        [result] = writer.db.bulk_write([block_document(block, time.time() - 60)])
        assert result.ok, result
    found = catalog.publish_blocks([new_block(dataset, [alone, new_file(dataset)])])[0]
    assert isinstance(found, CatalogError) and not isinstance(found, BlockConflict), found
    assert found.retryable


def test_embedded_a_young_block_is_not_relied_on_on_a_cluster(
    accounts: dict[str, Server], catalog_db: str
):
    """On a cluster, another publisher's block younger than its writer's check after the
    write (whose view may see a block sharing a file with it that this one's missed) is not
    relied on: its files wait; once older, they are recorded published in it."""
    dataset = new_dataset()
    clock = [time.time()]
    writer, catalog = _catalog_of(accounts, catalog_db), _catalog_of(accounts, catalog_db)
    catalog._clock = lambda: clock[0]
    catalog._copies = 3
    held = new_block(dataset)
    writer._ensure_datasets([held])
    [result] = writer.db.bulk_write([block_document(held, clock[0])])
    assert result.ok, result
    mine = new_block(dataset, [held.files[0], new_file(dataset)])
    for block in (mine, held):  # held elsewhere, and "already published"
        young = catalog.publish_blocks([block])[0]
        assert isinstance(young, CatalogError) and not isinstance(young, BlockConflict), young
        assert young.retryable
    clock[0] += 10
    conflict, again = catalog.publish_blocks([mine])[0], catalog.publish_blocks([held])[0]
    assert isinstance(conflict, BlockConflict), conflict
    assert conflict.elsewhere == {held.files[0].lfn: held.name}
    assert again is False


def test_embedded_blocks_sharing_a_file_unseen_by_both_checks_are_settled(
    accounts: dict[str, Server], catalog_db: str
):
    """Two publishers' blocks sharing a file, both past their checks (on a cluster each view
    read a copy without the other's block): looked at again by either publisher, the later
    block by name is withdrawn once its other files are in a block of their own; no file is
    then in two blocks, none in none. The other publisher, looking too, changes nothing
    more. A block young enough to be withdrawn still by its writer is left for later."""
    dataset = new_dataset()
    clock = [time.time()]
    first, second = (_catalog_of(accounts, catalog_db) for _ in range(2))
    for catalog in (first, second):
        catalog._clock = lambda: clock[0]
    shared = new_file(dataset)
    blocks = [new_block(dataset, [shared, new_file(dataset), new_file(dataset)]) for _ in "ab"]
    first._ensure_datasets(blocks)
    for catalog, block in zip((first, second), blocks, strict=True):
        [result] = catalog.db.bulk_write([block_document(block, clock[0])])
        assert result.ok, result
        catalog._copies = 3  # as on a cluster (a single node's checks cannot miss a block)
        catalog._to_look_at(block.name, block.lfns())
    assert first.settle() == 0  # too young: its writer may withdraw it
    clock[0] += 10
    kept, later = sorted(blocks, key=lambda b: b.name)
    assert first.settle() + second.settle() == 1
    held = first.dataset_files(dataset)
    assert kept.name in held and later.name not in held
    lfns = [lfn for files in held.values() for lfn in files]
    assert sorted(lfns) == sorted({*kept.lfns(), *later.lfns()})  # each file once
    clock[0] += 25  # the next look
    assert first.settle() + second.settle() == 0


def test_embedded_rights(accounts: dict[str, Server], catalog_db: str, admin: Server):
    dataset = new_dataset()
    block = new_block(dataset)
    as_user = EmbeddedCatalog(accounts["alice"].db(catalog_db))
    with pytest.raises(CatalogError) as caught:
        as_user.publish_block(block)
    assert caught.value.retryable is False and "403" in str(caught.value)
    assert EmbeddedCatalog(accounts["agent"].db(catalog_db)).publish_block(block) is True
    assert as_user.block_files(block.name) == block.lfns()  # users read
    stranger = EmbeddedCatalog(accounts["stranger"].db(catalog_db))
    with pytest.raises(CatalogError):
        stranger.block_files(block.name)
    # Published blocks do not change, not even by an agent writing the document directly.
    db = accounts["agent"].db(catalog_db)
    doc = db.get(block.name)
    assert doc is not None
    doc["files"] = doc["files"][:1]
    with pytest.raises(Exception, match="immutable"):
        db.put(doc)
    # init is idempotent: the database and its design document stay as they are.
    assert init_catalog_db(admin, catalog_db) is False
    assert (
        admin.db(catalog_db).get(database_design("catalog")["_id"])["validate_doc_update"]
        == database_design("catalog")["validate_doc_update"]
    )


def test_embedded_store_away_is_retryable(catalog_db: str):
    server = Server(f"http://127.0.0.1:{free_port()}", settings=Settings(retries=0))
    with pytest.raises(CatalogError) as caught:
        EmbeddedCatalog(server.db(catalog_db)).publish_block(new_block(new_dataset()))
    assert caught.value.retryable is True


# --- aso catalog ls|blocks -------------------------------------------------------------------


def cli(config: Config) -> typer.Typer:
    """`aso` with the catalog sub-app, as aso/cli/__init__.py mounts it, on a preloaded config."""
    return preloaded_cli(config, typers={"catalog": catalog_app})


@pytest.fixture
def cli_config(store_config: Config, catalog_db: str) -> Config:
    return dataclasses.replace(
        store_config, store=dataclasses.replace(store_config.store, catalog_db=catalog_db)
    )


def test_cli_blocks_and_ls(cli_config: Config, accounts: dict[str, Server], catalog_db: str):
    cat = EmbeddedCatalog(accounts["agent"].db(catalog_db))
    dataset = new_dataset()
    first, second = new_block(dataset, n=3), new_block(dataset, n=2)
    assert cat.publish_block(first) and cat.publish_block(second)
    runner = CliRunner()
    app = cli(cli_config)
    env = {"COLUMNS": "250"}

    result = runner.invoke(app, ["catalog", "blocks", dataset], env=env)
    assert result.exit_code == 0, result.output
    assert first.name in result.stdout and second.name in result.stdout
    assert "2 block(s), 5 file(s)" in result.stdout

    result = runner.invoke(app, ["catalog", "blocks", dataset, "--json"], env=env)
    assert result.exit_code == 0, result.output
    blocks = json.loads(result.stdout)
    assert [b["block"] for b in blocks] == [first.name, second.name]
    assert [b["files"] for b in blocks] == [3, 2]
    assert blocks[0]["size"] == sum(f.size for f in first.files)
    assert blocks[0]["origin_site"] == SITE

    result = runner.invoke(app, ["catalog", "ls", dataset], env=env)
    assert result.exit_code == 0, result.output
    assert all(lfn in result.stdout for lfn in first.lfns() + second.lfns())
    assert "#" + first.name.split("#")[1] in result.stdout
    assert "5 file(s) in 2 block(s)" in result.stdout

    result = runner.invoke(app, ["catalog", "ls", dataset, "--json"], env=env)
    files = json.loads(result.stdout)
    assert sorted(f["lfn"] for f in files) == sorted(first.lfns() + second.lfns())
    assert {f["block"] for f in files if f["lfn"] in first.lfns()} == {first.name}


def test_cli_unknown_dataset_is_not_an_error(cli_config: Config):
    runner = CliRunner()
    app = cli(cli_config)
    unknown = new_dataset("nobody")
    for command in ("ls", "blocks"):
        result = runner.invoke(app, ["catalog", command, unknown])
        assert result.exit_code == 0, result.output
        assert f"dataset {unknown} is not in the embedded catalog" in result.stderr
        assert result.stdout.strip() == ""
        result = runner.invoke(app, ["catalog", command, unknown, "--json"])
        assert result.exit_code == 0
        assert json.loads(result.stdout) == []


def test_cli_catalog_failure_is_one_line(cli_config: Config, pki: Pki, tmp_path: Path):
    config = dataclasses.replace(
        cli_config,
        publisher=dataclasses.replace(cli_config.publisher, catalog="dbs"),
        dbs=dataclasses.replace(
            cli_config.dbs,
            url=f"https://127.0.0.1:{free_port()}/dbs/int/phys03/DBSWriter",
            proxy=str(pki.proxy_file(pki.user("aso-service"), tag="-cli")),
            capath=str(pki.capath),
        ),
    )
    result = CliRunner().invoke(cli(config), ["catalog", "blocks", new_dataset()])
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("aso: error: DBS"), result.stderr
    assert "Traceback" not in result.output


def test_cli_on_dbs(cli_config: Config, dbs: DbsDouble, pki: Pki, service_proxy: Path):
    config = dataclasses.replace(
        cli_config,
        publisher=dataclasses.replace(cli_config.publisher, catalog="dbs"),
        dbs=dataclasses.replace(
            cli_config.dbs, url=dbs.writer_url, proxy=str(service_proxy), capath=str(pki.capath)
        ),
    )
    dataset = new_dataset()
    block = new_block(dataset)
    assert DbsCatalog.from_config(config).publish_block(block) is True
    runner = CliRunner()
    result = runner.invoke(cli(config), ["catalog", "blocks", dataset, "--json"])
    assert result.exit_code == 0, result.output
    [listed] = json.loads(result.stdout)
    assert (listed["block"], listed["files"], listed["origin_site"]) == (block.name, 3, SITE)
    result = runner.invoke(cli(config), ["catalog", "ls", dataset, "--json"])
    assert sorted(f["lfn"] for f in json.loads(result.stdout)) == block.lfns()
    # DBS failing: one line on stderr, nothing on stdout (the client's own print is kept out).
    dbs.fail_next(500, method="GET", api="datasets")
    result = runner.invoke(cli(config), ["catalog", "ls", dataset])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("aso: error: DBS") and "HTTP 500" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
