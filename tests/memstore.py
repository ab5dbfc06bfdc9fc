"""An in-memory document store that runs the project's own store-side JavaScript: the fast
tier's stand-in for CouchDB and pouchdb-server, so that agents' cycles run in milliseconds.

`MemStore` holds the databases; `MemStore.server(name, roles)` is one account's `Server` on it
and `.db(name)` its `MemDatabase`, the `Documents` of aso.store.api. What it models, as CouchDB
3 does on a single node:

* revisions `N-hash`; a write with a stale, made-up or missing `_rev` is a 409 conflict (before
  validation, as CouchDB answers); `_deleted` tombstones, and a deleted document created again
  from its tombstone's revision; members beginning with `_` other than CouchDB's refused;
* every write judged by each design document's validate_doc_update (tests/storejs.py: the
  JavaScript as `aso db init` pushes it, in QuickJS) with the account's userCtx and the
  database's `_security`; a thrown `forbidden` is a 403, `unauthorized` a 401; design
  documents are written by admins alone (401); reads and writes by the database's members;
* an integer update sequence; `changes` (since, limit, include_docs, doc_ids, and `wait`
  blocking until a write or the timeout); `all_docs` ranges; views built from the design
  documents' map functions, indexed as documents change, with CouchDB's collation of keys
  (`collation_key`), their query parameters and the builtin reduces (`_count`, `_sum`,
  `_stats`).

What it does not model: a cluster (no conflicting branches: `leaves` is the document itself, no
`_conflicts`, no `accepted` writes), attachments, `_local` documents, size limits, the
embedded store's quirks (docs/store-quirks.md), stale views (`freshness` is ignored: every read
is fresh), server administration (`provision` writes the databases `aso db init` makes), and
ICU's collation of strings (code-point order here: CouchDB puts "a" before "B"; ASO's keys are
ids, sites, users and dates, ASCII of one case where order matters). The contract test in
tests/test_memstore_contract.py runs one scenario on it and on the real store and compares.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aso.catalog import embedded as catalog
from aso.config import Config
from aso.monitoring import statistics
from aso.provision import designdocs
from aso.store import (
    ChangesBatch,
    Forbidden,
    NotFound,
    Server,
    Settings,
    StoreError,
    Unauthorized,
    ViewResult,
)
from aso.store.couchapi import Database
from aso.transfer.jobstore import SECURITY as JOBS_SECURITY
from tests.storejs import DesignDocument

KIND = "memory"
ADMIN = "_admin"
DESIGN = "_design/"
# The members of a document CouchDB takes beginning with `_` (any other is a 400).
SPECIAL = {"_id", "_rev", "_deleted", "_attachments", "_revisions", "_conflicts"}


def collation_key(value: Any) -> tuple[Any, ...]:
    """A key's place in CouchDB's view collation: null < false < true < numbers < strings <
    arrays (member by member, a prefix first) < objects (pair by pair, in their order).
    Strings by code point, where CouchDB uses ICU's collation (see the module's docstring)."""
    if value is None:
        return (0,)
    if value is False:
        return (1,)
    if value is True:
        return (2,)
    if isinstance(value, int | float):
        return (3, value)
    if isinstance(value, str):
        return (4, value)
    if isinstance(value, list):
        return (5, tuple(collation_key(v) for v in value))
    if isinstance(value, dict):
        return (6, tuple((collation_key(k), collation_key(v)) for k, v in value.items()))
    raise TypeError(f"not a JSON value: {value!r}")


def _copy(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A document as a client reads it: JSON, never the stored object."""
    return json.loads(json.dumps(doc))  # type: ignore[no-any-return]


@functools.cache
def _compiled(ddoc_json: str) -> DesignDocument:
    """One QuickJS context per distinct design document (compiling is the slow part)."""
    return DesignDocument(json.loads(ddoc_json))


@dataclass
class _View:
    """One view's index: the rows each document emitted, up to `seq`."""

    rows: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)
    seq: int = 0


@dataclass
class _Database:
    security: dict[str, Any]
    docs: dict[str, dict[str, Any]] = field(default_factory=dict)  # id → current revision
    seqs: dict[str, int] = field(default_factory=dict)  # id → sequence of its last change
    seq: int = 0
    designs: dict[str, DesignDocument] = field(default_factory=dict)
    views: dict[tuple[str, str], _View] = field(default_factory=dict)


class MemStore:
    """The databases, shared by every account's server; one lock and condition for all."""

    def __init__(self) -> None:
        self.dbs: dict[str, _Database] = {}
        self.changed = threading.Condition(threading.RLock())

    def server(self, name: str | None = None, roles: Sequence[str] = ()) -> MemServer:
        return MemServer(self, name, roles)

    def admin(self) -> MemServer:
        return self.server("admin", [ADMIN])

    def create_db(self, name: str, security: Mapping[str, Any]) -> None:
        with self.changed:
            self.dbs.setdefault(name, _Database(_copy(security)))

    def delete_db(self, name: str) -> None:
        with self.changed:
            self.dbs.pop(name, None)


def provision(store: MemStore, config: Config) -> None:
    """The databases `aso db init` makes for `config` (files, jobs, catalog, statistics), with
    their `_security` and design documents, written as the store admin; a database that
    exists already is left as it is."""
    admin = store.admin()
    for name, security, ddocs in (
        (config.store.files_db, designdocs.FILES_SECURITY, designdocs.design_documents(config)),
        (config.store.transfers_db, JOBS_SECURITY, [designdocs.database_design("jobs")]),
        (config.store.catalog_db, catalog.SECURITY, [designdocs.database_design("catalog")]),
        (config.store.stats_db, statistics.SECURITY, [designdocs.database_design("stats")]),
    ):
        if name in store.dbs:
            continue
        store.create_db(name, security)
        for ddoc in ddocs:
            admin.db(name).put(ddoc)


class MemServer(Server):
    """One account on a MemStore (its userCtx: name and roles)."""

    def __init__(self, store: MemStore, name: str | None, roles: Sequence[str]):
        self.store = store
        self.url = f"memory://{name or ''}"
        self.user = name or ""
        self.user_ctx = {"name": name, "roles": list(roles)}
        self.settings = Settings()
        self._kind = KIND
        self.client = None

    def info(self) -> dict[str, Any]:
        return {"couchdb": "Welcome", "version": KIND}

    def session(self) -> dict[str, Any]:
        return dict(self.user_ctx)

    def raw(self, method: str, path: str, **_: Any) -> Any:
        raise NotImplementedError(f"the in-memory store has no {method} {path}: data plane only")

    raw_answer = raw

    def db(self, name: str) -> MemDatabase:  # type: ignore[override]
        return MemDatabase(self, name)


class MemDatabase(Database):
    """One database as one account sees it. What couchapi.Database builds on its wire calls
    (bulk_write's results, write_decided's rounds, create, withdraw, keep_leaf, follow) is
    inherited; the wire calls are answered from memory."""

    server: MemServer

    def __init__(self, server: MemServer, name: str):
        self.server = server
        self.name = name
        self.client = None

    def __repr__(self) -> str:
        return f"MemDatabase({self.name} as {self.server.user or 'anonymous'})"

    # -- access -----------------------------------------------------------------------------
    @property
    def _lock(self) -> threading.Condition:
        return self.server.store.changed

    def _state(self) -> _Database:
        """This database, once the account is let in (the caller holds the lock)."""
        state = self.server.store.dbs.get(self.name)
        if state is None:
            raise NotFound(404, "not_found", "Database does not exist.", self.server.url)
        if not self._is_member(state):
            if self.server.user_ctx["name"] is None:
                raise Unauthorized(401, "unauthorized", "You are not authorized to access this db.")
            raise Forbidden(403, "forbidden", "You are not allowed to access this db.")
        return state

    def _in(self, state: _Database, part: str) -> bool:
        ctx = self.server.user_ctx
        allowed = state.security.get(part) or {}
        return ctx["name"] in (allowed.get("names") or []) or bool(
            set(ctx["roles"]) & set(allowed.get("roles") or [])
        )

    def _is_admin(self, state: _Database) -> bool:
        return ADMIN in self.server.user_ctx["roles"] or self._in(state, "admins")

    def _is_member(self, state: _Database) -> bool:
        members = state.security.get("members") or {}
        public = not members.get("names") and not members.get("roles")
        return public or self._is_admin(state) or self._in(state, "members")

    def info(self) -> dict[str, Any]:
        with self._lock:
            state = self._state()
            live = sum(not d.get("_deleted") for d in state.docs.values())
            return {
                "db_name": self.name,
                "doc_count": live,
                "doc_del_count": len(state.docs) - live,
                "update_seq": state.seq,
            }

    # -- reads ------------------------------------------------------------------------------
    def get(self, doc_id: str, *, conflicts: bool = False) -> dict[str, Any] | None:
        return self.get_many([doc_id])[doc_id]

    def get_many(
        self, ids: Iterable[str], *, conflicts: bool = False
    ) -> dict[str, dict[str, Any] | None]:
        with self._lock:
            try:
                state = self._state()
            except NotFound:  # as couchapi's get: a missing database holds no document
                return dict.fromkeys(ids)
            found = {doc_id: state.docs.get(doc_id) for doc_id in ids}
            return {
                doc_id: None if doc is None or doc.get("_deleted") else _copy(doc)
                for doc_id, doc in found.items()
            }

    def leaves(self, doc_id: str) -> list[dict[str, Any]]:
        doc = self.get(doc_id)  # one node: no conflicting branches
        return [doc] if doc else []

    def leaves_many(self, ids: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
        return {doc_id: [doc] if doc else [] for doc_id, doc in self.get_many(ids).items()}

    def all_docs(self, first: Any = None, last: Any = None, limit: Any = None, **_: Any) -> Any:
        """Live documents, design documents included, by id (`_all_docs` compares ids by their
        bytes, code-point order: the same as here)."""
        with self._lock:
            state = self._state()
            ids = sorted(
                doc_id
                for doc_id, doc in state.docs.items()
                if not doc.get("_deleted")
                and (first is None or doc_id >= first)
                and (last is None or doc_id <= last)
            )
            return [_copy(state.docs[doc_id]) for doc_id in ids[:limit]]

    # -- writes -----------------------------------------------------------------------------
    def put(self, doc: Mapping[str, Any]) -> str:
        [result] = self.bulk_write([doc])
        if not result.ok:
            raise result.as_error(self.server.url)
        assert result.rev is not None
        return result.rev

    def delete(self, doc_id: str, rev: str) -> str:
        if not rev:
            raise ValueError("delete() needs the revision being deleted")
        return self.put({"_id": doc_id, "_rev": rev, "_deleted": True})

    def _bulk_docs(self, docs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """`_bulk_docs`: each document written or refused on its own, in order."""
        with self._lock:
            state = self._state()
            answer = [self._write(state, _copy(doc)) for doc in docs]
            self._lock.notify_all()
            return answer

    def _write(self, state: _Database, doc: dict[str, Any]) -> dict[str, Any]:
        doc_id = doc.setdefault("_id", uuid.uuid4().hex)
        odd = sorted(k for k in doc if k.startswith("_") and k not in SPECIAL)
        if odd:
            return _refusal(doc_id, "doc_validation", f"Bad special document member: {odd[0]}")
        current = state.docs.get(doc_id)
        rev = doc.pop("_rev", None)
        if current is None:
            old, start = None, 0
        elif rev is None and current.get("_deleted"):
            old, start = None, int(current["_rev"].split("-")[0])  # created again
        else:
            old, start = current, int(current["_rev"].split("-")[0])
        if rev != (old or {}).get("_rev"):
            return _refusal(doc_id, "conflict", "Document update conflict.")
        refused = self._verdict(state, {**doc, "_rev": rev} if rev else doc, old)
        if refused is not None:
            return _refusal(doc_id, *refused)
        digest = hashlib.md5(json.dumps([rev, doc], sort_keys=True).encode()).hexdigest()
        new_rev = f"{start + 1}-{digest}"
        stored = {"_id": doc_id, "_rev": new_rev, **{k: v for k, v in doc.items() if k != "_id"}}
        if not stored.get("_deleted"):
            stored.pop("_deleted", None)
        state.seq += 1
        state.docs[doc_id] = stored
        state.seqs[doc_id] = state.seq
        if doc_id.startswith(DESIGN):
            state.designs.pop(doc_id, None)
            state.views = {k: v for k, v in state.views.items() if k[0] != doc_id}
            if not stored.get("_deleted"):
                body = {k: v for k, v in stored.items() if k != "_rev"}
                state.designs[doc_id] = _compiled(json.dumps(body, sort_keys=True))
        return {"id": doc_id, "ok": True, "rev": new_rev}

    def _verdict(
        self, state: _Database, doc: dict[str, Any], old: dict[str, Any] | None
    ) -> tuple[str, str] | None:
        """None, or the error and reason the store refuses `doc` with (over `old`)."""
        if doc["_id"].startswith(DESIGN):
            if self._is_admin(state):
                return None
            return "unauthorized", "You are not a db or server admin."
        ctx = {"db": self.name, **self.server.user_ctx}
        for design_id in sorted(state.designs):
            design = state.designs[design_id]
            if design.ddoc.get("validate_doc_update"):
                refused = design.verdict(doc, old, ctx, state.security)
                if refused is not None:
                    return refused
        return None

    # -- views ------------------------------------------------------------------------------
    def view(self, ddoc: str, name: str, **query: Any) -> ViewResult:
        """Documents.view, with its parameters (`freshness` aside: every read is fresh)."""
        include_docs = query.get("include_docs", False)
        keys, group, group_level = query.get("keys"), query.get("group"), query.get("group_level")
        with self._lock:
            state = self._state()
            design = state.designs.get(DESIGN + ddoc)
            if design is None or name not in design.ddoc.get("views", {}):
                reason = "missing" if design is None else "missing_named_view"
                raise NotFound(404, "not_found", reason, self.server.url)
            has_reduce = "reduce" in design.ddoc["views"][name]
            reducing = has_reduce if query.get("reduce") is None else query["reduce"]
            if reducing and not has_reduce:
                raise _bad_query("Reduce is invalid for map-only views.")
            if reducing and include_docs:
                raise _bad_query("`include_docs` is invalid for reduce")
            if reducing and keys is not None and not group and group_level is None:
                raise _bad_query("Multi-key fetches for reduce views must use `group=true`")
            index = self._index(state, DESIGN + ddoc, name, design)
            descending = query.get("descending", False)
            rows = sorted(
                ((collation_key(k), doc_id, k, v) for doc_id, r in index.items() for k, v in r),
                key=lambda row: (row[0], row[1]),
                reverse=descending,
            )
            total = len(rows)
            start, end = query.get("start_key"), query.get("end_key")
            if query.get("key") is not None:
                start = end = query["key"]
            rows = _selected(rows, keys, start, end, descending)
            if reducing:
                level = None if group else (0 if group_level is None else group_level)
                out = _reduced(design, name, rows, level)
            else:
                out = [{"id": doc_id, "key": k, "value": v} for _, doc_id, k, v in rows]
            out = out[query.get("skip") or 0 :][: query.get("limit")]
            if include_docs:
                for row in out:
                    linked = row["value"] if isinstance(row["value"], dict) else {}
                    doc = state.docs.get(linked.get("_id", row["id"]))
                    row["doc"] = None if doc is None or doc.get("_deleted") else _copy(doc)
            return ViewResult(rows=out, total_rows=None if reducing else total)

    def _index(
        self, state: _Database, ddoc_id: str, name: str, design: DesignDocument
    ) -> dict[str, list[tuple[Any, Any]]]:
        """The view's rows per document, brought up to date with what changed since."""
        view = state.views.setdefault((ddoc_id, name), _View())
        for doc_id, seq in state.seqs.items():
            if seq <= view.seq:
                continue
            doc = state.docs[doc_id]
            if doc.get("_deleted") or doc_id.startswith(DESIGN):
                view.rows.pop(doc_id, None)
                continue
            try:
                view.rows[doc_id] = design.map(name, doc)
            except Exception:  # CouchDB logs a map function's error and indexes nothing
                view.rows.pop(doc_id, None)
        view.seq = state.seq
        return view.rows

    # -- changes ------------------------------------------------------------------------------
    def changes(self, since: str = "0", **feed: Any) -> ChangesBatch:
        """Documents.changes, with its parameters (limit, include_docs, doc_ids, wait)."""
        after, limit, wait = int(since), feed.get("limit"), feed.get("wait")
        wanted = None if feed.get("doc_ids") is None else set(feed["doc_ids"])
        deadline = time.monotonic() + (wait or 0)
        with self._lock:
            while True:
                state = self._state()
                pending = sorted(
                    (seq, doc_id)
                    for doc_id, seq in state.seqs.items()
                    if seq > after and (wanted is None or doc_id in wanted)
                )
                left = deadline - time.monotonic()
                if pending or not wait or left <= 0:
                    break
                self._lock.wait(left)
            batch = pending[:limit] if limit is not None else pending
            results = []
            for seq, doc_id in batch:
                doc = state.docs[doc_id]
                change: dict[str, Any] = {"seq": seq, "id": doc_id}
                change["changes"] = [{"rev": doc["_rev"]}]
                if doc.get("_deleted"):
                    change["deleted"] = True
                if feed.get("include_docs"):
                    change["doc"] = _copy(doc)
                results.append(change)
            last = batch[-1][0] if len(batch) < len(pending) else max(state.seq, after)
            return ChangesBatch(results, str(last), timed_out=bool(wait) and not results)


def _refusal(doc_id: str, error: str, reason: str) -> dict[str, Any]:
    return {"id": doc_id, "error": error, "reason": reason}


def _bad_query(reason: str) -> StoreError:
    return StoreError(400, "query_parse_error", reason)


Row = tuple[Any, ...]  # a view row: its key's collation, the document's id, key, value


def _selected(rows: list[Row], keys: Any, start: Any, end: Any, descending: bool) -> list[Row]:
    """The rows (sorted, in the query's direction) the key parameters select."""
    if keys is not None:
        return [row for k in keys for row in rows if row[0] == collation_key(k)]
    low, high = (end, start) if descending else (start, end)
    return [
        row
        for row in rows
        if (low is None or row[0] >= collation_key(low))
        and (high is None or row[0] <= collation_key(high))
    ]


def _reduced(
    design: DesignDocument, name: str, rows: list[tuple[Any, ...]], level: int | None
) -> list[dict[str, Any]]:
    """Reduce rows: all into one (level 0), by the first `level` members of array keys, or by
    whole keys (level None: group=true)."""

    def grouped(row: tuple[Any, ...]) -> Any:
        k = row[2]
        if level == 0:
            return None
        return k[:level] if level is not None and isinstance(k, list) else k

    out = []
    for _, group in itertools.groupby(rows, key=lambda row: collation_key(grouped(row))):
        members = list(group)
        value = design.reduce(name, [row[3] for row in members])
        out.append({"key": grouped(members[0]), "value": value})
    return out
