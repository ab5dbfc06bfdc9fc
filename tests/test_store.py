"""aso.store against the real embedded store: bulk writes, reads, views, feeds, errors, retries."""

from __future__ import annotations

import base64
import contextlib
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from aso import model
from aso.core import request
from aso.core.outcome import outcome
from aso.local.embedded import VIEW_FUNCTIONS_MODULE
from aso.local.stores import distinct_free_ports, free_ports
from aso.model import AGENT, STATE, Change
from aso.provision import designdocs
from aso.provision.designdocs import FILES_SECURITY
from aso.store import (
    Conflict,
    Forbidden,
    NotFound,
    Server,
    Settings,
    StoreError,
    StoreUnavailable,
)
from aso.store import admin as store_admin
from aso.transfer.base import DONE, FileStatus
from tests.conftest import ENGINE, JS_ENGINE, db_as, free_port, only_on, sample_request
from tests.pipeline_helpers import wait_for


def test_bulk_write_reports_every_document_in_input_order(files_db, accounts):
    """Mixed successes, conflicts and refusals, each matched to its document by id
    (the embedded store answers refused documents first: EMBEDDED_BULK_RESULT_ORDER)."""
    agent = db_as(accounts, "agent", files_db)
    owner = db_as(accounts, "alice", files_db)
    docs = [sample_request("alice") for _ in range(6)]
    for doc, result in zip(docs, owner.bulk_write(docs), strict=True):
        assert result.ok and result.id == doc["_id"]
        doc["_rev"] = result.rev
    updates = []
    for i, doc in enumerate(docs):
        update = model.transition(doc, [Change(STATE, "submitted", "submitter-1")], AGENT)
        if i in (1, 4):
            update["_rev"] = "1-" + "0" * 32  # a stale revision: conflict
        if i == 2:
            update = dict(update, size=1)  # forbidden by validation
        updates.append(update)
    results = agent.bulk_write(updates)
    assert [r.id for r in results] == [d["_id"] for d in docs]
    assert [r.ok for r in results] == [True, False, False, True, False, True]
    assert [r.error for r in results] == [None, "conflict", "forbidden", None, "conflict", None]
    assert results[1].conflict and not results[2].conflict
    assert results[2].reason == "[immutable] size cannot change after creation"
    stored = agent.get_many(d["_id"] for d in docs)
    assert [stored[d["_id"]][STATE] for d in docs] == [
        "submitted",
        "new",
        "new",
        "submitted",
        "new",
        "submitted",
    ]
    assert [stored[d["_id"]]["_rev"] for d in docs if stored[d["_id"]][STATE] == "submitted"] == [
        results[i].rev for i in (0, 3, 5)
    ]


def test_a_document_refused_in_bulk_raises_what_its_single_write_raises(files_db, accounts):
    """WriteResult.as_error: the error a bulk write's refusal or conflict becomes is the one a
    single write of the same document raises (class, status and text), so that callers and
    logs read a refusal the same whichever way it came."""
    agent = db_as(accounts, "agent", files_db)
    doc = sample_request("alice")
    doc["_rev"] = db_as(accounts, "alice", files_db).put(doc)
    forbidden = dict(model.transition(doc, [Change(STATE, "submitted", "s-1")], AGENT), size=1)
    stale = dict(forbidden, size=doc["size"], _rev="1-" + "0" * 32)
    for update, cls in ((forbidden, Forbidden), (stale, Conflict)):
        (result,) = agent.bulk_write([update])
        with pytest.raises(cls) as single:
            agent.put(dict(update))
        from_bulk = result.as_error()
        assert type(from_bulk) is type(single.value), (from_bulk, single.value)
        assert (from_bulk.status, from_bulk.error, from_bulk.reason) == (
            single.value.status,
            single.value.error,
            single.value.reason,
        )
        assert str(from_bulk) == str(single.value)


def test_a_bulk_write_larger_than_a_request_may_be_is_cut_into_requests(admin):
    """70 documents of 1 MB, 70 MB in all: over the 64 MB body CouchDB takes in ASO's settings
    (413 for the whole write: the summaries' first run over 1M requests stopped there), and
    taken whole by the embedded store. The write is sent again in halves where the store
    refuses it: every document is written, the results in input order."""
    name = f"bulk_{uuid.uuid4().hex[:8]}"
    store_admin.create_db(admin, name, FILES_SECURITY)
    try:
        db = admin.db(name)
        docs = [{"_id": f"big{i:02d}", "blob": "x" * 1_000_000} for i in range(70)]
        results = db.bulk_write(docs)
        assert [r.id for r in results] == [d["_id"] for d in docs]
        assert all(r.ok for r in results)
        assert admin.raw("GET", f"/{name}")["doc_count"] == 70
    finally:
        store_admin.delete_db(admin, name)


def test_bulk_write_refuses_duplicate_ids_before_sending(files_db, accounts):
    doc = sample_request("alice")
    with pytest.raises(ValueError):
        db_as(accounts, "alice", files_db).bulk_write([doc, dict(doc)])
    assert db_as(accounts, "alice", files_db).get(doc["_id"]) is None


def test_duplicate_upload_by_the_owner_is_a_409_on_both_stores(files_db, accounts):
    owner = db_as(accounts, "alice", files_db)
    doc = sample_request("alice")
    owner.create(doc)
    with pytest.raises(Conflict):
        owner.create(doc)
    [result] = owner.bulk_write([doc])
    assert result.conflict


def test_get_many_returns_none_for_missing_and_deleted(files_db, accounts):
    admin = db_as(accounts, "admin", files_db)
    present, gone = sample_request("alice"), sample_request("alice")
    admin.create(present)
    admin.delete(gone["_id"], admin.create(gone))
    found = admin.get_many([present["_id"], gone["_id"], "f" * 64])
    assert found[present["_id"]]["_id"] == present["_id"]
    assert found[gone["_id"]] is None and found["f" * 64] is None


def test_write_decided_reads_conflicts_again_and_decides_again(files_db, accounts):
    """Four requests read at one revision; then someone else writes two of them and deletes
    one. The two are read again and decided again (one is still wanted, one no longer is);
    the deleted one is reported gone; the untouched one is written at once."""
    admin = db_as(accounts, "admin", files_db)
    docs = [sample_request("alice") for _ in range(4)]
    for doc in docs:
        doc["_rev"] = admin.create(doc)
    untouched, moved_on, still_wanted, deleted = docs
    admin.put(model.transition(moved_on, [Change(STATE, "submitted", "other")], AGENT))
    admin.put(still_wanted)  # a new revision, nothing else changed
    admin.delete(deleted["_id"], deleted["_rev"])
    decisions: list[str] = []

    def decide(doc: dict[str, Any]) -> dict[str, Any] | None:
        decisions.append(doc["_id"])
        if doc[STATE] != "new":
            return None
        return model.transition(doc, [Change(STATE, "killed", "alice")], model.OWNER)

    outcome = admin.write_decided(docs, decide)
    assert sorted(d["_id"] for d in outcome.written) == sorted(
        [untouched["_id"], still_wanted["_id"]]
    )
    assert [d["_id"] for d in outcome.declined] == [moved_on["_id"]]
    assert outcome.gone == [deleted["_id"]] and not outcome.refused and not outcome.conflicted
    assert sorted(outcome.not_written) == sorted([moved_on["_id"], deleted["_id"]])
    stored = admin.get(still_wanted["_id"])
    assert stored["state"] == "killed" and stored["_rev"].startswith("3-")
    assert decisions.count(still_wanted["_id"]) == 2  # decided again on the fresh copy
    assert admin.get(moved_on["_id"])["state"] == "submitted"  # the other writer's move stands


def test_delete_needs_the_revision(files_db, accounts):
    admin = db_as(accounts, "admin", files_db)
    doc = sample_request("alice")
    rev = admin.create(doc)
    with pytest.raises(ValueError):
        admin.delete(doc["_id"], "")
    with pytest.raises(Conflict):
        admin.delete(doc["_id"], "1-" + "0" * 32)
    admin.delete(doc["_id"], rev)
    assert admin.get(doc["_id"]) is None


def test_a_delete_without_revision_is_still_judged_by_validation(files_db, accounts):
    """EMBEDDED_DELETE_WITHOUT_REV: even a raw DELETE without rev cannot bypass the rules (the
    embedded store deletes the current revision, and judges that)."""
    doc = sample_request("alice")
    db_as(accounts, "alice", files_db).create(doc)
    for who in ("alice", "agent"):
        with pytest.raises((Forbidden, Conflict)):
            accounts[who].raw("DELETE", f"/{files_db}/{doc['_id']}")
    assert db_as(accounts, "admin", files_db).get(doc["_id"]) is not None


def conflicts_counted(db: str, route: str) -> float:
    return REGISTRY.get_sample_value("aso_store_conflicts_total", {"db": db, "route": route}) or 0


def test_a_write_on_another_revision_is_couchdb_s_conflict_from_either_store(files_db, accounts):
    """EMBEDDED_VALIDATES_BEFORE_CONFLICT: the embedded store's validation refuses a write that
    is not based on the current revision ("[conflict] ...", a 403); CouchDB answers 409 before
    it validates. aso.store makes both the same Conflict (409 `conflict`), counted as one, for
    single writes, deletions and bulk results, so every writer reads again as on CouchDB."""
    agent = db_as(accounts, "agent", files_db)
    doc = sample_request("alice")
    doc["_rev"] = db_as(accounts, "alice", files_db).create(doc)
    moved = model.transition(doc, [Change(STATE, "submitted", "s-1")], AGENT)
    moved["_rev"] = agent.put(moved)
    stale = model.transition(doc, [Change(STATE, "submitted", "s-2")], AGENT)
    before = conflicts_counted(files_db, "doc")
    for write in (lambda: agent.put(stale), lambda: agent.delete(doc["_id"], doc["_rev"])):
        with pytest.raises(Conflict) as conflict:
            write()
        assert (conflict.value.status, conflict.value.error) == (409, "conflict")
        if ENGINE == "pouchdb":  # the validation's own words; CouchDB's are its usual ones
            assert conflict.value.reason.startswith("[conflict] the write is based on revision")
    assert conflicts_counted(files_db, "doc") == before + 2
    [bulk] = agent.bulk_write([stale])
    assert bulk.conflict and bulk.error == "conflict" and type(bulk.as_error()) is Conflict
    assert agent.get(doc["_id"]) == moved


def test_views_fresh_and_stale(files_db, accounts):
    admin = db_as(accounts, "admin", files_db)
    task = "261121_130000:alice_views"
    docs = [sample_request("alice", task=task, job_id=str(i)) for i in range(5)]
    admin.bulk_write(docs)
    rows = admin.view("asyncstageout", "by_task", start_key=[task], end_key=[task, {}]).rows
    assert [r["key"][1] for r in rows] == [0, 1, 2, 3, 4]  # job ids of digits: numbers
    limited = admin.view("asyncstageout", "by_task", start_key=[task], end_key=[task, {}], limit=2)
    assert len(limited.rows) == 2
    by_key = admin.view("asyncstageout", "by_task", keys=[[task, 3, "output", docs[3]["_id"]]])
    assert [r["id"] for r in by_key.rows] == [docs[3]["_id"]]
    # A stale read does not wait for the index: a write made after the last fresh read is not
    # seen by a stale read, and is seen by the next fresh one.
    late = sample_request("alice", task=task, job_id="9")
    admin.create(late)
    stale = admin.view(
        "asyncstageout", "by_task", start_key=[task], end_key=[task, {}], freshness="stale"
    )
    assert late["_id"] not in {r["id"] for r in stale.rows}
    fresh = admin.view("asyncstageout", "by_task", start_key=[task], end_key=[task, {}])
    assert late["_id"] in {r["id"] for r in fresh.rows}
    counts = admin.view("asyncstageout", "by_state", reduce=True, group_level=1)
    assert {tuple(r["key"]): r["value"] for r in counts.rows}[("new",)] >= 6


def test_queue_view_lists_only_work(files_db, accounts):
    admin = db_as(accounts, "admin", files_db)
    waiting = sample_request("bob")
    finished = sample_request("bob")
    finished[STATE] = "failed"
    admin.bulk_write([waiting, finished])
    rows = admin.view(
        "queue",
        "work",
        start_key=["submit", "bob"],
        end_key=["submit", "bob", {}],
        reduce=False,
        include_docs=True,
    ).rows
    ids = {r["id"] for r in rows}
    assert waiting["_id"] in ids and finished["_id"] not in ids
    assert all(r["doc"]["state"] == "new" for r in rows)


def test_a_filtered_batch_that_finds_nothing_goes_on_past_what_it_read(files_db, accounts):
    """EMBEDDED_FILTERED_LAST_SEQ: the embedded store ended a batch filtered by ids at the
    last change it returned (at `since` when none), so a client following quiet files read the
    same history again at every poll. The batch's `last_seq` is past every change it read:
    the next batch from it sees only what came later."""
    admin = db_as(accounts, "admin", files_db)
    first, later = sample_request("alice"), sample_request("alice")
    admin.create(first)
    quiet = admin.changes("0", doc_ids=["no-such-request"])
    assert quiet.results == []
    assert admin.changes(quiet.last_seq, doc_ids=[first["_id"]]).results == []  # read already
    admin.create(later)
    after = admin.changes(quiet.last_seq, doc_ids=[first["_id"], later["_id"]])
    assert [c["id"] for c in after.results] == [later["_id"]]
    both = {first["_id"], later["_id"]}
    cut = admin.changes("0", doc_ids=sorted(both), limit=1)
    # A sharded CouchDB merges its shards' feeds in no set order: either change may come first.
    assert len(cut.results) == 1 and cut.results[0]["id"] in both
    rest = both - {cut.results[0]["id"]}
    # Cut by its limit, the next batch goes on from there: only the change not read yet.
    assert [c["id"] for c in admin.changes(cut.last_seq, doc_ids=sorted(both)).results] == [*rest]


def test_changes_batches_and_long_poll_that_the_store_never_ends(files_db, accounts):
    """EMBEDDED_FEED_NEVER_TIMES_OUT: a long poll with no change returns after `wait` (+ the
    client's margin) as an empty, timed-out batch instead of hanging."""
    admin = db_as(accounts, "admin", files_db)
    now = admin.changes("0", limit=100000)
    since = now.last_seq
    assert isinstance(since, str)
    docs = [sample_request("alice") for _ in range(3)]
    admin.bulk_write(docs)
    batch = admin.changes(since, include_docs=True)
    assert {c["id"] for c in batch.results} == {d["_id"] for d in docs}
    assert all(c["doc"]["state"] == "new" for c in batch.results)
    only = admin.changes(since, doc_ids=[docs[1]["_id"]])
    assert [c["id"] for c in only.results] == [docs[1]["_id"]]

    quiet = Server(
        accounts["admin"].url,
        accounts["admin"].user,
        accounts["admin"]._password,
        Settings(feed_timeout=1.0, retries=1),
    )
    started = time.monotonic()
    empty = quiet.db(files_db).changes(batch.last_seq, wait=1.0)
    elapsed = time.monotonic() - started
    # pouchdb-server keeps the poll open (our read timeout ends it, `since` stays); CouchDB
    # ends it at `timeout` with a `last_seq` of its own: either way an empty, timed-out batch.
    assert empty.results == [] and empty.timed_out
    assert elapsed < 30  # bounded by the client, not by the store
    batch = empty

    # A change that arrives during the poll ends it with that change.
    late = sample_request("alice")
    timer = threading.Timer(0.5, lambda: admin.create(late))
    timer.start()
    woken = quiet.db(files_db).changes(batch.last_seq, wait=1.0)
    timer.join()
    if not woken.results:  # the write landed just after the poll ended: the next one sees it
        woken = quiet.db(files_db).changes(batch.last_seq)
    assert late["_id"] in {c["id"] for c in woken.results}


CLIENTS_OF_FEEDS = "/_node/_local/_stats/couchdb/httpd/clients_requesting_changes"


def clients_of_feeds(admin: Server) -> int:
    """CouchDB's stat of the clients of live feeds; the embedded store's request guard answers
    it with its live changes listeners (EMBEDDED_FEEDS_NEVER_RELEASED)."""
    return int(admin.raw("GET", CLIENTS_OF_FEEDS)["value"])


def open_feed(url: str, user: str, password: str, path: str) -> socket.socket:
    """A client that asks for a live feed and is left waiting on it (the store answers nothing
    until a change or a heartbeat)."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Basic {token}\r\n\r\n".encode()
    )
    return sock


def test_a_feed_whose_client_left_is_released(files_db, store_config, admin):
    """Live feeds (continuous and long polls) count while their client waits, and no longer
    once it has gone: the store keeps no listener. CouchDB notices a gone client when it next
    writes to it (a heartbeat); the embedded store kept each feed for ever (100 closed feeds
    made a write 5 times slower) and now lets it go when the connection closes."""
    store = store_config.store
    before = clients_of_feeds(admin)
    paths = [
        f"/{files_db}/_changes?feed={feed}&since=now&heartbeat={heartbeat}"
        for feed in ("continuous", "longpoll")
        for heartbeat in (1000, 5000)
        for _ in range(10)
    ]
    clients = [open_feed(store.url, store.admin_user, store.admin_password, p) for p in paths]
    try:
        wait_for(lambda: clients_of_feeds(admin) == before + len(clients), 60, "40 live feeds")
    finally:
        for client in clients:
            client.close()
    wait_for(lambda: clients_of_feeds(admin) == before, 60, "the 40 closed feeds to be released")
    assert admin.db(files_db).info()  # and the store answers


def test_follow_reads_everything_then_stops(files_db, accounts):
    admin = db_as(accounts, "admin", files_db)
    start = admin.changes("0", limit=100000).last_seq
    docs = [sample_request("alice") for _ in range(25)]
    admin.bulk_write(docs)
    seen = [c["id"] for batch in admin.follow(start, batch=10) for c in batch.results]
    assert sorted(seen) == sorted(d["_id"] for d in docs)


def test_new_databases_are_closed_to_strangers(admin, accounts):
    """EMBEDDED_OPEN_SECURITY: create_db always sets _security."""
    name = "closed_" + str(free_port())
    assert store_admin.create_db(admin, name, {"members": {"roles": ["aso-user"]}})
    assert not store_admin.create_db(
        admin, name, {"members": {"roles": ["aso-user"]}}
    )  # idempotent
    with pytest.raises(StoreError) as err:
        accounts["anonymous"].db(name).put({"_id": "x", "a": 1})
    assert err.value.status in (401, 403)
    accounts["alice"].db(name).put({"_id": "x", "a": 1})
    store_admin.delete_db(admin, name)


def test_non_admins_cannot_create_databases_and_the_store_survives(admin, accounts):
    """EMBEDDED_CRASH_ON_NON_ADMIN_DB_CREATE: the request is never sent."""
    with pytest.raises(Forbidden):
        store_admin.create_db(accounts["alice"], "should_not_exist", {})
    assert "should_not_exist" not in store_admin.all_dbs(admin)
    assert admin.info()  # still up


def test_not_found_and_missing_database(admin):
    with pytest.raises(NotFound):
        admin.db("no_such_db").info()
    assert admin.db("no_such_db").exists() is False


def test_unreachable_store_is_one_clear_error():
    port = free_port()
    server = Server(f"http://127.0.0.1:{port}", settings=Settings(retries=2, backoff=0.05))
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as err:
        server.info()
    assert time.monotonic() - started < 10
    message = str(err.value)
    assert message.startswith(f"cannot reach the store at http://127.0.0.1:{port}")
    assert "\n" not in message and "refused" in message.lower()


class FlakyProxy:
    """A TCP proxy in front of the real store that answers the first `failures` requests with
    503 (as an overloaded CouchDB or a load balancer would), then forwards everything."""

    def __init__(self, target_port: int, failures: int):
        self.target_port, self.failures = target_port, failures
        self.refused = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        if self.refused < self.failures:
            self.refused += 1
            client.recv(65536)
            client.sendall(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json"
                b"\r\nContent-Length: 45\r\nConnection: close\r\n\r\n"
                b'{"error":"unavailable","reason":"try later"}\n'
            )
            client.close()
            return
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def behind_flaky_proxy(
    admin: Server, failures: int, retries: int
) -> Iterator[tuple[Server, FlakyProxy]]:
    """An admin client of the real store, reaching it through a FlakyProxy."""
    proxy = FlakyProxy(int(admin.url.rsplit(":", 1)[1]), failures)
    try:
        yield (
            Server(
                f"http://127.0.0.1:{proxy.port}",
                admin.user,
                admin._password,
                Settings(retries=retries, backoff=0.05),
            ),
            proxy,
        )
    finally:
        proxy.close()


def test_5xx_answers_are_retried_with_backoff(admin, files_db):
    with behind_flaky_proxy(admin, failures=2, retries=3) as (flaky, proxy):
        [result] = flaky.db(files_db).bulk_write([sample_request("alice")])
        assert result.ok and proxy.refused == 2


def test_5xx_beyond_the_retries_is_reported(admin, files_db):
    with behind_flaky_proxy(admin, failures=10, retries=1) as (flaky, proxy):
        with pytest.raises(StoreError) as err:
            flaky.db(files_db).info()
        assert err.value.status == 503 and proxy.refused == 2


def test_push_design_is_idempotent(files_db, admin, store_config):
    from aso.provision.designdocs import design_documents

    db = admin.db(files_db)
    ddocs = design_documents(store_config)
    revs_before = {d["_id"]: db.get(d["_id"])["_rev"] for d in ddocs}
    assert [store_admin.push_design(db, d) for d in ddocs] == [False] * len(revs_before)
    assert {d["_id"]: db.get(d["_id"])["_rev"] for d in ddocs} == revs_before


def test_store_kind_is_detected(admin):
    assert admin.kind == {"pouchdb": "pouchdb-server", "couchdb": "couchdb"}[ENGINE]
    ctx: dict[str, Any] = admin.session()
    assert ctx["name"] == admin.user and "_admin" in ctx["roles"]


# What each engine says of `null.x`: the fingerprint of the engine that runs a view.
ENGINE_FINGERPRINT = {
    "quickjs": "cannot read property 'x' of null",
    "spidermonkey": "null has no properties",
}


@only_on("couchdb", "the JavaScript engine is CouchDB's choice (couchdb.js_engine)")
def test_the_store_runs_the_configured_javascript_engine(admin, store_config):
    """The suite's store-side tests run on the engine they name (ASO_TEST_JS_ENGINE): asked
    of the JavaScript itself, not of the config."""
    name = f"engine_{time.monotonic_ns()}"
    store_admin.create_db(admin, name, FILES_SECURITY)
    try:
        db = admin.db(name)
        map_fn = "function (doc) { try { null.x; } catch (e) { emit(null, e.message); } }"
        store_admin.push_design(db, {"_id": "_design/probe", "views": {"engine": {"map": map_fn}}})
        db.server.raw("PUT", f"/{name}/one", body={"n": 1})
        rows = db.view("probe", "engine").rows
        assert [row["value"] for row in rows] == [ENGINE_FINGERPRINT[JS_ENGINE]]
    finally:
        store_admin.delete_db(admin, name)


def test_every_view_of_every_design_document_builds_and_answers(files_db, accounts, store_config):
    """Each view of the files database, over requests in every state, on this store (and on
    CouchDB on the engine under test: a function one engine cannot run fails here)."""
    db = db_as(accounts, "admin", files_db)
    docs = []
    for state in model.STATES[STATE]:
        doc = sample_request("alice", publish=True, publish_info={"dataset": "/p/alice-v/USER"})
        doc[STATE] = state
        docs.append(doc)
    # A failed file whose temporary copy the cleaner discarded: finished, purgeable.
    discarded = sample_request("alice")
    docs.append({**discarded, STATE: "failed", model.CLEANUP: "cleaned"})
    # A copy done in 20 s, as the monitor records it: the statistics' transfer times have a row.
    copied = sample_request("alice", publish=True, publish_info={"dataset": "/p/alice-v/USER"})
    lease = {"owner": "s1", "until": time.time() + 600, "key": "k1"}
    copied = {**copied, **request.submitted(copied, "job-1", "gfal", "s1", time.time() - 20, lease)}
    status = FileStatus(copied["_id"], DONE, "FINISHED", verified=True)
    docs.append({**copied, **(outcome(copied, status, "m", time.time()) or {})})
    assert all(r.ok for r in db.bulk_write(docs))
    views = [
        (ddoc["_id"].split("/", 1)[1], name, "reduce" in view)
        for ddoc in designdocs.design_documents(store_config)
        for name, view in ddoc.get("views", {}).items()
    ]
    assert len(views) >= 7
    for ddoc, name, has_reduce in views:
        rows = db.view(ddoc, name, reduce=False if has_reduce else None).rows
        assert rows, (ddoc, name)  # every view has something to say of some request
        if has_reduce:
            assert db.view(ddoc, name, reduce=True).rows, (ddoc, name)


SANDBOX_MAP = """function (doc) {
  if (doc.boom) { throw new Error('this document breaks the map function'); }
  var made;  // CouchDB's SpiderMonkey refuses Function() itself (couchjs without --eval)
  try { made = Function('return typeof process + "/" + typeof Buffer')(); }
  catch (e) { made = 'refused'; }
  emit(doc._id, [typeof process, typeof Buffer, made, Array.isArray(doc.list), doc.list.length]);
}"""
SANDBOX_SUM = "function (keys, values, rereduce) { return sum(values); }"
# What SANDBOX_MAP's own Function sees: CouchDB's SpiderMonkey refuses to make one (couchjs runs
# without --eval); QuickJS and the embedded store's sandbox make one that sees no more than the
# map function.
FUNCTION_CONSTRUCTOR_GIVES = (
    "refused" if (ENGINE, JS_ENGINE) == ("couchdb", "spidermonkey") else "undefined/undefined"
)


def test_view_functions_run_sandboxed_for_each_document(admin):
    """A view's functions see each document, and nothing of the server that runs them (no
    process, no Buffer), not through a function they make either (on the embedded store they
    are compiled once per view update, EMBEDDED_VIEW_CONTEXT_PER_DOCUMENT); a document that
    breaks the map function is left out of the view, not the rest; a reduce function of one's own
    (with the `sum` helper) adds up."""
    name = f"aso_test_sandbox_{uuid.uuid4().hex[:8]}"
    store_admin.create_db(admin, name, FILES_SECURITY)
    try:
        db = admin.db(name)
        db.create(
            {
                "_id": "_design/sandbox",
                "views": {
                    "reach": {"map": SANDBOX_MAP},
                    "total": {"map": "function (doc) { emit(doc.group, doc.n); }",
                              "reduce": SANDBOX_SUM},
                },
            }
        )  # fmt: skip
        docs = [{"_id": f"d{i}", "group": "ab"[i % 2], "n": i, "list": [i] * i} for i in range(6)]
        docs.append({"_id": "d6", "group": "a", "n": 100, "list": [], "boom": True})
        assert all(r.ok for r in db.bulk_write(docs))
        rows = db.view("sandbox", "reach").rows
        assert [r["id"] for r in rows] == [f"d{i}" for i in range(6)]  # not the one that broke it
        for i, row in enumerate(rows):
            process, buffer, made, is_array, length = row["value"]
            assert (process, buffer, is_array, length) == ("undefined", "undefined", True, i)
            assert made == FUNCTION_CONSTRUCTOR_GIVES
        totals = db.view("sandbox", "total", reduce=True, group=True).rows
        assert {r["key"]: r["value"] for r in totals} == {"a": 0 + 2 + 4 + 100, "b": 1 + 3 + 5}
        assert db.view("sandbox", "total", reduce=True).rows[0]["value"] == 115
        db.create({"_id": "d7", "group": "b", "n": 7, "list": []})  # an update of the view
        assert db.view("sandbox", "total", keys=["b"], reduce=True, group=True).rows == [
            {"key": "b", "value": 16}
        ]
    finally:
        store_admin.delete_db(admin, name)


@only_on("pouchdb", "the embedded store's node loads deploy/store/view-functions.js")
def test_the_embedded_store_will_not_start_without_its_view_workaround(tmp_path):
    """deploy/store/view-functions.js patches one line of pouchdb-mapreduce as node loads it;
    another pouchdb-mapreduce without that line stops node with a message that says so, rather
    than a store that builds views several times slower unnoticed."""
    node = shutil.which("node")
    assert node, "node is installed with the embedded store (deploy/debian-packages.txt)"
    lib = tmp_path / "node_modules" / "pouchdb-mapreduce" / "lib"
    lib.mkdir(parents=True)
    (lib / "index.js").write_text("var evalFunction = somethingElse;\nmodule.exports = {};\n")
    ran = subprocess.run(
        [node, f"--require={VIEW_FUNCTIONS_MODULE}", "-e", f"require({str(lib / 'index.js')!r})"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode != 0
    assert "is not in" in ran.stderr and "exactly once" in ran.stderr


# --- conflicting branches (a CouchDB cluster's; made here with new_edits=false) -------------
def branch(db, doc: dict[str, Any], base_rev: str, digest: str, **fields: Any) -> str:
    """Store an edit of `base_rev` as another writer of a cluster would have (new_edits=false:
    the revision is given, as replication gives it): a conflicting branch. Its revision."""
    number = int(base_rev.split("-")[0]) + 1
    rev = f"{number}-{digest}"
    body = dict(doc, **fields, _rev=rev)
    body["_revisions"] = {"start": number, "ids": [digest, base_rev.split("-", 1)[1]]}
    db.server.raw("POST", f"/{db.name}/_bulk_docs", body={"docs": [body], "new_edits": False})
    return rev


def conflicted(files_db, accounts, digest: str) -> tuple[dict[str, Any], str, str]:
    """A request submitted by two submitters from the same revision: (request, the winner's
    revision, the loser's), the loser's hash lower so that CouchDB's order puts it second."""
    admin = db_as(accounts, "admin", files_db)
    doc = sample_request("alice")
    doc["_rev"] = db_as(accounts, "alice", files_db).create(doc)
    one = model.transition(doc, [Change(STATE, "submitted", "sub-1")], AGENT)
    two = model.transition(doc, [Change(STATE, "submitted", "sub-2")], AGENT)
    high = branch(admin, one, doc["_rev"], "f" * 32)
    low = branch(admin, two, doc["_rev"], digest)
    stored = admin.get_many([doc["_id"]], conflicts=True)[doc["_id"]]
    assert stored["_rev"] == high and stored["_conflicts"] == [low]
    return doc, high, low


@only_on("couchdb", "conflicting branches are a cluster's (made with new_edits=false, which "
         "pouchdb-server answers with [] and does not apply)")  # fmt: skip
def test_a_contested_revision_is_withdrawn_only_when_another_beats_it(files_db, accounts):
    """CLUSTER_ACCEPTED_IS_NOT_WON: a writer whose edit a cluster stored below its quorum
    withdraws it when another branch beats it (the other writer's edit stays the document),
    never when it is the best one (a document never loses every branch)."""
    agent = db_as(accounts, "agent", files_db)
    doc, high, low = conflicted(files_db, accounts, "0" * 32)
    assert not agent.withdraw_if_beaten(doc["_id"], high)  # the best: kept
    assert agent.withdraw_if_beaten(doc["_id"], low)  # beaten: withdrawn, as an agent may
    assert [d["_rev"] for d in agent.leaves(doc["_id"])] == [high]
    stored = agent.get_many([doc["_id"]], conflicts=True)[doc["_id"]]
    assert stored["_rev"] == high and "_conflicts" not in stored
    assert stored[STATE] == "submitted" and stored["history"][-1]["by"] == "sub-1"
    alone = sample_request("alice")
    alone["_rev"] = db_as(accounts, "alice", files_db).create(alone)
    assert not agent.withdraw_if_beaten(alone["_id"], alone["_rev"])  # the only branch
    assert agent.get(alone["_id"])["_rev"] == alone["_rev"]


def test_the_leaves_of_many_documents_in_one_request(files_db, accounts):
    """`leaves_many` (`_bulk_get` naming no revision): the live leaves of each document, none
    for one that is missing or deleted; on CouchDB each branch of a conflict."""
    agent, alice = db_as(accounts, "agent", files_db), db_as(accounts, "alice", files_db)
    plain, gone = sample_request("alice"), sample_request("alice")
    plain["_rev"] = alice.create(plain)
    gone["_rev"] = alice.create(gone)
    db_as(accounts, "admin", files_db).delete(gone["_id"], gone["_rev"])
    found = agent.leaves_many([plain["_id"], gone["_id"], "missing"])
    assert [d["_rev"] for d in found[plain["_id"]]] == [plain["_rev"]]
    assert found[gone["_id"]] == [] and found["missing"] == []
    if ENGINE == "couchdb":  # new_edits=false: CouchDB's alone
        doc, high, low = conflicted(files_db, accounts, "3" * 32)
        assert sorted(d["_rev"] for d in agent.leaves_many([doc["_id"]])[doc["_id"]]) == sorted(
            [high, low]
        )


def test_agents_delete_unfinished_requests_only_as_a_withdrawn_branch(files_db, accounts):
    """The validation's rule for CLUSTER_CONFLICTING_BRANCHES: an agent deletes a request that
    is not finished only with `withdrawn` saying it is a conflicting branch; a user never."""
    doc = sample_request("alice")
    doc["_rev"] = db_as(accounts, "alice", files_db).create(doc)
    plain = {"_id": doc["_id"], "_rev": doc["_rev"], "_deleted": True}
    for who in ("agent", "alice", "bob"):
        [refused] = db_as(accounts, who, files_db).bulk_write([plain])
        assert refused.error == "forbidden", refused
    for who in ("alice", "bob"):
        [refused] = db_as(accounts, who, files_db).bulk_write(
            [dict(plain, withdrawn=model.WITHDRAWN)]
        )
        assert refused.error == "forbidden", refused
    [other] = db_as(accounts, "agent", files_db).bulk_write([dict(plain, withdrawn="other")])
    assert other.error == "forbidden"
    [done] = db_as(accounts, "agent", files_db).bulk_write([dict(plain, withdrawn=model.WITHDRAWN)])
    assert done.ok and db_as(accounts, "admin", files_db).get(doc["_id"]) is None


def test_ports_for_local_servers_are_free_and_outside_the_ephemeral_range():
    """free_port, free_ports and distinct_free_ports choose listening ports that no outgoing
    connection can take meanwhile (outside the kernel's ephemeral range) and that are free:
    the servers of two test legs at once do not die of EADDRINUSE."""
    low, high = (int(w) for w in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    first = free_ports(3)
    chosen = [free_port() for _ in range(50)] + distinct_free_ports(8) + [first, first + 2]
    assert len(set(distinct_free_ports(8))) == 8
    for port in chosen:
        assert 10000 <= port < 65536 and not low <= port <= high, port
    with contextlib.ExitStack() as held:  # each one can be listened on now
        for port in range(first, first + 3):
            sock = held.enter_context(socket.socket())
            sock.bind(("127.0.0.1", port))
            sock.listen()
        # ... and one held by a listener is never handed out again meanwhile
        assert not {free_port() for _ in range(200)} & set(range(first, first + 3))


def test_another_site_s_page_cannot_write_with_a_browser_s_session(store_config, admin):
    """The monitoring pages are served by the store, and whoever opens them logs in there (an
    operator, often as the store's admin): a page of another site must not write with that
    session. On both stores the session cookie is SameSite=Strict and HttpOnly, no CORS header
    is given to another origin, and a form post (a design document's attachment upload, as a
    cross-site form can send it without asking) without a Referer of the store's own host is
    refused: the pages' design document stays as it was. The embedded store took all three
    (EMBEDDED_NO_CSRF_CHECK, EMBEDDED_CORS_OPEN, EMBEDDED_SESSION_COOKIE_CROSS_SITE)."""
    import requests as http

    store = store_config.store
    session = http.Session()
    account = {"name": store.admin_user, "password": store.admin_password}
    login = session.post(f"{store.url}/_session", json=account, timeout=30)
    assert login.status_code == 200, login.text
    cookie = login.headers["Set-Cookie"]
    assert "samesite=strict" in cookie.lower() and "httponly" in cookie.lower(), cookie
    name = f"pages_{uuid.uuid4().hex[:8]}"  # a pages' database of its own
    store_admin.create_db(admin, name, designdocs.PAGES_SECURITY)
    store_admin.push_design(admin.db(name), {"_id": designdocs.PAGES_DDOC, "views": {}})
    pages = f"{store.url}/{name}/{designdocs.PAGES_DDOC}"
    before = admin.db(name).get(designdocs.PAGES_DDOC)
    assert before is not None
    evil = "https://alice.example"
    for headers in ({}, {"Origin": evil}, {"Referer": evil + "/x.html"},
                    {"Origin": evil, "Sec-Fetch-Site": "cross-site"}):  # fmt: skip
        answer = session.post(pages, data={"_rev": before["_rev"]}, headers=headers, timeout=30,
                              files={"_attachments": ("x.html", b"<script>1</script>",
                                                      "text/html")})  # fmt: skip
        assert answer.status_code in (400, 403), (headers, answer.status_code, answer.text)
    preflight = session.options(pages, timeout=30, headers={
        "Origin": evil, "Access-Control-Request-Method": "PUT"})  # fmt: skip
    read = session.get(f"{store.url}/_session", headers={"Origin": evil}, timeout=30)
    for answer in (preflight, read):
        assert not [h for h in answer.headers if h.lower().startswith("access-control-")]
    assert admin.db(name).get(designdocs.PAGES_DDOC) == before
