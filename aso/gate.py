"""What the X.509 front end lets through to the store, decided before anything is forwarded.

Users, clients and agents need the databases' documents, views and feeds, and a few server
resources (`/`, `/_session`, `/_all_dbs`, `/_uuids`, `/_up`). Store administration (creating or
deleting databases, compaction, `_config`, replication, accounts, `_local` documents, which
validate_doc_update never sees) is done on the store's own loopback port with its admin account,
never through the front end: sent by a non-admin, several of these requests even kill the
embedded store (EMBEDDED_CRASH_ON_NON_ADMIN_DB_CREATE, EMBEDDED_CRASH_ON_NON_ADMIN_MAINTENANCE).

Query parameters are a closed list per kind of resource (`QUERIES`), each with the shape of its
value, and a view's or `_all_docs`' POST body and a `_changes` body are held to the same list:
`_changes?filter=_selector` (or `_design`, `_view`, any design document's filter) killed the
embedded store (EMBEDDED_CHANGES_FILTER_CRASH), and `new_edits=false` would let a client
write a revision history of its own. What is forwarded is the query as checked, encoded again
(`Verdict.target`), so the store parses exactly what the gate read. The request target must be
a path (origin-form, RFC 9112 3.2.1): `GET 1/db` had been sent to `http://127.0.0.1:5984` +
`1/db`, another local port.

Bodies of writes must be JSON that the store can judge: the embedded store answers 500 (or
crashes) on a document that is not an object, a non-string `_id`, an unknown `_` member, or a
`_bulk_docs` entry that is not an object (EMBEDDED_500_ON_MALFORMED_DOCS), and it stores a
document without its members named `__proto__` (EMBEDDED_DROPS_PROTO_MEMBERS). Each refusal is an
HTTP answer in CouchDB's shape with a reason: 400 bad body or path, 403 not served here, 405
method.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote_to_bytes

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


@dataclass(frozen=True)
class Verdict:
    """What the front end forwards: the path as sent and the query as checked, encoded again."""

    target: bytes


# -- query parameters ---------------------------------------------------------------------------
_SEQ = re.compile(r"[0-9A-Za-z_\-]{1,4096}")  # an opaque update sequence (CouchDB) or a number


def _is_bool(v: str) -> bool:
    return v in ("true", "false")


def _is_count(v: str) -> bool:
    return v.isascii() and v.isdigit() and len(v) <= 9


def _json(v: str) -> tuple[bool, Any]:
    """Whether `v` is JSON, and its value."""
    try:
        return True, json.loads(v, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return False, None


def _is_json(v: str) -> bool:
    return _json(v)[0]


def _is_json_list(v: str) -> bool:
    ok, value = _json(v)
    return ok and isinstance(value, list)


def _one_of(*values: str) -> Callable[[str], bool]:
    return lambda v: v in values


def _any_text(v: str) -> bool:
    return len(v) <= 4096


_VIEW_FLAGS = [
    "descending",
    "include_docs",
    "inclusive_end",
    "reduce",
    "group",
    "update_seq",
    "conflicts",
    "stable",
    "sorted",
]
_VIEW: dict[str, Callable[[str], bool]] = {
    **dict.fromkeys(("key", "startkey", "start_key", "endkey", "end_key"), _is_json),
    "keys": _is_json_list,
    **dict.fromkeys(
        ("startkey_docid", "start_key_doc_id", "endkey_docid", "end_key_doc_id"), _any_text
    ),
    **dict.fromkeys(_VIEW_FLAGS, _is_bool),
    **dict.fromkeys(("limit", "skip", "group_level"), _is_count),
    "stale": _one_of("ok", "update_after"),
    "update": _one_of("true", "false", "lazy"),
}
_CHANGES: dict[str, Callable[[str], bool]] = {
    "feed": _one_of("normal", "longpoll", "continuous"),
    "since": lambda v: v == "now" or bool(_SEQ.fullmatch(v)),
    **dict.fromkeys(("limit", "timeout"), _is_count),
    "heartbeat": lambda v: v == "true" or _is_count(v),
    **dict.fromkeys(("include_docs", "descending", "conflicts", "seq_interval"), _is_bool),
    "style": _one_of("main_only", "all_docs"),
    # Only the built-in filter by id: the others (_selector, _design, _view, a design
    # document's filter) killed the embedded store (EMBEDDED_CHANGES_FILTER_CRASH).
    "filter": _one_of("_doc_ids"),
    "doc_ids": _is_json_list,
}
_DOC_READ: dict[str, Callable[[str], bool]] = {
    "rev": _any_text,
    "open_revs": lambda v: v == "all" or _is_json_list(v),
    **dict.fromkeys(("revs", "revs_info", "latest", "conflicts", "deleted_conflicts"), _is_bool),
}
_REV: dict[str, Callable[[str], bool]] = {"rev": _any_text}
_NONE: dict[str, Callable[[str], bool]] = {}
# Per kind of resource, the query parameters it takes and the shape of each one's value.
QUERIES: dict[str, dict[str, Callable[[str], bool]]] = {
    "server": _NONE,
    "uuids": {"count": lambda v: _is_count(v) and int(v) <= 1000},
    "database": _NONE,
    "view": _VIEW,  # /db/_all_docs and /db/_design/d/_view/v
    "changes": _CHANGES,
    "bulk_docs": _NONE,  # new_edits=false would write a revision history of the client's
    "security": _NONE,
    "doc_read": _DOC_READ,  # GET/HEAD of a document or a design document
    "doc_write": _REV,  # PUT/DELETE of a document; an attachment
}
# The members a POST body of a view or `_all_docs` may have (CouchDB reads them as parameters),
# and of a `_changes` body.
VIEW_BODY = frozenset(_VIEW)
CHANGES_BODY = frozenset({"doc_ids"})


def parse_query(query: bytes) -> list[tuple[str, str]] | GateRefusal:
    """The query's name=value pairs as the store would decode them (`+` is a space), each name
    once."""
    pairs: list[tuple[str, str]] = []
    for part in query.split(b"&") if query else []:
        if not part:
            continue
        raw_name, _, raw_value = part.partition(b"=")
        try:
            name, value = (unquote_to_bytes(x.replace(b"+", b" ")).decode("utf-8")
                           for x in (raw_name, raw_value))  # fmt: skip
        except UnicodeDecodeError:
            return GateRefusal(400, "bad_request", "query parameters must be UTF-8")
        if any(n == name for n, _ in pairs):
            return GateRefusal(400, "bad_request", f"query parameter {name[:100]!r} given twice")
        pairs.append((name, value))
    return pairs


def _check_query(kind: str, pairs: list[tuple[str, str]]) -> GateRefusal | None:
    allowed = QUERIES[kind]
    for name, value in pairs:
        judge = allowed.get(name)
        if judge is None:
            return GateRefusal(400, "bad_request", f"query parameter {name[:100]!r} is not "
                               f"served here ({kind}: {', '.join(allowed) or 'none'})")  # fmt: skip
        if not judge(value):
            reason = f"query parameter {name}={value[:100]!r} is not a value it takes"
            return GateRefusal(400, "bad_request", reason)
    return None


def _check_changes_filter(
    kind: str, pairs: list[tuple[str, str]], method: bytes, body: bytes
) -> GateRefusal | None:
    """`_changes?filter=_doc_ids` must come with its `doc_ids` (a list, in the query or the
    POST body): without them the embedded store looks for a design document `_doc_ids`, and
    the error it fails to catch ends the process (EMBEDDED_CHANGES_FILTER_CRASH)."""
    if kind != "changes" or ("filter", "_doc_ids") not in pairs:
        return None
    if any(name == "doc_ids" for name, _ in pairs):
        return None
    data = _parse(body)[0] if method == b"POST" and body.strip() else None
    if isinstance(data, dict) and isinstance(data.get("doc_ids"), list):
        return None
    return GateRefusal(400, "bad_request", "filter=_doc_ids needs doc_ids: a JSON list of "
                       "document ids, in the query or the POST body")  # fmt: skip


def _encode(pairs: list[tuple[str, str]]) -> bytes:
    return "&".join(f"{quote(n, safe='')}={quote(v, safe='')}" for n, v in pairs).encode()


def check_target(target: bytes) -> GateRefusal | None:
    """A request target must be a path (origin-form), printable ASCII, without a fragment."""
    if not target.startswith(b"/") or target.startswith(b"//"):
        return GateRefusal(400, "bad_request", "the request target must be a path starting with /")
    if any(c <= 0x20 or c >= 0x7F for c in target) or b"#" in target:
        return GateRefusal(400, "bad_request", "the request target must be printable ASCII "
                           "(percent-encode the rest) without a fragment")  # fmt: skip
    return None


def check(method: bytes, target: bytes, body: bytes) -> GateRefusal | Verdict:
    """Why the request may not go to the store, or what to forward. `target` is the request
    target as the client sent it (path and query)."""
    refused = check_target(target)
    if refused:
        return refused
    path, _, query = target.partition(b"?")
    pairs = parse_query(query)
    if isinstance(pairs, GateRefusal):
        return pairs
    kind, refused = _resource(method, path, body)
    if refused:
        return refused
    refused = _check_query(kind, pairs) or _check_changes_filter(kind, pairs, method, body)
    if refused:
        return refused
    return Verdict(path + (b"?" + _encode(pairs) if pairs else b""))


def _resource(method: bytes, path: bytes, body: bytes) -> tuple[str, GateRefusal | None]:
    """The kind of resource `path` names (the key of QUERIES), and why it may not be used."""
    if method not in METHODS:
        return "", GateRefusal(405, "method_not_allowed", f"{_text(method)} is not served here")
    segments = [unquote_to_bytes(s) for s in path.split(b"/")[1:]]
    if any(s in (b".", b"..") for s in segments):
        return "", GateRefusal(400, "bad_request", ". and .. are not path segments here")
    if not segments or segments[0] in (b"",) or segments[0].startswith(b"_"):
        name = segments[0] if segments else b""
        kind = "uuids" if name == b"_uuids" else "server"
        return kind, _server(method, name, len(segments))
    if len(segments) == 1 or segments[1:] == [b""]:
        return "database", _database(method, path, body)
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


def _inside(method: bytes, rest: list[bytes], body: bytes) -> tuple[str, GateRefusal | None]:
    """/db/<rest...>: a document, one of its attachments, or a database resource."""
    first = rest[0]
    reading = method in READS
    if first.startswith(b"_"):
        if first not in DB_RESOURCES:
            return "", GateRefusal(403, "forbidden", f"{_text(method)} {_text(first)}: {NOT_HERE}")
        if first == b"_security":
            if reading:
                return "security", None
            # COUCHDB_SECURITY_NO_MAJORITY: CouchDB answers a non-admin's write with a 500.
            return "security", GateRefusal(
                403,
                "forbidden",
                "a database's _security is set with the store's admin account (aso db init), "
                "not through the front end",
            )
        if first == b"_bulk_docs":
            if method != b"POST":
                return "", GateRefusal(405, "method_not_allowed", "_bulk_docs takes a POST")
            return "bulk_docs", _bulk_body(body)
        if first in (b"_all_docs", b"_changes"):
            if method not in (*READS, b"POST"):
                return "", GateRefusal(405, "method_not_allowed",
                                       f"{_text(first)} takes GET or POST")  # fmt: skip
            if first == b"_changes":
                return "changes", _options_body(method, body, CHANGES_BODY, "_changes")
            return "view", _options_body(method, body, VIEW_BODY, "_all_docs")
        return _design(method, rest, body)
    if len(rest) == 1 and method == b"PUT":
        return "doc_write", _document_body(body, first)
    if method == b"POST":
        return "", GateRefusal(405, "method_not_allowed", "POST to a document is not served here")
    return ("doc_read" if reading and len(rest) == 1 else "doc_write"), None


def _design(method: bytes, rest: list[bytes], body: bytes) -> tuple[str, GateRefusal | None]:
    """/db/_design/<name>[/...]: the design document, its attachments (the pages) or a view."""
    if len(rest) < 2 or not rest[1]:
        return "", GateRefusal(400, "bad_request", "_design needs a design document's name")
    if len(rest) == 2:
        if method == b"PUT":
            return "doc_write", _document_body(body, b"_design/" + rest[1])
        return ("doc_read" if method in READS else "doc_write"), None
    if rest[2] == b"_view":
        if len(rest) != 4 or not rest[3]:
            return "", GateRefusal(400, "bad_request", "_view needs a view's name")
        if method not in (*READS, b"POST"):
            return "", GateRefusal(405, "method_not_allowed", "a view takes GET or POST")
        return "view", _options_body(method, body, VIEW_BODY, "a view")
    if rest[2].startswith(b"_"):
        return "", GateRefusal(403, "forbidden", f"{_text(rest[2])} of a design document: "
                               "only its views and attachments are served here")  # fmt: skip
    return ("doc_read" if method in READS else "doc_write"), None


def _options_body(
    method: bytes, body: bytes, allowed: frozenset[str], what: str
) -> GateRefusal | None:
    """The POST body of a view, `_all_docs` or `_changes`: an object of the options the query
    may carry."""
    if method != b"POST" or not body.strip():
        return None
    data, refused = _parse(body)
    if refused:
        return refused
    if not isinstance(data, dict):
        return GateRefusal(400, "bad_request", f"the body of {what} must be a JSON object")
    extra = sorted(k for k in data if k not in allowed)
    if extra:
        return GateRefusal(400, "bad_request", f"{extra[0][:100]!r} is not an option of {what} "
                           "served here")  # fmt: skip
    return None


def _parse(body: bytes) -> tuple[Any, GateRefusal | None]:
    try:
        return json.loads(body, parse_constant=_no_constant), None
    except (ValueError, RecursionError) as error:
        return None, GateRefusal(400, "bad_request", f"the body is not JSON: {_short(error)}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


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
