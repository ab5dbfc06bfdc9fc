"""The embedded store's request guard (deploy/store/request-guard.js): each request that killed
pouchdb-server, ran code in it or let a member make themselves an admin is sent as it was,
straight to the store's port (not through the front end), and answered with a 4xx in CouchDB's
shape; the store's process is the same one afterwards, and what the request tried to change is
unchanged. On a store of its own, so that a guard that fails stops this module only."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from aso import model
from aso.config import Config
from aso.local import embedded
from aso.local.stores import LocalStore, LocalStoreError
from aso.provision.designdocs import init_databases
from aso.store import Server, Settings
from aso.store import admin as store_admin
from tests.conftest import PASSWORD, only_on, own_store, sample_request

pytestmark = only_on(
    "pouchdb",
    "the guard is the embedded store's: CouchDB answers each of these requests itself (4xx) "
    "and keeps _security, _users and design documents to admins",
)

MAX_BATCH = 1000  # deploy/store/request-guard.js MAX_BATCH


@dataclass
class Guarded:
    """A guarded embedded store: its config, its process, ASO's databases, a request in it."""

    config: Config
    local: LocalStore
    pid: int
    doc_id: str

    @property
    def url(self) -> str:
        return self.config.store.url

    @property
    def db(self) -> str:
        return self.config.store.files_db

    @property
    def admin(self) -> tuple[str, str]:
        return (self.config.store.admin_user, self.config.store.admin_password)

    def send(self, who: str, method: str, path: str, body: Any = None,
             **kwargs: Any) -> requests.Response:  # fmt: skip
        """`path` as it is (percent-escapes included), straight to the store's port."""
        auth = self.admin if who == "admin" else None if who == "anonymous" else (who, PASSWORD)
        headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
        data = None if body is None else json.dumps(body)
        return requests.request(method, self.url + path, data=data, auth=auth, headers=headers,
                                timeout=30, **kwargs)  # fmt: skip

    def assert_alive(self) -> None:
        """The same store process answers (nothing here starts a dead one again)."""
        assert self.local.our_pid() == self.pid, "the store's process died"
        assert requests.get(self.url + "/", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    with own_store(tmp_path_factory.mktemp("guard")) as (config, local):
        assert isinstance(local, LocalStore)
        admin = Server.from_config(config, account="admin")
        init_databases(admin, config)
        for name, roles in (("alice", [model.USER_ROLE]), ("agent", [model.AGENT_ROLE])):
            store_admin.put_user(admin, name, PASSWORD, roles)
        alice = Server(config.store.url, "alice", PASSWORD, Settings(retries=0))
        doc = sample_request("alice")
        alice.db(config.store.files_db).put(doc)
        pid = local.our_pid()
        assert pid is not None
        yield Guarded(config, local, pid, doc["_id"])


def answer_of(response: requests.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error", "reason"}, body
    return body


# (what the store did, who, method, path with {db} and {doc}, body, the guard's status)
KILLERS = [
    ("EMBEDDED_LATEST_CRASH", "alice", "GET", "/{db}/{doc}?latest=true&rev=1-x", None, 400),
    ("EMBEDDED_LATEST_CRASH", "alice", "GET",
     '/{db}/{doc}?latest=true&open_revs=["1-x"]', None, 400),
    ("EMBEDDED_LATEST_CRASH", "admin", "DELETE", "/{db}/{doc}?latest=true&rev=1-x", None, 400),
    ("EMBEDDED_LATEST_CRASH", "alice", "POST", "/{db}/_bulk_get",
     {"docs": [{"id": "{doc}", "rev": "1-x"}], "latest": True}, 400),
    ("EMBEDDED_CHANGES_DOC_IDS_CRASH", "alice", "POST", "/{db}/_changes?since=now",
     {"doc_ids": 1}, 400),
    ("EMBEDDED_CHANGES_DOC_IDS_CRASH", "alice", "POST", "/{db}/_changes?since=now",
     {"doc_ids": True}, 400),
    ("EMBEDDED_CHANGES_DOC_IDS_CRASH", "alice", "POST", "/{db}/_changes?since=now",
     {"doc_ids": {}}, 400),
    ("EMBEDDED_CHANGES_DOC_IDS_CRASH", "alice", "POST", "/{db}/_changes?filter=_doc_ids", {}, 400),
    ("EMBEDDED_CHANGES_DOC_IDS_CRASH", "alice", "GET", "/{db}/_changes?filter=_doc_ids", None, 400),
    ("EMBEDDED_CHANGES_DOC_IDS_CRASH", "alice", "GET", "/{db}/_changes?doc_ids=1", None, 400),
    ("EMBEDDED_CHANGES_FILTER_CRASH", "alice", "GET", "/{db}/_changes?filter=_selector", None, 400),
    ("EMBEDDED_CHANGES_FILTER_CRASH", "alice", "GET", "/{db}/_changes?filter=_design", None, 400),
    ("EMBEDDED_CHANGES_FILTER_CRASH", "alice", "GET", "/{db}/_changes?filter=_view", None, 400),
    ("EMBEDDED_CHANGES_FILTER_CRASH", "alice", "GET", "/{db}/_changes?filter=x/y", None, 400),
    ("EMBEDDED_CHANGES_FILTER_CRASH", "alice", "GET", "/{db}/_changes?selector=1", None, 400),
    ("EMBEDDED_CHANGES_FILTER_CRASH", "alice", "GET", "/{db}/_changes?view=x/y", None, 400),
    ("EMBEDDED_CRASH_ON_NON_ADMIN_DB_CREATE", "alice", "PUT", "/aso_guard_new", None, 401),
    ("EMBEDDED_CRASH_ON_NON_ADMIN_MAINTENANCE", "alice", "POST", "/{db}/_compact", {}, 401),
    ("EMBEDDED_CRASH_ON_NON_ADMIN_MAINTENANCE", "alice", "POST", "/{db}/_view_cleanup", {}, 401),
    ("EMBEDDED_REVS_DIFF_CRASH", "alice", "POST", "/{db}/_revs_diff", {"{doc}": "1-x"}, 400),
    ("EMBEDDED_LIST_CRASH", "admin", "GET", "/{db}/_design/asyncstageout/_list/x/by_state",
     None, 403),
    ("EMBEDDED_LOG_CRASH", "admin", "GET", "/_log?bytes=x", None, 400),
    ("EMBEDDED_NAMES_UNCHECKED", "alice", "GET", "/%00_replicator", None, 400),
    ("EMBEDDED_NAMES_UNCHECKED", "alice", "PUT", "/%22_replicator/x",
     {"source": "{db}", "target": "http://127.0.0.1:1/x", "retry": False}, 400),
    ("EMBEDDED_NAMES_UNCHECKED", "admin", "GET", "/%ZZ", None, 400),
    ("EMBEDDED_REPLICATE_ANYONE", "anonymous", "POST", "/_replicate",
     {"source": "_users", "target": "aso_guard_stolen"}, 401),
    ("EMBEDDED_VIEW_KEYS_UNCHECKED", "alice", "POST", "/{db}/_design/asyncstageout/_view/by_state",
     {"keys": "x"}, 400),
    ("EMBEDDED_VIEW_KEYS_UNCHECKED", "alice", "POST", "/{db}/_design/asyncstageout/_view/by_state",
     {"keys": None}, 400),
    ("EMBEDDED_VIEW_KEYS_UNCHECKED", "alice", "GET",
     '/{db}/_design/asyncstageout/_view/by_state?keys="x"', None, 400),
    ("EMBEDDED_500_ON_MALFORMED_DOCS", "alice", "POST", "/{db}/_bulk_docs", {"docs": 1}, 400),
    ("EMBEDDED_500_ON_MALFORMED_DOCS", "alice", "POST", "/{db}/_bulk_docs", {"docs": [None]}, 400),
    ("EMBEDDED_500_ON_MALFORMED_DOCS", "alice", "POST", "/{db}/_bulk_docs",
     {"docs": [{"_id": "x", "_attachments": {"a": 1}}]}, 400),
    ("EMBEDDED_HEARTBEAT_BUSY", "alice", "GET",
     "/{db}/_changes?feed=continuous&heartbeat=1", None, 400),
]  # fmt: skip


def filled(value: Any, guarded: Guarded) -> Any:
    """`value` with {db} and {doc} replaced, in strings, keys and lists alike."""
    if isinstance(value, str):
        return value.replace("{db}", guarded.db).replace("{doc}", guarded.doc_id)
    if isinstance(value, list):
        return [filled(v, guarded) for v in value]
    if isinstance(value, dict):
        return {filled(k, guarded): filled(v, guarded) for k, v in value.items()}
    return value


@pytest.mark.parametrize(
    "name, who, method, path, body, status", KILLERS, ids=[f"{k[0]}-{k[2]}" for k in KILLERS]
)
def test_a_request_that_killed_the_store_is_refused_and_the_store_lives(
    guarded, name, who, method, path, body, status
):
    response = guarded.send(who, method, filled(path, guarded), filled(body, guarded))
    assert response.status_code == status, (name, response.text)
    answer_of(response)
    guarded.assert_alive()


def test_a_temporary_view_runs_no_code(guarded, tmp_path):
    """EMBEDDED_TEMP_VIEW_RUNS_CODE: the map function of a _temp_view was evaluated, before any
    check of who sent it, in a context it escapes: anyone ran code as the store's user."""
    marker = tmp_path / "ran"
    escape = (
        "Function('return this')().constructor.constructor('return process')()"
        f".mainModule.require('fs').writeFileSync({json.dumps(str(marker))}, 'x')"
    )
    response = guarded.send("anonymous", "POST", f"/{guarded.db}/_temp_view", {"map": escape})
    assert response.status_code == 410 and answer_of(response)["error"] == "gone"
    assert not marker.exists()
    guarded.assert_alive()


def test_replication_is_the_server_admins(guarded):
    """EMBEDDED_REPLICATE_ANYONE: an anonymous POST /_replicate had copied _users (password
    hashes) into a database anyone reads; no database is made now."""
    for who in ("anonymous", "alice", "agent"):
        response = guarded.send(who, "POST", "/_replicate",
                                {"source": "_users", "target": "aso_guard_stolen"})  # fmt: skip
        assert response.status_code == 401, response.text
    assert "aso_guard_stolen" not in guarded.send("admin", "GET", "/_all_dbs").json()


def security_of(guarded: Guarded) -> dict[str, Any]:
    return dict(guarded.send("admin", "GET", f"/{guarded.db}/_security").json())


def test_a_member_cannot_make_themselves_an_admin(guarded):
    """EMBEDDED_LOCAL_UNVALIDATED: the store keeps _security in _local/_security and runs no
    validation for ids starting with _local; EMBEDDED_USERS_SELF_ADMIN: a user who writes their
    own _users document is _admin for that request. Every way a member had to write them."""
    before = security_of(guarded)
    local = guarded.send("alice", "GET", f"/{guarded.db}/_local/_security").json()
    made_admin = {"_rev": local["_rev"], "security": {
        "admins": {"names": ["alice"], "roles": []}, "members": before["members"]}}  # fmt: skip
    db = guarded.db
    attempts = [
        ("PUT", f"/{db}/_local/_security", made_admin, {}),
        ("DELETE", f"/{db}/_local/_security?rev={local['_rev']}", None, {}),
        ("POST", f"/{db}/_bulk_docs", {"docs": [{"_id": "_local/_security", **made_admin}]}, {}),
        ("POST", f"/{db}", {"_id": "_local/_security", **made_admin}, {}),
        ("PUT", f"/{db}/plain", {"_id": "_local/_security", **made_admin}, {}),
        ("PUT", f"/{db}/plain?id=%22_local/_security%22", made_admin, {}),
        ("PUT", f"/{db}/_local%2F_security", made_admin, {}),
        ("COPY", f"/{db}/{guarded.doc_id}", None, {"Destination": "_local/_security"}),
        ("PUT", f"/{db}/_localx", {"anything": "unvalidated"}, {}),
        ("PUT", f"/{db}/_design/mine", {"views": {}}, {}),
        ("PUT", f"/{db}/_design/asyncstageout/page.html", None, {}),
        ("PUT", f"/{db}/_design/asyncstageout/_view", None, {}),  # an attachment named so
        ("POST", f"/{db}/_index", {"index": {"fields": ["state"]}, "ddoc": "asyncstageout"}, {}),
        ("PUT", f"/{db}/plain", None, {"Content-Type": "multipart/related; boundary=x"}),
    ]
    for method, path, body, headers in attempts:
        response = guarded.send("alice", method, path, body, headers=headers)
        assert response.status_code == 403, (method, path, response.text)
        assert answer_of(response)["error"] == "forbidden"
    assert security_of(guarded) == before
    assert guarded.send("admin", "GET", f"/{db}/_localx").status_code == 404
    assert guarded.send("admin", "GET", f"/{db}/_design/mine").status_code == 404

    own = guarded.send("alice", "GET", "/_users/org.couchdb.user:alice").json()
    own["roles"] = [model.USER_ROLE, "aso-admin"]
    response = guarded.send("alice", "PUT", "/_users/org.couchdb.user:alice", own)
    assert response.status_code == 403, response.text
    roles = guarded.send("alice", "GET", "/_session").json()["userCtx"]["roles"]
    assert roles == [model.USER_ROLE]
    guarded.assert_alive()


def test_the_server_admin_still_writes_local_and_design_documents(guarded):
    """What ASO itself does as the store admin (`aso db init`: design documents) passes."""
    db = guarded.db
    for path in (f"/{db}/_local/aso_guard", f"/{db}/_design/aso_guard"):
        response = guarded.send("admin", "PUT", path, {"views": {}})
        assert response.status_code == 201, response.text
        rev = response.json()["rev"]
        assert guarded.send("admin", "DELETE", f"{path}?rev={rev}").status_code == 200


def test_batches_of_store_users_are_bounded_not_the_agents(guarded):
    """A view read with 100,000 keys held the one process for 14-17 s: a store user's keys,
    doc_ids and documents are bounded (MAX_BATCH); the agent role's and the admin's are ASO's
    own and follow its configuration."""
    view = f"/{guarded.db}/_design/asyncstageout/_view/by_state"
    response = guarded.send("alice", "POST", view, {"keys": [["new"]] * 100_000, "reduce": False})
    assert response.status_code == 400 and "1000" in answer_of(response)["reason"]
    over = {"keys": [["x", i] for i in range(MAX_BATCH + 1)], "reduce": False}
    for who, status in (("alice", 400), ("agent", 200), ("admin", 200)):
        response = guarded.send(who, "POST", view, over)
        assert response.status_code == status, (who, response.text[:200])
    bound = {"keys": [["x", i] for i in range(MAX_BATCH)], "reduce": False}
    assert guarded.send("alice", "POST", view, bound).status_code == 200
    many = {"docs": [{"_id": uuid.uuid4().hex} for _ in range(MAX_BATCH + 1)]}
    response = guarded.send("alice", "POST", f"/{guarded.db}/_bulk_docs", many)
    assert response.status_code == 400, response.text
    ids = [uuid.uuid4().hex for _ in range(MAX_BATCH + 1)]
    response = guarded.send("alice", "POST", f"/{guarded.db}/_changes?filter=_doc_ids",
                            {"doc_ids": ids})  # fmt: skip
    assert response.status_code == 400, response.text
    guarded.assert_alive()


def test_what_asos_clients_send_passes(guarded):
    """The requests of aso.store's Database (a long poll with doc_ids, stale view reads, bulk
    writes and reads) as alice: nothing of them is refused."""
    alice = Server(guarded.url, "alice", PASSWORD, Settings(retries=0))
    db = alice.db(guarded.db)
    batch = db.changes("0", doc_ids=[guarded.doc_id], include_docs=True)
    assert [c["id"] for c in batch.results] == [guarded.doc_id]
    assert db.changes(batch.last_seq, doc_ids=[guarded.doc_id], wait=0.5).timed_out
    assert db.get_many([guarded.doc_id])[guarded.doc_id] is not None
    rows = db.view("asyncstageout", "by_state", keys=[["new"]], reduce=False, freshness="stale")
    assert rows.rows is not None
    fresh = sample_request("alice")
    assert [r.ok for r in db.bulk_write([fresh])] == [True]
    assert [d["_id"] for d in db.leaves(guarded.doc_id)] == [guarded.doc_id]  # latest, all
    guarded.assert_alive()


def test_a_store_that_is_not_guarded_does_not_start(tmp_path, monkeypatch):
    """The guard hooks express-pouchdb's modules as node loads them; a server where a hook did
    not take (here: a guard whose target names no module) refuses to listen, loudly."""
    source = Path(__file__).resolve().parents[1] / "deploy" / "store" / "request-guard.js"
    broken = tmp_path / "request-guard.js"
    target = "routes[\\\\/]root\\.js"  # the hook's target, as the module spells it
    assert target in source.read_text()
    broken.write_text(source.read_text().replace(target, "routes[\\\\/]nothere\\.js"))
    monkeypatch.setattr(embedded, "PRELOADS", (*embedded.PRELOADS[:-1], broken))
    (tmp_path / "store").mkdir()
    with (
        pytest.raises(LocalStoreError, match=r"request-guard\.js: not loaded"),
        own_store(tmp_path / "store"),
    ):
        pass


def test_a_long_poll_left_during_its_first_look_does_not_end_the_store(guarded):
    """A long poll's client that left while the store read the changes it had (its first,
    one-off read) had its read cancelled with the live feeds, which pouchdb answers with no
    `results`: the route read them and the store died. Only live feeds are cancelled."""
    docs = [{"_id": f"poll-{uuid.uuid4().hex}", "pad": "x" * 2000} for _ in range(3000)]
    for start in range(0, len(docs), MAX_BATCH):
        answer = guarded.send("admin", "POST", f"/{guarded.db}/_bulk_docs",
                              {"docs": docs[start : start + MAX_BATCH]})  # fmt: skip
        assert answer.status_code == 201, answer.text[:200]
    target = f"/{guarded.db}/_changes?feed=longpoll&since=0&include_docs=true&limit=3000"
    for wait in (0.02, 0.05, 0.1, 0.2, 0.4) * 2:
        with contextlib.suppress(requests.RequestException):
            requests.get(guarded.url + target, auth=guarded.admin, timeout=wait)
    time.sleep(1)
    guarded.assert_alive()
