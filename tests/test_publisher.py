"""The publisher over the real store and the embedded catalog: blocks by size, by age and at
the end of a task, idempotent after a crash between the catalog call and the documents'
update, failures retried then given up, and `aso publish --retry`."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from typing import Any

import pytest

from aso import model
from aso.actions import republish
from aso.agents.publisher import Publisher
from aso.catalog.base import Catalog, CatalogError
from aso.catalog.embedded import EmbeddedCatalog
from aso.core.publication import close_blocks, done_at, make_block
from aso.model import AGENT, CLEANUP, PUBLICATION, STATE, Change
from aso.provision.migrate import TO_PENDING, candidates, migrate
from aso.runtime import Runner
from aso.store import Database
from tests.conftest import sample_request
from tests.pipeline_helpers import left_as, plant_as_earlier_versions_left_them

DATASET = "/Prim/alice-proc-v1/USER"


def done_outputs(
    config,
    accounts,
    n: int,
    *,
    task: str = "261121_190000:alice_pub",
    dataset: str = DATASET,
    state_done: bool = True,
) -> list[dict[str, Any]]:
    owner = accounts["alice"].db(config.store.files_db)
    agent = accounts["agent"].db(config.store.files_db)
    docs = []
    for i in range(n):
        doc = sample_request(
            "alice",
            task=task,
            job_id=str(i),
            publish=True,
            publish_info={
                "dataset": dataset,
                "events": 100 + i,
                "lumis": {"1": [i]},
                "parents": [],
            },
        )
        doc["_rev"] = owner.create(doc)
        for to in ("submitted", "done") if state_done else ("submitted",):
            doc = model.transition(doc, [Change(STATE, to, "t")], AGENT)
            doc["_rev"] = agent.put(doc)
        docs.append(doc)
    return docs


def catalog_of(config, admin) -> EmbeddedCatalog:
    return EmbeddedCatalog(admin.db(config.store.catalog_db))


def run_publisher(config, accounts, publisher=None) -> Publisher:
    publisher = publisher or Publisher(config, "p1", server=accounts["agent"])
    runner = Runner(publisher)
    runner.workset.start()
    runner.step(wait=False)
    return publisher


def states_of(config, accounts, docs) -> Counter[str]:
    db = accounts["agent"].db(config.store.files_db)
    return Counter(d[PUBLICATION] for d in db.get_many(d["_id"] for d in docs).values())


def test_full_blocks_go_at_once_and_the_rest_waits(pub_config, accounts, admin, caplog):
    # 10 done files of a task that still has a file on its way: 2 full blocks, 2 files wait.
    docs = done_outputs(pub_config, accounts, 10)
    done_outputs(pub_config, accounts, 1, state_done=False)
    with caplog.at_level(logging.INFO, logger="aso"):
        run_publisher(pub_config, accounts)
    # One INFO line for the cycle, with its counts; the blocks and files at DEBUG only.
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(info) == 1 and "cycle of" in info[0] and "blocks 2, published 8" in info[0], info
    assert states_of(pub_config, accounts, docs) == {"published": 8, "pending": 2}
    blocks = catalog_of(pub_config, admin).dataset_files(DATASET)
    assert sorted(len(lfns) for lfns in blocks.values()) == [4, 4]
    published = {lfn for lfns in blocks.values() for lfn in lfns}
    stored = accounts["agent"].db(pub_config.store.files_db).get_many(d["_id"] for d in docs)
    for doc in stored.values():
        if doc[PUBLICATION] == "published":
            assert doc["destination_lfn"] in published
            assert doc["publication_block"] in blocks
            # One write: the catalog, not an intent in the document, records the block.
            assert [h["to"] for h in doc["history"] if h["axis"] == PUBLICATION] == ["published"]


def test_a_block_closes_when_the_task_is_over_or_its_oldest_file_waited(
    pub_config, accounts, admin
):
    over = done_outputs(
        pub_config, accounts, 3, task="261121_190001:alice_over", dataset="/Prim/alice-over-v1/USER"
    )
    run_publisher(pub_config, accounts)
    assert states_of(pub_config, accounts, over) == {"published": 3}  # no file on its way
    # The age rule, as a pure function.
    now = time.time()
    old = [
        dict(
            d,
            history=[
                {"axis": "state", "from": "submitted", "to": "done", "at": now - 7200, "by": "m"}
            ],
        )
        for d in over
    ]
    assert close_blocks(old, now, 100, 3600, lambda task: False) == [
        sorted(old, key=lambda d: (done_at(d), d["_id"]))
    ]
    assert close_blocks(old, now, 100, 10800, lambda task: False) == []


def test_publishing_again_after_a_crash_duplicates_nothing(pub_config, accounts, admin):
    """The publisher died after the catalog call: the files still wait; the next one makes
    the same block, the catalog keeps one copy, the files end published."""
    docs = done_outputs(pub_config, accounts, 4)

    class DiesAfterTheCatalog(Publisher):
        def publish(self, blocks, ctx):  # the catalog call, then the crash
            self.catalog.publish_blocks([make_block(docs) for docs in blocks])
            raise SystemExit("killed after the catalog call")

    with pytest.raises(SystemExit):
        run_publisher(
            pub_config,
            accounts,
            DiesAfterTheCatalog(pub_config, "p-dying", server=accounts["agent"]),
        )
    assert states_of(pub_config, accounts, docs) == {"pending": 4}
    time.sleep(pub_config.agents.heartbeat_expiry)  # the dead one's part passes to the living
    run_publisher(pub_config, accounts)
    assert states_of(pub_config, accounts, docs) == {"published": 4}
    blocks = catalog_of(pub_config, admin).dataset_files(DATASET)
    assert len(blocks) == 1 and sorted(next(iter(blocks.values()))) == sorted(
        d["destination_lfn"] for d in docs
    )


class BrokenCatalog(Catalog):
    """A catalog that refuses every block (its publish_blocks is the base's, one by one)."""

    name = "broken"

    def __init__(self, retryable: bool):
        self.retryable = retryable
        self.calls = 0

    def publish_block(self, block):
        self.calls += 1
        raise CatalogError("catalog unavailable: 503", retryable=self.retryable)

    def block_files(self, name):
        return None

    def dataset_files(self, dataset):
        return {}


def test_failed_publications_are_retried_then_given_up_then_reset(pub_config, accounts, admin):
    config = dataclasses.replace(
        pub_config, publisher=dataclasses.replace(pub_config.publisher, max_attempts=2)
    )
    docs = done_outputs(config, accounts, 4)
    broken = BrokenCatalog(retryable=True)
    run_publisher(
        config, accounts, Publisher(config, "p1", server=accounts["agent"], catalog=broken)
    )
    assert states_of(config, accounts, docs) == {"publication_error": 4}
    time.sleep(0.2)  # the backoff passes
    run_publisher(
        config, accounts, Publisher(config, "p1", server=accounts["agent"], catalog=broken)
    )
    assert states_of(config, accounts, docs) == {"publication_failed": 4}
    assert broken.calls == 2
    stored = accounts["agent"].db(config.store.files_db).get_many(d["_id"] for d in docs)
    assert all(d["publication_error"] == "catalog unavailable: 503" for d in stored.values())

    owner = accounts["alice"].db(config.store.files_db)
    report = republish(owner, docs[0]["task"], None, "alice")
    assert len(report.changed) == 4 and set(report.changed.values()) == {"pending"}
    # The real catalog works: published, with a fresh attempt budget.
    run_publisher(config, accounts)
    assert states_of(config, accounts, docs) == {"published": 4}


def test_a_refusal_that_cannot_heal_is_given_up_at_once(pub_config, accounts):
    docs = done_outputs(pub_config, accounts, 4)
    run_publisher(
        pub_config,
        accounts,
        Publisher(pub_config, "p1", server=accounts["agent"], catalog=BrokenCatalog(False)),
    )
    assert states_of(pub_config, accounts, docs) == {"publication_failed": 4}


def cleaned(config, accounts, doc_id: str) -> None:
    """What the cleaner writes on a done file whose cleanup is pending: its own axis, a new
    revision."""
    db = accounts["agent"].db(config.store.files_db)
    doc = db.get(doc_id)
    if doc[CLEANUP] == "pending":
        db.put(model.transition(doc, [Change(CLEANUP, "cleaned", "cleaner-x")], AGENT))


def test_another_agent_writing_the_same_files_meanwhile_splits_no_block(
    pub_config, accounts, admin
):
    """Before the publisher's write another agent (a cleaner of an older ASO, which cleaned
    files waiting for publication) writes one of the block's files: a conflict for the
    publisher, which reads that file again and goes on: one whole block, every file published
    in it, the other agent's write kept, and each temporary copy recorded deleted once."""
    docs = done_outputs(pub_config, accounts, 4)
    ids = [d["_id"] for d in docs]

    victims = list(ids)

    class RacingDb(Database):
        def bulk_write(self, updates):
            if victims:
                cleaned(pub_config, accounts, victims.pop())
            return super().bulk_write(updates)

    class RacedByTheCleaner(Publisher):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.db = RacingDb(self.db.server, self.db.name)

    run_publisher(
        pub_config, accounts, RacedByTheCleaner(pub_config, "p-raced", server=accounts["agent"])
    )
    stored = accounts["agent"].db(pub_config.store.files_db).get_many(ids)
    assert Counter(d[PUBLICATION] for d in stored.values()) == {"published": 4}
    assert Counter(d[CLEANUP] for d in stored.values()) == {"cleaned": 4}
    cleaners = Counter(
        next(h["by"] for h in d["history"] if h["axis"] == CLEANUP) for d in stored.values()
    )
    assert cleaners == {"cleaner-x": 1, "p-raced": 3}  # the race happened, its write was kept
    assert all(sum(h["axis"] == CLEANUP for h in d["history"]) == 1 for d in stored.values())
    blocks = catalog_of(pub_config, admin).dataset_files(DATASET)
    assert list(map(sorted, blocks.values())) == [sorted(d["destination_lfn"] for d in docs)]
    assert {d["publication_block"] for d in stored.values()} == set(blocks)


def test_files_an_earlier_publisher_left_publishing_are_migrated_then_finished_by_the_catalog(
    pub_config, accounts, admin
):
    """Publishers of earlier versions recorded a block's name first (`publishing`) and could
    die there: `aso db migrate` puts such files back to `pending`, the block's name in the
    history, and the publisher blocks them again with the waiting ones; the catalog decides.
    A block it never got is made whole and published; one it holds keeps its files."""
    agent = accounts["agent"].db(pub_config.store.files_db)
    admin_db = admin.db(pub_config.store.files_db)

    def left_publishing(docs, name):
        legacy = [
            left_as(doc, PUBLICATION, "publishing", time.time(), publication_block=name)
            for doc in agent.get_many(d["_id"] for d in docs).values()
        ]
        plant_as_earlier_versions_left_them(admin, pub_config, legacy)
        report = migrate(admin_db, "sim", candidates(admin_db))
        assert report.counts == {TO_PENDING: len(docs)} and not report.refused
        for doc in agent.get_many(d["_id"] for d in docs).values():
            assert doc[PUBLICATION] == "pending" and doc["publication_block"] is None
            assert name in doc["history"][-1]["reason"]

    # 1. the catalog never got the block: two of four files carry its name
    docs = done_outputs(pub_config, accounts, 4)
    name = make_block(docs).name
    left_publishing(docs[:2], name)
    # One block with all four: the same name, now in the catalog.
    run_publisher(pub_config, accounts)
    assert states_of(pub_config, accounts, docs) == {"published": 4}
    assert catalog_of(pub_config, admin).dataset_files(DATASET) == {
        name: sorted(d["destination_lfn"] for d in docs)
    }

    # 2. the catalog has the whole block; two files were marked published, then a crash
    other = "/Prim/alice-rest-v1/USER"
    docs = done_outputs(pub_config, accounts, 4, task="261121_190002:alice_rest", dataset=other)
    name = make_block(docs).name
    catalog_of(pub_config, admin).publish_block(make_block(docs, name))
    for doc in agent.get_many(d["_id"] for d in docs[:2]).values():
        agent.put(model.transition(doc, [Change(PUBLICATION, "published", "p-old")], AGENT,
                                   publication_block=name))  # fmt: skip
    left_publishing(docs[2:], name)
    run_publisher(pub_config, accounts)  # a block of the other two: the catalog holds them
    stored = agent.get_many(d["_id"] for d in docs)
    assert states_of(pub_config, accounts, docs) == {"published": 4}
    assert {d["publication_block"] for d in stored.values()} == {name}
    assert catalog_of(pub_config, admin).dataset_files(other) == {
        name: sorted(d["destination_lfn"] for d in docs)
    }


def test_files_another_publisher_put_in_another_block_are_published_there(
    pub_config, accounts, admin
):
    """Two publishers blocked the same files differently (both acted on the dataset while
    their membership settled): the catalog holds the other's block; the files it holds end
    `published` in that block, the others are blocked again; none is called failed."""
    docs = done_outputs(pub_config, accounts, 4)
    theirs = make_block(docs[:3])  # the other publisher's block, already in the catalog
    catalog_of(pub_config, admin).publish_block(theirs)
    # Ours: a block of all four, refused; settled from the catalog.
    run_publisher(pub_config, accounts)
    # The fourth file, blocked again on its own.
    run_publisher(pub_config, accounts)
    stored = accounts["agent"].db(pub_config.store.files_db).get_many(d["_id"] for d in docs)
    assert states_of(pub_config, accounts, docs) == {"published": 4}
    assert {stored[d["_id"]]["publication_block"] for d in docs[:3]} == {theirs.name}
    assert stored[docs[3]["_id"]]["publication_block"] != theirs.name
    assert all(d.get("publication_attempts", 0) == 0 for d in stored.values())
    blocks = catalog_of(pub_config, admin).dataset_files(DATASET)
    assert sorted(lfn for lfns in blocks.values() for lfn in lfns) == sorted(
        d["destination_lfn"] for d in docs
    )


def test_a_file_in_another_datasets_block_is_a_real_conflict(pub_config, accounts, admin):
    docs = done_outputs(pub_config, accounts, 4)
    elsewhere = make_block(
        done_outputs(pub_config, accounts, 1, dataset="/Prim/alice-other-v1/USER")
    )
    squatted = dataclasses.replace(
        elsewhere, files=(dataclasses.replace(elsewhere.files[0], lfn=docs[0]["destination_lfn"]),)
    )
    catalog_of(pub_config, admin).publish_block(squatted)
    run_publisher(pub_config, accounts)
    assert states_of(pub_config, accounts, docs) == {"publication_failed": 4}


def test_a_cycles_blocks_go_to_the_catalog_together_each_with_its_own_outcome(
    pub_config, accounts, admin, monkeypatch
):
    """The blocks of a cycle are handed to the catalog in one call (a call per block made
    a cycle of 300 blocks last a minute at 20x design, issue 22); a block the catalog refuses
    fails alone."""
    datasets = [f"/Prim/alice-batch{i}-v1/USER" for i in range(3)]
    docs = {d: done_outputs(pub_config, accounts, 4, dataset=d) for d in datasets}
    refused = docs[datasets[1]]
    other = done_outputs(pub_config, accounts, 1, dataset="/Prim/alice-x-v1/USER", state_done=False)
    elsewhere = make_block(other)
    catalog_of(pub_config, admin).publish_block(
        dataclasses.replace(
            elsewhere,
            files=(dataclasses.replace(elsewhere.files[0], lfn=refused[0]["destination_lfn"]),),
        )
    )  # one of its files is already in another dataset's block: a real conflict
    calls: list[int] = []
    real = EmbeddedCatalog.publish_blocks

    def counted(self, blocks):
        calls.append(len(blocks))
        return real(self, blocks)

    monkeypatch.setattr(EmbeddedCatalog, "publish_blocks", counted)
    run_publisher(pub_config, accounts)
    assert calls == [3]
    for dataset, mine in docs.items():
        expected = "publication_failed" if mine is refused else "published"
        assert states_of(pub_config, accounts, mine) == {expected: 4}, dataset


class NoTaskIndex(Database):
    """The files database without its task index: the publisher must not need it."""

    def view(self, ddoc, name, **kw):
        assert name != "by_task", "the publisher read the task index"
        return super().view(ddoc, name, **kw)


def test_a_task_is_over_when_neither_the_queue_nor_the_feed_shows_files_on_their_way(
    pub_config, accounts, admin
):
    """A task's end is known without reading its index (which the embedded store brings up
    to date on a read, every change since the last one: minutes under load): the requests on
    their way before the publisher started come from the queue view when its work set starts,
    the later ones from the feed. Its files go as one block once the last one is done."""
    publisher = Publisher(pub_config, "p-feed", server=accounts["agent"])
    publisher.db = NoTaskIndex(publisher.db.server, publisher.db.name)
    before, after = "261121_190003:alice_before", "261121_190004:alice_after"
    done = done_outputs(pub_config, accounts, 2, task=before)
    on_the_way = done_outputs(pub_config, accounts, 1, task=before, state_done=False)
    runner = Runner(publisher)
    runner.workset.start()  # `before`'s third file is on its way: from the queue view
    other = "/Prim/alice-after-v1/USER"  # a dataset of its own: blocks hold up to 4 files
    done += done_outputs(pub_config, accounts, 2, task=after, dataset=other)
    on_the_way += done_outputs(pub_config, accounts, 1, task=after, state_done=False, dataset=other)
    time.sleep(pub_config.agents.feed_interval)
    runner.step(wait=False)  # `after`'s third file is on its way: from the feed
    assert states_of(pub_config, accounts, done) == {"pending": 4}
    assert publisher.on_its_way == {before: {on_the_way[0]["_id"]}, after: {on_the_way[1]["_id"]}}
    agent = accounts["agent"].db(pub_config.store.files_db)
    for doc in on_the_way:
        doc = agent.get(doc["_id"])
        for to in ("done",):
            doc = model.transition(doc, [Change(STATE, to, "t")], AGENT)
            doc["_rev"] = agent.put(doc)
    time.sleep(pub_config.agents.feed_interval)  # the next read of the feed is due
    runner.step(wait=False)
    assert states_of(pub_config, accounts, done + on_the_way) == {"published": 6}
    for dataset in (DATASET, other):
        blocks = catalog_of(pub_config, admin).dataset_files(dataset)
        assert sorted(map(len, blocks.values())) == [3]


def test_a_gap_in_the_feed_makes_the_publisher_forget_what_it_saw_on_its_way(
    pub_config, accounts, admin
):
    """After a gap in the feed (the relay's memory passed the publisher's position) the work
    set starts again: a file the publisher saw on its way and that ended during the gap must
    not hold its task open for ever. What it knew is replaced by the queue view's."""
    publisher = Publisher(pub_config, "p-gap", server=accounts["agent"])
    publisher.db = NoTaskIndex(publisher.db.server, publisher.db.name)
    task = "261121_190005:alice_gap"
    done = done_outputs(pub_config, accounts, 2, task=task)
    runner = Runner(publisher)
    runner.workset.start()
    publisher.on_its_way[task].add("ended-during-the-gap")  # seen on its way, then the gap
    runner.step(wait=False)
    assert states_of(pub_config, accounts, done) == {"pending": 2}
    runner.workset.start()  # what a FeedGap does
    assert task not in publisher.on_its_way
    runner.step(wait=False)
    assert states_of(pub_config, accounts, done) == {"published": 2}
