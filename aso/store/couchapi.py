"""The CouchDB 3 HTTP API, the one place that speaks it: `Server` and `Database` (the
`Documents` of aso.store.api), on IBM's maintained CouchDB client (`ibmcloudant`), whose
requests session gives connection pooling; retries with exponential backoff and jitter on
connection errors, 429 and 5xx are urllib3's, mounted on that session. Each store quirk
(docs/store-quirks.md) is named where it is handled."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote, urlsplit

import requests
from ibm_cloud_sdk_core import ApiException
from ibm_cloud_sdk_core.authenticators import BasicAuthenticator, NoAuthAuthenticator
from ibmcloudant.cloudant_v1 import CloudantV1
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from aso import metrics
from aso.grid import gridenv
from aso.limits import MAX_DOCS, MAX_KEYS
from aso.store.api import (
    ACCEPTED_REASON,
    EMBEDDED,
    ERROR_CLASSES,
    RETRY_STATUSES,
    ChangesBatch,
    Conflict,
    Contested,
    Decided,
    Documents,
    NotFound,
    StoreError,
    StoreUnavailable,
    ViewResult,
    WriteResult,
    kind_of,
    refused_as_conflict,
    rev_order,
    too_large,
    withdrawal,
)

log = logging.getLogger("aso.store")

# EMBEDDED_NEEDS_CONTENT_TYPE: every body goes with its type
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
FEED_MARGIN = 2.0  # seconds a long poll may outlive its `timeout` before the client ends it


def _short(exc: BaseException) -> str:
    """The innermost cause of a connection error, on one line."""
    text = str(exc)
    for marker in ("Caused by ", "] "):
        if marker in text:
            text = text.rsplit(marker, 1)[-1]
    return text.strip("()'\" ")[:200]


def _count_conflict(url: str) -> None:
    """One more conflict in the store's metrics, for the route of `url`."""
    db, route = metrics.store_route(urlsplit(url).path)
    metrics.STORE_CONFLICTS.labels(db, route).inc()


def _from_api(exc: ApiException, url: str = "") -> StoreError:
    # EMBEDDED_ERROR_REASONS: the class comes from the status and `error`, never the reason
    body: dict[str, Any] = {}
    response = exc.http_response
    if response is not None:
        try:
            parsed = response.json()
            body = parsed if isinstance(parsed, dict) else {}
        except ValueError:
            body = {}
    error = str(body.get("error") or exc.message or "error")
    reason = str(body.get("reason") or "")
    if exc.status_code == 403 and refused_as_conflict(error, reason):
        if response is not None:  # the response hook counted a 403, not a conflict
            _count_conflict(response.request.url or "")
        return Conflict(409, "conflict", reason, url)
    cls = ERROR_CLASSES.get(exc.status_code, StoreError)
    return cls(exc.status_code, error, reason, url)


@dataclass
class Settings:
    """How the client talks to the store (filled from the [store] section of the config)."""

    connect_timeout: float = 5.0
    read_timeout: float = 120.0
    retries: int = 5
    backoff: float = 0.5
    backoff_max: float = 30.0
    pool_size: int = 16
    feed_timeout: float = 30.0

    @classmethod
    def of(cls, store: Any) -> Settings:
        """From the [store] section of the config."""
        return cls(
            connect_timeout=store.connect_timeout,
            read_timeout=store.read_timeout,
            retries=store.retries,
            backoff=store.backoff,
            backoff_max=store.backoff_max,
            pool_size=store.pool_size,
            feed_timeout=store.feed_timeout,
        )


def _session(
    settings: Settings, retries: int, read_retries: int, status_retries: int
) -> requests.Session:
    retry = Retry(
        total=retries,
        connect=retries,
        read=read_retries,
        status=status_retries,
        backoff_factor=settings.backoff,
        backoff_max=settings.backoff_max,
        backoff_jitter=settings.backoff / 2,
        status_forcelist=RETRY_STATUSES,
        # Writes are retried too: a repeated write with the revision it read can only end in a
        # 409, which callers treat as "someone else got there"; a create is idempotent by id.
        allowed_methods=None,
        raise_on_status=False,
        respect_retry_after_header=True,
    )
    adapter = HTTPAdapter(
        pool_connections=2, pool_maxsize=settings.pool_size, max_retries=retry, pool_block=False
    )
    session = requests.Session()
    session.hooks["response"].append(metrics.observe_store_response)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class Server:
    """A CouchDB-API server, as one account (admin, agent or user)."""

    def __init__(
        self,
        url: str,
        user: str = "",
        password: str = "",
        settings: Settings | None = None,
        *,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
    ):
        """`cert`: an X.509 client credential (a proxy file, or certificate and key) for the
        front end, which then knows who this is: user and password are not sent."""
        self.url = url.rstrip("/")
        self.user = "" if cert else user
        self.settings = settings or Settings()
        self._password = password
        self._kind: str | None = None
        self._verify, self._cert = verify, cert
        self.client = self._client(self.settings.read_timeout, verify, read_retries=True)
        self._feed_client: CloudantV1 | None = None
        self._single_shot_client: CloudantV1 | None = None

    def _client(
        self,
        read_timeout: float | None,
        verify: bool | str,
        *,
        read_retries: bool,
        status_retries: bool = True,
    ) -> CloudantV1:
        auth = BasicAuthenticator(self.user, self._password) if self.user else NoAuthAuthenticator()
        client = CloudantV1(authenticator=auth)
        client.set_service_url(self.url)
        # EMBEDDED_GZIP_BODIES: the client library gzips request bodies by default; some
        # embedded-store routes (/_config) do not inflate them.
        client.set_enable_gzip_compression(False)
        retries = self.settings.retries
        client.set_http_client(
            _session(
                self.settings,
                retries,
                retries if read_retries else 0,
                retries if status_retries else 0,
            )
        )
        config: dict[str, Any] = {}
        if read_timeout is not None:
            config["timeout"] = (self.settings.connect_timeout, read_timeout)
        if verify is not True:
            config["verify"] = verify
        if self._cert:
            config["cert"] = self._cert
        client.set_http_config(config)
        return client

    @property
    def feed_client(self) -> CloudantV1:
        """A second client for long polls: no read retries (a poll cut by its read timeout is
        simply over) and no fixed read timeout (each poll passes its own)."""
        if self._feed_client is None:
            self._feed_client = self._client(None, self._verify, read_retries=False)
        return self._feed_client

    @property
    def single_shot_client(self) -> CloudantV1:
        """A client that does not repeat a request the store answered with a 5xx (it still
        retries connection errors): for answers that a retry cannot change."""
        if self._single_shot_client is None:
            self._single_shot_client = self._client(
                self.settings.read_timeout, self._verify, read_retries=True, status_retries=False
            )
        return self._single_shot_client

    @classmethod
    def from_config(cls, config: Any, *, account: str = "user") -> Server:
        """`account`: "admin" (server admin), "agent" (agent account) or "user" (everyday)."""
        store = config.store
        user, password = {
            "admin": (store.admin_user, store.admin_password),
            "agent": (store.agent_user, store.agent_password),
            "user": config.store_user,
        }[account]
        settings = Settings.of(store)
        if store.auth == "x509":
            # Through the front end: the certificate says who this is, whatever the account.
            path = config.path
            credential = gridenv.client_credential(
                str(path(store.x509_proxy)) if store.x509_proxy else "",
                str(path(store.x509_cert)) if store.x509_cert else "",
                str(path(store.x509_key)) if store.x509_key else "",
            )
            capath = gridenv.ca_directory(
                str(path(store.x509_cert_dir)) if store.x509_cert_dir else ""
            )
            return cls(store.url, settings=settings, verify=capath, cert=credential)
        return cls(store.url, user, password, settings)

    # -- calling ------------------------------------------------------------------------------
    def call(self, fn: Any, *args: Any, _poll: bool = False, **kwargs: Any) -> Any:
        """Run one client-library call, turning its failures into StoreError subclasses
        (`_poll`: a long poll, which the client's read timeout may end as planned)."""
        try:
            return fn(*args, **kwargs).get_result()
        except ApiException as exc:
            raise _from_api(exc, self.url) from None
        except requests.exceptions.Timeout as exc:
            if not _poll:
                metrics.STORE_UNAVAILABLE.inc()
            raise StoreUnavailable(self.url, f"timed out ({_short(exc)})") from None
        except requests.exceptions.RequestException as exc:
            metrics.STORE_UNAVAILABLE.inc()
            raise StoreUnavailable(self.url, _short(exc)) from None

    def raw(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        client: CloudantV1 | None = None,
        timeout: tuple[float, float] | None = None,
        poll: bool = False,
    ) -> Any:
        """A request the typed API lacks, through the same pooled, retrying session (`poll`: a
        long poll that our read timeout may end)."""
        client = client or self.client
        data = None if body is None else json.dumps(body)
        request = client.prepare_request(
            method, path, headers=dict(JSON_HEADERS), params=dict(params or {}), data=data
        )
        extra = {"timeout": timeout} if timeout else {}
        return self.call(lambda: client.send(request, **extra), _poll=poll)

    def raw_answer(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None, body: Any = None
    ) -> tuple[int, Any]:
        """As `raw`, with the HTTP status of the answer (201 or 202 for a write)."""
        data = None if body is None else json.dumps(body)
        request = self.client.prepare_request(
            method, path, headers=dict(JSON_HEADERS), params=dict(params or {}), data=data
        )
        answer: list[int] = []

        def send() -> Any:
            response = self.client.send(request)
            answer.append(response.get_status_code())
            return response

        result = self.call(send)
        return answer[-1], result

    # -- server -------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.call(self.client.get_server_information))

    @property
    def kind(self) -> str:
        """COUCHDB or EMBEDDED, from the welcome message (asked once)."""
        if self._kind is None:
            self._kind = kind_of(self.info())
        return self._kind

    def session(self) -> dict[str, Any]:
        """The userCtx the store gives these credentials."""
        return cast(dict[str, Any], self.raw("GET", "/_session").get("userCtx", {}))

    def is_admin(self) -> bool:
        return "_admin" in (self.session().get("roles") or [])

    def db(self, name: str) -> Database:
        return Database(self, name)


class Database:
    """One database of a Server."""

    def __init__(self, server: Server, name: str):
        self.server = server
        self.name = name
        self.client = server.client

    def __repr__(self) -> str:
        return f"Database({self.server.url}/{self.name})"

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        return self.server.call(fn, db=self.name, **kwargs)

    def info(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._call(self.client.get_database_information))

    def exists(self) -> bool:
        try:
            self.info()
            return True
        except NotFound:
            return False

    # -- single documents -------------------------------------------------------------------
    def get(self, doc_id: str, *, conflicts: bool = False) -> dict[str, Any] | None:
        """One document (a cluster's quorum read), or None; `conflicts`: with the `_conflicts`
        revisions of it (CLUSTER_CONFLICTING_BRANCHES)."""
        params = {"conflicts": "true"} if conflicts else None
        try:
            path = f"/{quote(self.name, safe='')}/{_doc_path(doc_id)}"
            return cast(dict[str, Any], self.server.raw("GET", path, params=params))
        except NotFound:
            return None

    def put(self, doc: Mapping[str, Any]) -> str:
        """Write one document (with `_rev` to update); returns the new revision. Contested (a
        Conflict) when a cluster stored it below its quorum (CLUSTER_ACCEPTED_IS_NOT_WON)."""
        status, result = self.server.raw_answer(
            "PUT", f"/{quote(self.name, safe='')}/{_doc_path(doc['_id'])}", body=dict(doc)
        )
        if status == 202:
            metrics.count_contested(self.name)
            self.withdraw_if_beaten(doc["_id"], result.get("rev", ""))
            raise Contested(self.server.url, result.get("rev"))
        return cast(str, result["rev"])

    # -- a cluster's conflicting branches -------------------------------------------------------
    def leaves(self, doc_id: str) -> list[dict[str, Any]]:
        """Every live leaf revision of a document (`open_revs=all`): one, unless two writers
        of a cluster both stored an edit of the same revision (CLUSTER_CONFLICTING_BRANCHES)."""
        answer = self.server.raw(
            "GET",
            f"/{quote(self.name, safe='')}/{_doc_path(doc_id)}",
            params={"open_revs": "all", "latest": "true"},
        )
        docs = [item["ok"] for item in answer if isinstance(item, dict) and "ok" in item]
        return [d for d in docs if not d.get("_deleted")]

    def leaves_many(self, ids: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
        """`leaves` of many documents: `_bulk_get` naming no revision answers every leaf of
        each (a cluster's quorum `open_revs=all`), one request per MAX_KEYS documents."""
        wanted = list(dict.fromkeys(ids))
        found: dict[str, list[dict[str, Any]]] = {doc_id: [] for doc_id in wanted}
        for start in range(0, len(wanted), MAX_KEYS):
            body = {"docs": [{"id": doc_id} for doc_id in wanted[start : start + MAX_KEYS]]}
            answer = self.server.raw("POST", f"/{quote(self.name, safe='')}/_bulk_get", body=body)
            for result in answer.get("results", []):
                for item in result.get("docs", []):
                    doc = item.get("ok") if isinstance(item, dict) else None
                    if doc and not doc.get("_deleted") and doc.get("_id") in found:
                        found[doc["_id"]].append(doc)
        return found

    def withdraw_if_beaten(self, doc_id: str, rev: str) -> bool:
        """CLUSTER_ACCEPTED_IS_NOT_WON: our revision `rev` was stored below the quorum. If
        another live leaf beats it in CouchDB's order (the one that picks the winner), it is
        withdrawn (deleted: a deleted leaf never wins), so that the other writer's edit stays
        the document. A revision nothing beats is kept, whatever others see: the best leaf of
        all never withdraws itself, so a document never loses all its leaves. True if
        withdrawn."""
        try:
            leaves = self.leaves(doc_id)
        except StoreError as exc:
            log.warning("contested write of %s/%s: leaves not read (%s)", self.name, doc_id, exc)
            return False
        if not any(d["_rev"] == rev for d in leaves):
            return False
        if max(leaves, key=lambda d: rev_order(d["_rev"]))["_rev"] == rev:
            return False
        try:
            [result] = self.bulk_write([withdrawal(doc_id, rev)])
        except StoreError as exc:
            log.warning("contested revision %s of %s not withdrawn: %s", rev, doc_id, exc)
            return False
        if not (result.ok or result.accepted):  # a tombstone stored below the quorum is one too
            log.warning("contested revision %s of %s not withdrawn: %s", rev, doc_id, result)
            return False
        log.info(
            "contested revision %s of %s/%s withdrawn: another beats it", rev, self.name, doc_id
        )
        return True

    def withdraw(self, branches: Mapping[str, Sequence[str]]) -> int:
        """CLUSTER_CONFLICTING_BRANCHES: withdraw (delete) the revisions `branches` names per
        document, e.g. the `_conflicts` of documents being purged: a branch left behind would
        become the document once its winner is gone. Returns how many were withdrawn."""
        pending = {doc_id: list(revs) for doc_id, revs in branches.items() if revs}
        withdrawn = 0
        while pending:  # one revision per document and call: bulk_write takes distinct ids
            batch = [withdrawal(doc_id, revs.pop()) for doc_id, revs in pending.items()]
            withdrawn += sum(r.ok or r.accepted for r in self.bulk_write(batch))
            pending = {doc_id: revs for doc_id, revs in pending.items() if revs}
        return withdrawn

    def keep_leaf(self, doc_id: str, keep: str, leaves: Sequence[Mapping[str, Any]]) -> int:
        """CLUSTER_CONFLICTING_BRANCHES: withdraw every live leaf of `leaves` but `keep`; a leaf
        that changed meanwhile is a conflict and stays. Returns how many were withdrawn."""
        return self.withdraw({doc_id: [d["_rev"] for d in leaves if d["_rev"] != keep]})

    def create(self, doc: Mapping[str, Any]) -> str:
        """Create a document; Conflict if its id exists (the caller's duplicate). Always by id
        (COUCHDB_POST_IGNORES_REV: a POST without one drops the `_rev` on CouchDB)."""
        if "_rev" in doc:
            raise ValueError("create() takes a document without _rev")
        return self.put(doc)

    def delete(self, doc_id: str, rev: str) -> str:
        """Delete a revision (EMBEDDED_DELETE_WITHOUT_REV: the revision is required)."""
        if not rev:
            raise ValueError("delete() needs the revision being deleted")
        try:
            result = self.server.raw(
                "DELETE", f"/{quote(self.name, safe='')}/{_doc_path(doc_id)}", params={"rev": rev}
            )
        except NotFound:
            # EMBEDDED_DELETE_WRONG_REV_404: a stale revision of a live document is a conflict.
            if self.get(doc_id) is not None:
                raise Conflict(409, "conflict", "Document update conflict.") from None
            raise
        return cast(str, result["rev"])

    # -- bulk -----------------------------------------------------------------------------------
    def get_many(
        self, ids: Iterable[str], *, conflicts: bool = False
    ) -> dict[str, dict[str, Any] | None]:
        """{id: document or None} for every id, in one `_all_docs` request (`conflicts`: with
        the `_conflicts` revisions of each, CLUSTER_CONFLICTING_BRANCHES)."""
        wanted = list(dict.fromkeys(ids))
        extra = {"conflicts": True} if conflicts else {}
        found: dict[str, dict[str, Any] | None] = dict.fromkeys(wanted)
        for start in range(0, len(wanted), MAX_KEYS):
            keys = wanted[start : start + MAX_KEYS]
            result = self._call(self.client.post_all_docs, keys=keys, include_docs=True, **extra)
            for row in result["rows"]:
                if row.get("doc") and not row.get("value", {}).get("deleted"):
                    found[row["key"]] = row["doc"]
        return found

    def all_docs(
        self,
        first: str | None = None,
        last: str | None = None,
        limit: int | None = None,
        *,
        conflicts: bool = False,
    ) -> list[dict[str, Any]]:
        """The documents whose ids run from `first` to `last` (inclusive; from the first or to
        the last id when not given), in id order; `conflicts`: with the `_conflicts` revisions
        of each (CLUSTER_CONFLICTING_BRANCHES)."""
        result = self._call(
            self.client.post_all_docs,
            start_key=first,
            end_key=last,
            include_docs=True,
            limit=limit,
            conflicts=conflicts or None,
        )
        return [row["doc"] for row in result["rows"] if row.get("doc")]

    def _bulk_docs(self, docs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """`_bulk_docs` of at most MAX_DOCS documents each (the front end's bound, whoever
        writes; COUCHDB_BULK_NOT_ATOMIC: a batch may be written in part, so writers are
        idempotent); a body over the store's request size (413, nothing written:
        COUCHDB_REQUEST_SIZE_LIMIT) is sent again in two halves. A document too large alone
        (COUCHDB_DOCUMENT_SIZE_LIMIT) is that document's error only, as a refusal is: the
        others of the write are written."""
        if len(docs) > MAX_DOCS:
            return [
                answer
                for start in range(0, len(docs), MAX_DOCS)
                for answer in self._bulk_docs(docs[start : start + MAX_DOCS])
            ]
        try:
            answer = self._call(
                self.client.post_bulk_docs, bulk_docs={"docs": [dict(d) for d in docs]}
            )
        except StoreError as exc:
            if exc.status != 413:
                raise
            if len(docs) < 2:
                return [too_large(docs[0], exc)]
            half = len(docs) // 2
            return self._bulk_docs(docs[:half]) + self._bulk_docs(docs[half:])
        return cast(list[dict[str, Any]], answer)

    def bulk_write(self, docs: Sequence[Mapping[str, Any]]) -> list[WriteResult]:
        """Write documents in one `_bulk_docs` (in halves if the store finds the body too
        large); one WriteResult per document, in input order.

        A refused document (conflict, forbidden) does not stop the others. Ids must be unique
        within one call: results are matched by id (EMBEDDED_BULK_RESULT_ORDER).
        """
        if not docs:
            return []
        ids = [doc.get("_id") for doc in docs]
        if None in ids or len(set(ids)) != len(ids):
            raise ValueError("bulk_write needs documents with distinct _id")
        answer = self._bulk_docs(docs)
        by_id = {item.get("id"): item for item in answer}
        results = []
        for doc_id in cast(list[str], ids):  # no None: refused above
            item = by_id.get(doc_id)
            if item is None:
                results.append(WriteResult(doc_id, False, error="missing", reason="no result"))
            elif refused_as_conflict(item.get("error"), item.get("reason")):
                # EMBEDDED_VALIDATES_BEFORE_CONFLICT: CouchDB's conflict, as CouchDB answers it
                results.append(
                    WriteResult(doc_id, False, error="conflict", reason=item.get("reason"))
                )
            elif item.get("error"):
                results.append(
                    WriteResult(doc_id, False, error=item["error"], reason=item.get("reason"))
                )
            elif item.get("accepted"):  # CLUSTER_ACCEPTED_IS_NOT_WON
                metrics.count_contested(self.name)
                results.append(
                    WriteResult(
                        doc_id,
                        False,
                        rev=item.get("rev"),
                        error="conflict",
                        reason=ACCEPTED_REASON,
                        accepted=True,
                    )
                )
            else:
                results.append(WriteResult(doc_id, True, rev=item.get("rev")))
        metrics.count_bulk_conflicts(self.name, sum(r.conflict for r in results))
        for result in results:
            if result.accepted and result.rev:
                self.withdraw_if_beaten(result.id, result.rev)
        return results

    def write_decided(
        self,
        docs: Sequence[Mapping[str, Any]],
        decide: Callable[[dict[str, Any]], dict[str, Any] | None],
        rounds: int = 5,
    ) -> Decided:
        """Write `decide(doc)` for each document (None: leave it alone), in bulk. A document that
        conflicts (someone else wrote it since it was read: another agent on another axis) is
        read again and decided again, up to `rounds` times, so that one agent's write never
        undoes another's and is not lost to it either."""
        outcome = Decided()
        pending = [dict(d) for d in docs]
        for _ in range(rounds):
            updates = []
            for doc in pending:
                update = decide(doc)
                if update is None:
                    outcome.declined.append(doc)
                else:
                    updates.append(update)
            conflicts = []
            for update, result in zip(updates, self.bulk_write(updates), strict=True):
                if result.ok:
                    outcome.written.append(dict(update, _rev=result.rev))
                elif result.conflict:
                    conflicts.append(result.id)
                else:
                    outcome.refused.append(result)
            if not conflicts:
                return outcome
            fresh = self.get_many(conflicts)
            outcome.gone.extend(i for i, d in fresh.items() if d is None)
            pending = [d for d in fresh.values() if d is not None]
        outcome.conflicted.extend(d["_id"] for d in pending)
        return outcome

    # -- views ------------------------------------------------------------------------------------
    def view(
        self,
        ddoc: str,
        name: str,
        *,
        key: Any = None,
        keys: Sequence[Any] | None = None,
        start_key: Any = None,
        end_key: Any = None,
        limit: int | None = None,
        skip: int | None = None,
        include_docs: bool = False,
        descending: bool = False,
        reduce: bool | None = None,
        group: bool | None = None,
        group_level: int | None = None,
        freshness: str = "fresh",
    ) -> ViewResult:
        """Query a view. `freshness`: "fresh" (update the index first), "stale" (read the index
        as it is) or "lazy" (read as it is, then update in the background). Pages are cut by key
        ranges (EMBEDDED_NO_STARTKEY_DOCID)."""
        params: dict[str, Any] = {}
        for pname, value in (("key", key), ("start_key", start_key), ("end_key", end_key)):
            if value is not None:
                params[pname] = value
        if keys is not None:
            params["keys"] = list(keys)
        if limit is not None:
            params["limit"] = limit
        if skip:
            params["skip"] = skip
        if include_docs:
            params["include_docs"] = True
        if descending:
            params["descending"] = True
        # EMBEDDED_MAP_ONLY_REDUCE: only what the caller asked for.
        for pname, value in (("reduce", reduce), ("group", group), ("group_level", group_level)):
            if value is not None:
                params[pname] = value
        query = self._freshness(freshness)
        path = f"/{quote(self.name, safe='')}/{_doc_path('_design/' + ddoc)}/_view/{quote(name)}"
        result = self.server.raw("POST", path, params=query, body=params)
        return ViewResult(rows=result.get("rows", []), total_rows=result.get("total_rows"))

    def _freshness(self, freshness: str) -> dict[str, str]:
        if freshness == "fresh":
            return {}
        if freshness not in ("stale", "lazy"):
            raise ValueError("freshness is fresh, stale or lazy")
        if self.server.kind == EMBEDDED:  # EMBEDDED_STALE_PARAM
            return {"stale": "ok" if freshness == "stale" else "update_after"}
        return {"stable": "true", "update": "false" if freshness == "stale" else "lazy"}

    # -- changes ----------------------------------------------------------------------------
    def changes(
        self,
        since: str = "0",
        *,
        limit: int | None = None,
        include_docs: bool = False,
        doc_ids: Sequence[str] | None = None,
        wait: float | None = None,
    ) -> ChangesBatch:
        """One batch of the `_changes` feed after `since`.

        `wait`: seconds to wait for a change when there is none (a long poll). The store may not
        end the poll itself (EMBEDDED_FEED_NEVER_TIMES_OUT): the client's read timeout does, and
        an empty batch with the same `since` is returned. No server-side filters other than
        `doc_ids` (EMBEDDED_CHANGES_FILTER_CRASH). Sequences are opaque and a batch has no
        order (EMBEDDED_CHANGES_ORDER, CLUSTER_SHARD_INTERLEAVED_FEEDS): readers are idempotent.
        """
        params: dict[str, Any] = {"since": str(since)}
        body: dict[str, Any] = {}
        if limit is not None:
            params["limit"] = limit
        if include_docs:
            params["include_docs"] = "true"
        if doc_ids is not None:
            params["filter"] = "_doc_ids"
            body["doc_ids"] = list(doc_ids)
        path = f"/{quote(self.name, safe='')}/_changes"
        if not wait:
            filtered = doc_ids is not None and self.server.kind == EMBEDDED
            head = str(self.info()["update_seq"]) if filtered else None
            result = self.server.raw("POST", path, params=params, body=body)
            results, last_seq = result.get("results", []), str(result.get("last_seq", since))
            return ChangesBatch(results, _settled(last_seq, head, results))
        wait = min(wait, self.server.settings.feed_timeout)
        params.update(feed="longpoll", timeout=int(wait * 1000))
        try:
            result = self.server.raw(
                "POST",
                path,
                params=params,
                body=body,
                client=self.server.feed_client,
                timeout=(self.server.settings.connect_timeout, wait + FEED_MARGIN),
                poll=True,
            )
        except StoreUnavailable:
            # The poll was cut by our read timeout (or the connection dropped): if the store
            # answers, there was simply no change; the caller asks again from the same `since`.
            if _answers(self.server):
                return ChangesBatch([], str(since), timed_out=True)
            raise
        # CouchDB ends a quiet poll itself at `timeout`: an empty batch, timed out as well.
        results = result.get("results", [])
        return ChangesBatch(results, str(result.get("last_seq", since)), timed_out=not results)

    def follow(
        self,
        since: str = "0",
        *,
        batch: int = 1000,
        include_docs: bool = True,
        wait: float | None = None,
    ) -> Iterator[ChangesBatch]:
        """Batches of changes from `since` onwards, forever (with `wait`) or until caught up."""
        while True:
            result = self.changes(since, limit=batch, include_docs=include_docs, wait=wait)
            since = result.last_seq
            if result.results or wait:
                yield result
            if not result.results and not wait:
                return


def _answers(server: Server) -> bool:
    try:
        server.info()
        return True
    except StoreError:
        return False


def _doc_path(doc_id: str) -> str:
    if doc_id.startswith("_design/"):
        return "_design/" + quote(doc_id.removeprefix("_design/"), safe="")
    return quote(doc_id, safe="")


def _is_documents(db: Database) -> Documents:
    """(For the type checker: a Database is the `Documents` of aso.store.api.)"""
    return db


def _settled(last_seq: str, head: str | None, results: list[dict[str, Any]]) -> str:
    """EMBEDDED_FILTERED_LAST_SEQ: a filtered batch that found nothing ends at least at `head`,
    the database's sequence read before it (numbers there: EMBEDDED_INTEGER_SEQ)."""
    if head is None or results or not (head.isdigit() and last_seq.isdigit()):
        return last_seq
    return str(max(int(head), int(last_seq)))
