"""What the X.509 front end lets through to the store, decided before anything is forwarded.

Users, clients and agents need the databases' documents, views and feeds, and a few server
resources (`/`, `/_session`, `/_all_dbs`, `/_uuids`, `/_up`). Store administration (creating or
deleting databases, compaction, `_config`, replication, accounts, `_local` documents, which
validate_doc_update never sees) is done on the store's own loopback port with its admin account,
never through the front end: sent by a non-admin, several of these requests even kill the
embedded store (EMBEDDED_CRASH_ON_NON_ADMIN_DB_CREATE, EMBEDDED_CRASH_ON_NON_ADMIN_MAINTENANCE).

Bodies of writes must be JSON that the store can judge: the embedded store answers 500 (or
crashes) on a document that is not an object, a non-string `_id`, an unknown `_` member, or a
`_bulk_docs` entry that is not an object (EMBEDDED_500_ON_MALFORMED_DOCS), and it stores a
document without its members named `__proto__` (EMBEDDED_DROPS_PROTO_MEMBERS). Each refusal is an
HTTP answer in CouchDB's shape with a reason: 400 bad body or path, 403 not served here, 405
method.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

METHODS = (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE")
READS = (b"GET", b"HEAD")
# Server resources a client may read; everything else at the top is the store's administration.
SERVER_READS = (b"", b"_session", b"_all_dbs", b"_uuids", b"_up")
# Database resources a client may use (the store's _security and validate_doc_update decide
# what each user may do there).
DB_RESOURCES = (b"_all_docs", b"_bulk_docs", b"_changes", b"_design", b"_security")
# Members of a document that the store itself reads on a write (CouchDB's list); any other "_"
# member is refused.
DOC_MEMBERS = ("_id", "_rev", "_deleted", "_attachments", "_revisions")
NOT_HERE = "store administration is not done through the front end"


@dataclass(frozen=True)
class GateRefusal:
    status: int
    error: str
    reason: str


def check(method: bytes, path: bytes, body: bytes) -> GateRefusal | None:
    """Why the request may not go to the store, or None. `path` without its query."""
    if method not in METHODS:
        return GateRefusal(405, "method_not_allowed", f"{_text(method)} is not served here")
    segments = [unquote_to_bytes(s) for s in path.split(b"/")[1:]]
    if any(s in (b".", b"..") for s in segments):
        return GateRefusal(400, "bad_request", ". and .. are not path segments here")
    if not segments or segments[0] in (b"",) or segments[0].startswith(b"_"):
        return _server(method, segments[0] if segments else b"", len(segments))
    if len(segments) == 1 or segments[1:] == [b""]:
        return _database(method, path, body)
    return _inside(method, segments[1:], body)


def _server(method: bytes, name: bytes, depth: int) -> GateRefusal | None:
    if name in SERVER_READS and depth <= 1 and method in READS:
        return None
    return GateRefusal(403, "forbidden", f"{_text(method)} /{_text(name)}: {NOT_HERE}")


def _database(method: bytes, path: bytes, body: bytes) -> GateRefusal | None:
    if method in (b"PUT", b"DELETE"):
        return GateRefusal(
            403,
            "forbidden",
            f"{_text(method)} {_text(path)}: databases are created and deleted with the store's "
            "admin account (aso db init), not through the front end",
        )
    if method == b"POST":
        return _document_body(body, None)
    return None


def _inside(method: bytes, rest: list[bytes], body: bytes) -> GateRefusal | None:
    """/db/<rest...>: a document, one of its attachments, or a database resource."""
    first = rest[0]
    if first.startswith(b"_"):
        if first not in DB_RESOURCES:
            return GateRefusal(403, "forbidden", f"{_text(method)} {_text(first)}: {NOT_HERE}")
        if first == b"_security" and method not in READS:
            # COUCHDB_SECURITY_NO_MAJORITY: CouchDB answers a non-admin's write with a 500.
            return GateRefusal(
                403,
                "forbidden",
                "a database's _security is set with the store's admin account (aso db init), "
                "not through the front end",
            )
        if first == b"_design" and len(rest) < 2:
            return GateRefusal(400, "bad_request", "_design needs a design document's name")
        if first == b"_bulk_docs" and method == b"POST":
            return _bulk_body(body)
        if first == b"_design" and len(rest) == 2 and method == b"PUT":
            return _document_body(body, b"_design/" + rest[1])
        return _json_body(method, body)
    if len(rest) == 1 and method == b"PUT":
        return _document_body(body, first)
    if method == b"POST":
        return GateRefusal(405, "method_not_allowed", "POST to a document is not served here")
    return None


def _parse(body: bytes) -> tuple[Any, GateRefusal | None]:
    try:
        return json.loads(body, parse_constant=_no_constant), None
    except (ValueError, RecursionError) as error:
        return None, GateRefusal(400, "bad_request", f"the body is not JSON: {_short(error)}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _json_body(method: bytes, body: bytes) -> GateRefusal | None:
    if method in (b"POST", b"PUT") and body.strip():
        return _parse(body)[1]
    return None


def _document_body(body: bytes, doc_id: bytes | None) -> GateRefusal | None:
    doc, refused = _parse(body)
    return refused or _document(doc, doc_id)


def _bulk_body(body: bytes) -> GateRefusal | None:
    data, refused = _parse(body)
    if refused:
        return refused
    if not isinstance(data, dict) or not isinstance(data.get("docs"), list):
        return GateRefusal(400, "bad_request", "_bulk_docs takes an object with a docs list")
    for index, doc in enumerate(data["docs"]):
        refused = _document(doc, None, f"docs[{index}]")
        if refused:
            return refused
    return None


def _document(doc: Any, doc_id: bytes | None, what: str = "the document") -> GateRefusal | None:
    if not isinstance(doc, dict):
        return GateRefusal(400, "bad_request", f"{what} must be a JSON object")
    if "_id" in doc and not isinstance(doc["_id"], str):
        return GateRefusal(400, "bad_request", f"{what}: _id must be a string")
    if doc_id is not None and "_id" in doc and doc["_id"].encode("utf-8", "replace") != doc_id:
        return GateRefusal(400, "bad_request", f"{what}: _id differs from the URL's")
    special = sorted(k for k in doc if k.startswith("_") and k not in DOC_MEMBERS)
    if special:
        return GateRefusal(400, "doc_validation", f"Bad special document member: {special[0]}")
    if _has_proto(doc):
        return GateRefusal(400, "doc_validation", f"{what} has a member named __proto__, which "
                           "the store would drop without a word")  # fmt: skip
    return None


def _has_proto(value: Any) -> bool:
    """A member named __proto__ anywhere (EMBEDDED_DROPS_PROTO_MEMBERS)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if "__proto__" in item:
                return True
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")[:200]


def _short(error: BaseException) -> str:
    return str(error)[:200] or type(error).__name__
