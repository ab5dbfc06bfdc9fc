"""What every module sees of the document store: the `Documents` interface a database offers,
its results and its errors (aso.store.couchapi implements it over the CouchDB 3 HTTP API)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from aso.model import WITHDRAWN

COUCHDB = "couchdb"
EMBEDDED = "pouchdb-server"
RETRY_STATUSES = (429, 500, 502, 503, 504)


# --- errors ----------------------------------------------------------------------------------
class StoreError(Exception):
    """The store answered with an error (status, CouchDB `error` and `reason`)."""

    def __init__(self, status: int, error: str, reason: str = "", url: str = ""):
        self.status, self.error, self.reason, self.url = status, error, reason, url
        super().__init__(f"{status} {error}: {reason}" if reason else f"{status} {error}")

    @property
    def retryable(self) -> bool:
        """The same call may succeed later: the store unreachable (0), overloaded or failing
        (408, 429, 5xx), or out of space (507; CouchDB answers a full disk with a 500, then
        stops: COUCHDB_STOPS_ON_FULL_DISK)."""
        return self.status in (0, 408, *RETRY_STATUSES, 507)


class StoreUnavailable(StoreError):
    """The store could not be reached (after the configured retries)."""

    def __init__(self, url: str, detail: str):
        super().__init__(0, "unavailable", f"cannot reach the store at {url}: {detail}", url)

    def __str__(self) -> str:
        return self.reason


class Unauthorized(StoreError):
    pass


class Forbidden(StoreError):
    pass


class NotFound(StoreError):
    pass


class Conflict(StoreError):
    pass


class Contested(Conflict):
    """CLUSTER_ACCEPTED_IS_NOT_WON: the write was stored by fewer copies than the cluster's
    quorum (HTTP 202, `accepted`): another writer of the same revision may have won. Treated as
    a conflict: the writer does not act on it."""

    def __init__(self, url: str = "", rev: str | None = None):
        super().__init__(409, "conflict", ACCEPTED_REASON, url)
        self.rev = rev


ACCEPTED_REASON = "accepted by fewer copies than the quorum: another writer may have won"


ERROR_CLASSES = {401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict}
# EMBEDDED_VALIDATES_BEFORE_CONFLICT: how the validation's refusal of a write based on another
# revision than the current one begins (CouchDB answers such a write 409 before validating).
# EMBEDDED_PREDICTABLE_REVS: a revision is echoed back, never relied on to be unguessable.
CONFLICT_REFUSAL = "[conflict] "


def refused_as_conflict(error: str | None, reason: str | None) -> bool:
    """A `forbidden` answer that is the validation's conflict (a 409 on CouchDB)."""
    return error == "forbidden" and (reason or "").startswith(CONFLICT_REFUSAL)


# A bulk write's per-document `error`, with the status a single write of that document answers.
BULK_ERROR_STATUS = {
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "too_large": 413,
    "document_too_large": 413,
}


def too_large(doc: Mapping[str, Any], exc: StoreError) -> dict[str, Any]:
    """The `_bulk_docs` result of a document the store refused as too large (413)."""
    return {"id": doc.get("_id"), "error": exc.error or "too_large", "reason": exc.reason}


@dataclass(frozen=True)
class WriteResult:
    """Outcome of one document of a bulk write."""

    id: str
    ok: bool
    rev: str | None = None
    error: str | None = None  # conflict, forbidden, unauthorized, ...
    reason: str | None = None
    # CLUSTER_ACCEPTED_IS_NOT_WON: stored (as `rev`) by fewer copies than the quorum: reported
    # as a conflict, not ok, so that no caller acts on it.
    accepted: bool = False

    @property
    def conflict(self) -> bool:
        return self.error == "conflict"

    def as_error(self, url: str = "") -> StoreError:
        """This document's failure as the error a single write of it raises (same status, class
        and text: "403 forbidden: reason"), so that a refusal reads the same whichever way it
        came. An error the store names nothing else becomes 400: the write is not retried."""
        error = self.error or "error"
        status = BULK_ERROR_STATUS.get(error, 400)
        return ERROR_CLASSES.get(status, StoreError)(status, error, self.reason or "", url)


@dataclass
class Decided:
    """Outcome of `Database.write_decided`."""

    written: list[dict[str, Any]] = field(default_factory=list)  # as written, with the new _rev
    declined: list[dict[str, Any]] = field(default_factory=list)  # fresh docs decided against
    gone: list[str] = field(default_factory=list)  # deleted meanwhile
    refused: list[WriteResult] = field(default_factory=list)  # forbidden and other errors
    conflicted: list[str] = field(default_factory=list)  # still in conflict after every round

    @property
    def not_written(self) -> list[str]:
        return (
            [d["_id"] for d in self.declined]
            + self.gone
            + [r.id for r in self.refused]
            + self.conflicted
        )


@dataclass
class ChangesBatch:
    results: list[dict[str, Any]]
    last_seq: str  # opaque (EMBEDDED_INTEGER_SEQ)
    timed_out: bool = False


@dataclass
class ViewResult:
    rows: list[dict[str, Any]]
    total_rows: int | None = None

    def docs(self) -> list[dict[str, Any]]:
        return [row["doc"] for row in self.rows if row.get("doc")]


class Documents(Protocol):
    """One database's documents, as the agents, the front end's helpers and the CLI use them
    (aso.store.Database; docs/store-quirks.md for what each store does differently)."""

    name: str

    def get(self, doc_id: str, *, conflicts: bool = False) -> dict[str, Any] | None: ...

    def get_many(
        self, ids: Iterable[str], *, conflicts: bool = False
    ) -> dict[str, dict[str, Any] | None]: ...

    def put(self, doc: Mapping[str, Any]) -> str: ...

    def bulk_write(self, docs: Sequence[Mapping[str, Any]]) -> list[WriteResult]: ...

    def write_decided(
        self,
        docs: Sequence[Mapping[str, Any]],
        decide: Callable[[dict[str, Any]], dict[str, Any] | None],
        rounds: int = 5,
    ) -> Decided: ...

    def all_docs(
        self,
        first: str | None = None,
        last: str | None = None,
        limit: int | None = None,
        *,
        conflicts: bool = False,
    ) -> list[dict[str, Any]]: ...

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
    ) -> ViewResult: ...

    def changes(
        self,
        since: str = "0",
        *,
        limit: int | None = None,
        include_docs: bool = False,
        doc_ids: Sequence[str] | None = None,
        wait: float | None = None,
    ) -> ChangesBatch: ...

    def follow(
        self,
        since: str = "0",
        *,
        batch: int = 1000,
        include_docs: bool = True,
        wait: float | None = None,
    ) -> Iterator[ChangesBatch]: ...


def withdrawal(doc_id: str, rev: str) -> dict[str, Any]:
    """The deletion of one branch of a conflict (an agent may make it: `withdrawn`)."""
    return {"_id": doc_id, "_rev": rev, "_deleted": True, "withdrawn": WITHDRAWN}


def rev_order(rev: str) -> tuple[int, str]:
    """A revision's place in CouchDB's choice of a winner among live leaves: the longest
    revision path, then the greatest revision hash (docs: replication/conflicts.html)."""
    number, _, digest = rev.partition("-")
    try:
        return int(number), digest
    except ValueError:
        return 0, rev


def content_signature(doc: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def kind_of(welcome: Mapping[str, Any]) -> str:
    """COUCHDB or EMBEDDED, from the answer to `GET /`."""
    return EMBEDDED if "express-pouchdb" in welcome else COUCHDB


def redact(url: str) -> str:
    """A store URL fit for logs and messages (no credentials)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"
