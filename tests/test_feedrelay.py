"""The host's feed relay (aso/feedrelay.py) against the real store: what agents read through it is
what the store's own feed says, a long poll wakes at the first change, a position it no longer
holds starts an agent's work set again, a relay that fails hands agents to the store, and only
the agent account is answered."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest
import requests

from aso import feedrelay
from aso.config import Config
from aso.feedrelay import ChangeLog, FeedGap, FeedRelay, RelayFeed, StoreFeed
from aso.store import Database
from aso.workqueue import SUBMIT, ChangesWorkSet
from tests.conftest import PASSWORD, db_as, free_port, sample_request


@pytest.fixture()
def relay_config(store_config: Config, files_db: str, accounts: Any) -> Config:
    """The session store's config with the test's files database and its agent account."""
    store = dataclasses.replace(
        store_config.store, files_db=files_db, agent_user="agent", agent_password=PASSWORD
    )
    return dataclasses.replace(store_config, store=store)


@pytest.fixture()
def relay(relay_config: Config) -> Any:
    running = FeedRelay(relay_config)
    running.start()
    assert running.wait_ready()
    yield running
    running.stop()


def client(relay: FeedRelay, db: Database, config: Config) -> RelayFeed:
    return RelayFeed(relay.url, db, config.store.agent_user, config.store.agent_password)


def ids_and_revs(results: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(c["id"], c["doc"]["_rev"]) for c in results if c.get("doc")]


def read_all(feed: Any, since: str, limit: int = 50) -> tuple[list[dict[str, Any]], str]:
    results: list[dict[str, Any]] = []
    while True:
        batch = feed.changes(since, limit=limit)
        results += batch.results
        since = batch.last_seq
        if len(batch.results) < limit:
            return results, since


def write(db: Database, n: int, user: str = "alice") -> list[dict[str, Any]]:
    docs = [sample_request(user) for _ in range(n)]
    assert all(r.ok for r in db.bulk_write(docs))
    return docs


def test_what_agents_read_through_the_relay_is_the_store_s_feed(relay, relay_config, accounts):
    agent = db_as(accounts, "agent", relay_config.store.files_db)
    owner = db_as(accounts, "alice", relay_config.store.files_db)
    feed = client(relay, agent, relay_config)
    start = feed.position()
    assert start.startswith("relay:")
    store_start = StoreFeed(agent).position()
    docs = write(owner, 120)
    time.sleep(1.0)  # the relay's own poll of the store
    relayed, last = read_all(feed, start)
    direct, _ = read_all(StoreFeed(agent), store_start)
    # The same changes, each once (CouchDB interleaves its shards: no order is promised).
    assert len(relayed) == len(direct) == len(docs)
    assert sorted(ids_and_revs(relayed)) == sorted(ids_and_revs(direct))
    assert {c["id"] for c in relayed} == {d["_id"] for d in docs}
    assert all(c["doc"]["state"] == "new" for c in relayed)
    # Nothing new: the same position again, nothing repeated.
    again = feed.changes(last, limit=50)
    assert again.results == [] and again.last_seq == last
    assert relay.served >= 4


def test_a_long_poll_on_the_relay_wakes_at_the_first_change(relay, relay_config, accounts):
    agent = db_as(accounts, "agent", relay_config.store.files_db)
    feed = client(relay, agent, relay_config)
    since = feed.position()
    got: dict[str, Any] = {}

    def wait() -> None:
        started = time.monotonic()
        got["batch"] = feed.changes(since, limit=100, wait=20.0)
        got["seconds"] = time.monotonic() - started

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    [doc] = write(db_as(accounts, "alice", relay_config.store.files_db), 1)
    waiter.join(25)
    assert [c["id"] for c in got["batch"].results] == [doc["_id"]]
    assert got["seconds"] < 10, got  # woken by the change, not by the poll's end


def test_a_position_the_relay_no_longer_holds_starts_the_work_set_again(relay_config, accounts):
    small = dataclasses.replace(
        relay_config, agents=dataclasses.replace(relay_config.agents, feed_relay_changes=100)
    )
    relay = FeedRelay(small)
    relay.start()
    try:
        assert relay.wait_ready()
        agent = db_as(accounts, "agent", small.store.files_db)
        feed = client(relay, agent, small)
        workset = ChangesWorkSet(agent, (SUBMIT,), feed=feed)
        workset.start()
        old = workset.since
        docs = write(db_as(accounts, "alice", small.store.files_db), 250)
        deadline = time.monotonic() + 30
        while relay.log is not None and relay.log.first == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        with pytest.raises(FeedGap):
            feed.changes(old, limit=50)
        workset.refresh()  # the gap: started again from the queue view and the relay
        assert {d["_id"] for d in docs} <= set(workset.docs)
        assert workset.since != old and workset.since.startswith("relay:")
    finally:
        relay.stop()


def test_the_relay_keeps_at_most_its_bytes_of_changes():
    """Large requests (a user's 66 kB ones, each written ~4 times by the agents) had grown `aso
    run` by 900 MB within the count of changes alone: the log keeps at most `capacity_chars` of
    them, the newest always, and an agent behind what it dropped gets a gap."""
    log = ChangeLog(20_000, "0", capacity_chars=100_000)
    big = "x" * 10_000
    for n in range(1, 51):
        log.append([{"seq": str(n), "id": f"d{n}", "doc": {"pad": big}}], str(n))
    assert log.chars <= 100_000 and 5 <= len(log.entries) <= 10
    assert log.chars == sum(len(text) for _, text in log.entries)
    with pytest.raises(FeedGap):
        log.after("1", 10, 0.0)
    texts, last = log.after(log.entries[0][0], 100, 0.0)
    assert len(texts) == len(log.entries) - 1 and last == "50"
    log.append([{"seq": "51", "id": "huge", "doc": {"pad": "y" * 500_000}}], "51")
    assert [seq for seq, _ in log.entries] == ["51"]  # the newest stays, whatever its size


def test_only_the_agent_account_is_answered(relay, relay_config):
    base = f"{relay.url}/{relay_config.store.files_db}"
    answers = {
        "nobody": requests.get(f"{base}/_relay_position", timeout=10),
        "a user": requests.get(f"{base}/_relay_position", auth=("alice", "x"), timeout=10),
        "wrong password": requests.get(
            f"{base}/_relay_position", auth=(relay_config.store.agent_user, "x"), timeout=10
        ),
    }
    assert {who: a.status_code for who, a in answers.items()} == dict.fromkeys(answers, 401)
    auth = (relay_config.store.agent_user, relay_config.store.agent_password)
    assert requests.get(f"{relay.url}/_users/_changes", auth=auth, timeout=10).status_code == 404
    assert requests.get(f"{base}/doc", auth=auth, timeout=10).status_code == 404
    bad = requests.get(
        f"{base}/_changes", params={"since": "0", "limit": "x"}, auth=auth, timeout=10
    )
    assert bad.status_code == 400 and bad.json()["error"] == "bad_request"
    assert (
        requests.get(
            f"{base}/_changes", params={"since": "nope"}, auth=auth, timeout=10
        ).status_code
        == 410
    )


def test_an_agent_follows_the_store_while_the_relay_does_not_answer(
    relay_config, accounts, monkeypatch
):
    monkeypatch.setattr(feedrelay, "RETRY_RELAY", 0.5)
    agent = db_as(accounts, "agent", relay_config.store.files_db)
    port = free_port()
    feed = RelayFeed(
        f"http://127.0.0.1:{port}",  # nothing listens there yet
        agent,
        relay_config.store.agent_user,
        relay_config.store.agent_password,
    )
    workset = ChangesWorkSet(agent, (SUBMIT,), feed=feed)
    workset.start()
    assert not workset.since.startswith("relay:")  # the store's own position
    docs = write(db_as(accounts, "alice", relay_config.store.files_db), 5)
    workset.refresh()
    assert {d["_id"] for d in docs} <= set(workset.docs)
    # The relay comes up: after RETRY_RELAY the work set moves over to it.
    relay = FeedRelay(relay_config, port=port)
    relay.start()
    try:
        assert relay.wait_ready()
        time.sleep(0.6)
        more = write(db_as(accounts, "alice", relay_config.store.files_db), 3)
        time.sleep(1.0)
        workset.refresh()
        assert workset.since.startswith("relay:")
        assert {d["_id"] for d in docs + more} <= set(workset.docs)
    finally:
        relay.stop()


def test_a_relay_that_does_not_follow_the_store_sends_agents_to_the_store(relay_config, accounts):
    """Before its first answer from the store (or when the store stopped answering it), the
    relay answers 503 and agents read the store's own feed."""
    relay = FeedRelay(relay_config)
    serving = threading.Thread(target=relay._serve, daemon=True)
    serving.start()  # serving, not following
    try:
        auth = (relay_config.store.agent_user, relay_config.store.agent_password)
        answer = requests.get(
            f"{relay.url}/{relay_config.store.files_db}/_relay_position", auth=auth, timeout=10
        )
        assert answer.status_code == 503 and answer.json()["error"] == "behind"
        agent = db_as(accounts, "agent", relay_config.store.files_db)
        position = client(relay, agent, relay_config).position()
        assert position == StoreFeed(agent).position()  # the store's own, not the relay's
    finally:
        relay.stop()
