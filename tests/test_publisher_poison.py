"""One user's publication cannot fail or delay another's (issue 33, the red team's publisher
poison: alice's 100 files of ~230 KB of parents each made a 23 MB catalog block; CouchDB
refused the publisher's whole catalog write with 413 and bob's files of the same call went
`publication_failed` naming alice's block).

Three layers, each tested here on both stores: the schema bounds what an owner writes in
`publish_info` (tests/test_validation.py has the rules); the publisher closes a block by size
as well as by files; a catalog write or call that fails as a whole is made again block by
block, each block with its own outcome. The store that refuses large documents is CouchDB's
`max_document_size` played on both stores (`SmallDocuments`, whose limit is below the
catalog's own bound, so that an unsplit block reaches the store)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from aso import model
from aso.agents.publisher import Publisher
from aso.catalog.base import CatalogError
from aso.catalog.embedded import MAX_BLOCK_CHARS, EmbeddedCatalog, block_chars
from aso.core import publication
from aso.core.publication import close_blocks, entry_chars, make_block
from aso.model import PUBLICATION
from aso.runtime import Runner
from aso.store import Database, Forbidden, StoreError
from tests.conftest import db_as, sample_request

STORE_LIMIT = 3_000_000  # SmallDocuments' max_document_size, as JSON characters


class SmallDocuments(Database):
    """A database whose store refuses a `_bulk_docs` holding a document over STORE_LIMIT
    whole, with 413 document_too_large, as CouchDB does past its max_document_size."""

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        if getattr(fn, "__name__", "") == "post_bulk_docs":
            for doc in kwargs["bulk_docs"]["docs"]:
                if len(json.dumps(doc)) > STORE_LIMIT:
                    raise StoreError(413, "document_too_large", doc["_id"])
        return super()._call(fn, **kwargs)


def parents(n: int, chars: int) -> list[str]:
    stem = "/store/mc/RunIII/Prim/AODSIM/"
    return [stem + f"{i:04d}".rjust(chars - len(stem) - 5, "p") + ".root" for i in range(n)]


def largest_info(dataset: str) -> dict[str, Any]:
    """A publish_info as large as the schema lets an owner write (just under its bound)."""
    info: dict[str, Any] = {"dataset": dataset, "events": 1, "parents": parents(100, 490)}
    info["lumis"] = {"1": list(range(100_000, 100_000 + 1_900))}
    assert (
        0.9 * model.MAX_PUBLISH_INFO_CHARS < model.doc_chars(info) <= model.MAX_PUBLISH_INFO_CHARS
    )
    return info


def recorded(
    config, accounts, user: str, n: int, task: str, info: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """`n` files of `user`, created done (already at their destination), to publish."""
    docs = [
        sample_request(
            user, task=task, publish=True, publish_info=dict(info), already_at_destination=True
        )
        for _ in range(n)
    ]
    results = db_as(accounts, user, config.store.files_db).bulk_write(docs)
    assert all(r.ok for r in results), [r for r in results if not r.ok][:1]
    return docs


def publications(config, accounts, docs) -> Counter[str]:
    db = accounts["agent"].db(config.store.files_db)
    return Counter(d[PUBLICATION] for d in db.get_many(d["_id"] for d in docs).values())


def one_cycle(config, catalog: EmbeddedCatalog) -> None:
    runner = Runner(Publisher(config, "p1", catalog=catalog))
    runner.workset.start()
    runner.step(wait=False)


@pytest.fixture()
def big_blocks(pub_config):
    """pub_config with blocks of up to 100 files, as in production."""
    return dataclasses.replace(
        pub_config, publisher=dataclasses.replace(pub_config.publisher, max_files_per_block=100)
    )


def small_catalog(config, accounts) -> EmbeddedCatalog:
    return EmbeddedCatalog(SmallDocuments(accounts["agent"], config.store.catalog_db))


def test_the_red_team_s_publish_info_is_refused_at_upload(big_blocks, accounts):
    """~230 KB of parents (235 LFNs of ~950 characters) is no file's publish_info."""
    doc = sample_request("alice", publish=True, already_at_destination=True,
                         publish_info={"dataset": "/Prim/alice-pois-v1/USER"})  # fmt: skip
    doc["publish_info"]["parents"] = parents(235, 950)
    with pytest.raises(Forbidden, match=r"^403 forbidden: \[schema\] doc\.publish_info"):
        db_as(accounts, "alice", big_blocks.store.files_db).create(doc)


@pytest.mark.parametrize("split", [True, False], ids=["closed-by-size", "refused-by-the-store"])
def test_an_owner_s_oversized_publication_cannot_fail_or_delay_another_s(
    big_blocks, accounts, admin, monkeypatch, split
):
    """alice records 55 files at publish_info's bound (a ~4 MB block unsplit), bob 3 tasks of
    files, all ready in one cycle. Closed by size, alice's blocks each fit the store and every
    file publishes; unsplit (as before issue 33), the store refuses alice's block and the
    catalog's write of the call whole: it is made again block by block, so alice's block
    fails alone. Either way bob's files are all published in that first cycle."""
    config = big_blocks
    alice = recorded(config, accounts, "alice", 55, "261121_190000:alice_pois",
                     largest_info("/Prim/alice-pois-v1/USER"))  # fmt: skip
    bob = [
        doc
        for t in range(3)
        for doc in recorded(config, accounts, "bob", 5, f"261121_190000:bob_t{t}",
                            {"dataset": f"/Prim/bob-t{t}-v1/USER", "parents": parents(3, 150)})
    ]  # fmt: skip
    unsplit = make_block(alice)
    assert STORE_LIMIT < block_chars(unsplit) < MAX_BLOCK_CHARS  # the store, not ASO, refuses
    if not split:
        monkeypatch.setattr(publication, "entry_chars", lambda doc: 0)
    one_cycle(config, small_catalog(config, accounts))
    assert publications(config, accounts, bob) == {"published": len(bob)}
    catalog = EmbeddedCatalog(admin.db(config.store.catalog_db))
    held = catalog.dataset_files("/Prim/alice-pois-v1/USER")
    if split:
        assert publications(config, accounts, alice) == {"published": 55}
        assert len(held) >= 2 and sum(len(lfns) for lfns in held.values()) == 55
        for name in held:
            stored = admin.db(config.store.catalog_db).get(name)
            assert len(json.dumps(stored)) <= config.publisher.max_block_bytes + 1_000
        return
    assert held == {}
    stored = accounts["agent"].db(config.store.files_db).get_many(d["_id"] for d in alice)
    assert {d[PUBLICATION] for d in stored.values()} == {"publication_failed"}
    reason = next(iter(stored.values()))["publication_error"]
    assert "413" in reason and unsplit.name in reason
    for doc in accounts["agent"].db(config.store.files_db).get_many(d["_id"] for d in bob).values():
        assert unsplit.name not in json.dumps(doc)  # alice's block is named in none of bob's


def test_a_catalog_write_the_store_refuses_whole_is_made_again_block_by_block(pub_config, accounts):
    """The catalog and the store on their own: one bulk write of the three blocks is refused
    (413, alice's block too large); the store's client halves it down to alice's document,
    whose result alone says too large, and the catalog gives each block its own outcome."""
    config = pub_config
    alice = recorded(config, accounts, "alice", 55, "261121_190000:alice_w",
                     largest_info("/Prim/alice-w-v1/USER"))  # fmt: skip
    bob = [recorded(config, accounts, "bob", 2, f"261121_190000:bob_w{t}",
                    {"dataset": f"/Prim/bob-w{t}-v1/USER"}) for t in range(2)]  # fmt: skip
    blocks = [make_block(bob[0]), make_block(alice), make_block(bob[1])]
    outcomes = small_catalog(config, accounts).publish_blocks(blocks)
    assert outcomes[0] is True and outcomes[2] is True
    refused = outcomes[1]
    assert isinstance(refused, CatalogError) and not refused.retryable
    assert "413 document_too_large" in str(refused) and blocks[0].name not in str(refused)
    # The store's client alone: a too large document is its own result, the others written.
    db = SmallDocuments(accounts["agent"], config.store.catalog_db)
    big = {"_id": "big", "type": "dataset", "dataset": "/P/x/USER", "pad": "x" * STORE_LIMIT}
    results = db.bulk_write([{"_id": "a", "type": "x"}, big])
    assert results[1].error == "document_too_large" and results[1].as_error().status == 413


class OneBlockBreaksTheCall(EmbeddedCatalog):
    """A catalog client whose call fails as a whole when one (named) block is in it."""

    poison = ""

    def publish_blocks(self, blocks):
        if any(b.name == self.poison for b in blocks):
            raise RuntimeError(f"the call failed on {self.poison}")
        return super().publish_blocks(blocks)


def test_a_catalog_call_that_fails_whole_is_made_again_block_by_block(pub_config, accounts, admin):
    """The publisher's side: a call that raises is made again a block at a time, so only the
    block that breaks it gets the error."""
    config = pub_config
    alice = recorded(config, accounts, "alice", 2, "261121_190000:alice_c",
                     {"dataset": "/Prim/alice-c-v1/USER"})  # fmt: skip
    bob = recorded(config, accounts, "bob", 3, "261121_190000:bob_c",
                   {"dataset": "/Prim/bob-c-v1/USER"})  # fmt: skip
    catalog = OneBlockBreaksTheCall(accounts["agent"].db(config.store.catalog_db))
    catalog.poison = make_block(alice).name
    one_cycle(config, catalog)
    assert publications(config, accounts, bob) == {"published": 3}
    assert publications(config, accounts, alice) == {"publication_error": 2}


def test_a_block_closes_by_size_as_by_files():
    """Pure: full blocks by files and by bytes of entries (a file that would pass the bound
    starts the next block); the rest waits unless its task is over."""
    docs = [
        sample_request("alice", publish=True, already_at_destination=True,
                       publish_info={"dataset": "/P/alice-s-v1/USER", "parents": parents(k, 400)})
        for k in (10, 10, 10, 1, 1)
    ]  # fmt: skip
    for i, doc in enumerate(docs):  # copied one after the other, in this order
        doc["history"][0]["at"] += i
    sizes = [entry_chars(d) for d in docs]
    bound = sizes[0] + sizes[1] + 10  # two of the large ones fit, not three
    blocks = close_blocks(docs, docs[0]["created"], 100, 3600, lambda task: False, bound)
    assert [len(b) for b in blocks] == [2]
    blocks = close_blocks(docs, docs[0]["created"], 100, 3600, lambda task: True, bound)
    assert [len(b) for b in blocks] == [2, 3]
    assert all(sum(entry_chars(d) for d in b) <= bound for b in blocks)
    blocks = close_blocks(docs, docs[0]["created"], 2, 3600, lambda task: True, 10**9)
    assert [len(b) for b in blocks] == [2, 2, 1]
