"""The X.509 front end's gate: a request is matched against the route table
(aso/frontend/routes.py) and the store request is built from what the match parsed, or the request
is refused with a 4xx and the reason. Deny by default: what the table does not hold goes nowhere.

What is forwarded is made anew from the typed form, never the bytes the client sent: the path
from the route's literal segments and the decoded, checked variables (percent-encoded again),
the query from the typed values (written again, e.g. JSON keys re-serialised), the body parsed
(no member twice, no NaN, bounded depth) and written again. So the store parses exactly what the
gate judged, whatever the store's own parser would have made of the original (a `;` that
mochiweb reads as a separator, `%00` that the embedded store strips from a database name, a
duplicate member two JSON parsers resolve differently).

Refusals: 400 a target that is no path, a segment, parameter or body the route does not take;
403 the store's own names (`_local`, `_users`, `_replicator`, `_config`, ...) and routes not
served to the caller's audience; 404 no such resource; 405 a method the resource does not take.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from aso.frontend import routes, sequences
from aso.frontend.routes import ONE_ROW_A_KEY, Invalid, Route
from aso.limits import LIGHT_LOOKUPS


@dataclass(frozen=True)
class GateRefusal:
    status: int
    error: str
    reason: str


@dataclass(frozen=True)
class Forward:
    """The store request made from a matched route."""

    route: Route
    method: bytes
    target: bytes
    body: bytes | None
    poll_ms: int | None = None  # a long poll: the front end ends it by then
    since: str | None = None
    heartbeat_ms: int | None = None  # a long poll's blank lines: the front end's own
    heavy: bool = False  # a read that carries documents: few at a time (frontend.HEAVY_READS)
    # the store nodes `since` names: forwarded only once the store itself has named them
    nodes: frozenset[str] = frozenset()
    with_docs: bool = False  # carries documents (include_docs), heavy or not
    documents: int = 0  # documents a write carries (a user's: frontend.user_docs_per_second)
    filtered: bool = False  # a `_changes` read by `filter=_doc_ids`
    reduces: bool = False  # a view read answered by its reduce (aso.frontend.shared)


def _bad(reason: str) -> GateRefusal:
    return GateRefusal(400, "bad_request", reason)


# -- the framing ----------------------------------------------------------------------------------
# What the HTTP parser (Twisted's) refuses before any route is matched, said in words: Twisted
# itself answers a bare "400 Bad Request" and a client cannot tell which of its bytes was wrong.
TOKEN_CHARS = frozenset((string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~").encode())
LENGTH_HEADERS = (b"content-length", b"transfer-encoding")


def request_line_fault(line: bytes) -> str:
    if line.startswith(b"PRI * HTTP/2"):
        return "HTTP/2 is not spoken here: send HTTP/1.1"
    return ("the request line must be a method, a path and HTTP/1.1 (or 1.0), separated by "
            "single spaces")  # fmt: skip


def header_fault(line: bytes, length_given: bool, headers: int, max_headers: int) -> str:
    """Why a header line the parser refused is wrong; `length_given`: an earlier header gave
    the body's length already, `headers`: the header lines accepted before it."""
    name, colon, value = line.partition(b":")
    value = value.strip(b" \t")
    if not colon:
        return "a header line must be a name, a colon and a value"
    if not name or not set(name) <= TOKEN_CHARS:
        return "a header name must be a token, with no space before its colon"
    if any(c in value for c in b"\0\r\n"):
        return "a header value may not hold NUL, CR or LF"
    lowered = name.lower()
    if lowered == b"content-length" and not value.isdigit():
        return "Content-Length must be a single decimal number"
    if lowered == b"transfer-encoding" and value.lower() != b"chunked":
        return "Transfer-Encoding may only be chunked"
    if lowered in LENGTH_HEADERS and length_given:
        return ("a request gives its body's length once: one Content-Length or "
                "Transfer-Encoding: chunked, not both, not twice")  # fmt: skip
    if headers >= max_headers:
        return f"a request may carry at most {max_headers} header lines"
    return "a header line is malformed"


LINE_ENDING_FAULT = (
    "lines of a request's head end with CR LF: a bare CR or LF is refused (RFC 9112 2.2)"
)
FOLDED_FAULT = ("a header line may not start with a space or a tab: folded header lines are "
                "refused (RFC 9112 5.2)")  # fmt: skip
TRAILER_FAULT = "a chunked body may not carry trailer fields here"
# A Host value: a name, an IPv4 or a bracketed IPv6 address, and an optional port (RFC 9110 7.2).
HOST_VALUE = re.compile(rb"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(:[0-9]{0,5})?")


def line_fault(line: bytes, first: bool) -> str | None:
    """Why a line of a request's head (without its CR LF) is refused before it is parsed."""
    if b"\r" in line or b"\n" in line:
        return LINE_ENDING_FAULT
    if not first and line[:1] in (b" ", b"\t"):
        return FOLDED_FAULT
    return None


def host_fault(version: bytes, hosts: list[bytes] | None) -> str | None:
    """An HTTP/1.1 request carries exactly one Host line with a valid value (RFC 9112 3.2: a
    server MUST answer 400 otherwise); HTTP/1.0 may leave it out."""
    if not hosts and version != b"HTTP/1.1":
        return None
    if not hosts or len(hosts) > 1:
        return "an HTTP/1.1 request carries exactly one Host header line (RFC 9112 3.2)"
    host = HOST_VALUE.fullmatch(hosts[0])
    port = host.group(2)[1:] if host and host.group(2) else b""
    if not host or (port and not 0 < int(port) < 65536):
        return "the Host header must be a host name or address and an optional port (1-65535)"
    return None


# -- the request target ---------------------------------------------------------------------------
def check_target(target: bytes) -> GateRefusal | None:
    """A request target must be a path (origin-form, RFC 9112 3.2.1), printable ASCII, without a
    fragment: `GET 1/db` had been sent to the store's URL + `1/db`, another local port."""
    if not target.startswith(b"/") or target.startswith(b"//"):
        return _bad("the request target must be a path starting with /")
    if any(c <= 0x20 or c >= 0x7F for c in target) or b"#" in target:
        return _bad("the request target must be printable ASCII (percent-encode the rest) "
                    "without a fragment")  # fmt: skip
    return None


def parse_path(path: bytes) -> list[str] | GateRefusal:
    """The path's segments, percent-decoded: UTF-8, no control characters, no empty, `.` or `..`
    segment."""
    if path == b"/":
        return []
    segments = []
    for raw in path[1:].split(b"/"):
        try:
            text = unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            return _bad("a path segment is not UTF-8")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
            return _bad("a path segment holds a control character")
        if text in ("", ".", ".."):
            return GateRefusal(404, "not_found", "empty, . and .. are not path segments here")
        segments.append(text)
    return segments


def parse_query(query: bytes) -> list[tuple[str, str]] | GateRefusal:
    """The query's name=value pairs (`&`-separated, `+` a space), each name once."""
    pairs: list[tuple[str, str]] = []
    for part in query.split(b"&") if query else []:
        if not part:
            continue
        raw_name, _, raw_value = part.partition(b"=")
        try:
            name, value = (unquote_to_bytes(x.replace(b"+", b" ")).decode("utf-8")
                           for x in (raw_name, raw_value))  # fmt: skip
        except UnicodeDecodeError:
            return _bad("query parameters must be UTF-8")
        if any(n == name for n, _ in pairs):
            return _bad(f"query parameter {name[:100]!r} given twice")
        pairs.append((name, value))
    return pairs


# -- matching -------------------------------------------------------------------------------------
def _shaped(route: Route, segments: list[str]) -> bool:
    """The route's path has this many segments, its literal ones are these, and none of its
    variables is one of the store's own names (no variable type takes a leading `_`)."""
    return len(route.path) == len(segments) and all(
        spec == text if isinstance(spec, str) else not text.startswith("_")
        for spec, text in zip(route.path, segments, strict=True)
    )


def _literals(route: Route) -> int:
    return sum(isinstance(spec, str) for spec in route.path)


def _variables(route: Route, segments: list[str]) -> dict[str, str] | GateRefusal:
    """The route's typed path variables, or why a segment is not of its type."""
    found = {}
    for spec, text in zip(route.path, segments, strict=True):
        if isinstance(spec, str):
            continue
        try:
            found[spec.name] = spec.value.from_text(text)
        except Invalid as exc:
            return _bad(f"path segment {spec.name} must be {exc}, not {text[:100]!r}")
    return found


def _own(route: Route, variables: dict[str, str], caller: str) -> dict[str, str] | GateRefusal:
    """A route of the caller's own document takes that document's id alone."""
    if not route.own or variables.get("doc_id") == route.own + caller:
        return variables
    reason = f"{route.method} {route.template}: a user reaches only their own, {route.own}{caller}"
    return GateRefusal(403, "forbidden", reason[:300])


def _store_own(shown: str) -> GateRefusal:
    reason = f"{shown[:200]}: not served through the front end (the store's own resources"
    return GateRefusal(403, "forbidden", reason + " are administered on its loopback port)")


def _unmatched(segments: list[str], table: tuple[Route, ...]) -> GateRefusal:
    """Why no route has this path: the store's own names, a database's path no route has, or
    nothing here."""
    shown = "/" + "/".join(segments)
    served_dbs = {r.path[0] for r in table if r.path}
    if any(s.startswith("_") for s in segments) or (segments and segments[0] in served_dbs):
        return _store_own(shown)
    return GateRefusal(404, "not_found", f"{shown[:200]}: no such resource is served here")


def check(
    method: bytes,
    target: bytes,
    body: bytes,
    audiences: frozenset[str],
    table: tuple[Route, ...],
    content_type: bytes = b"application/json",
    caller: str = "",
) -> GateRefusal | Forward:
    """What to forward for this request, or why not. `target` is the request target as sent,
    `content_type` its Content-Type header, `caller` the name the client maps to."""
    refused = check_target(target)
    if refused:
        return refused
    path, _, query = target.partition(b"?")
    segments = parse_path(path)
    if isinstance(segments, GateRefusal):
        return segments
    pairs = parse_query(query)
    if isinstance(pairs, GateRefusal):
        return pairs
    here = [r for r in table if _shaped(r, segments)]
    if not here:
        return _unmatched(segments, table)
    # A literal segment is a name of its own: `_changes` is never taken for a document's id.
    most = max(_literals(r) for r in here)
    here = [r for r in here if _literals(r) == most]
    verb = "GET" if method == b"HEAD" else method.decode("latin-1")
    by_method = [r for r in here if r.method == verb]
    if not by_method:
        allowed = sorted({r.method for r in here})
        allowed += ["HEAD"] if "GET" in allowed else []
        return GateRefusal(405, "method_not_allowed", f"{verb[:20]} is not served on "
                           f"{here[0].template} (it takes {', '.join(allowed)})")  # fmt: skip
    mine = [r for r in by_method if r.audiences & audiences]
    if not mine:
        served = "/".join(sorted(audiences)) or "this identity"
        reason = f"{verb} {by_method[0].template} is not served to {served}"
        return GateRefusal(403, "forbidden", reason)
    first: GateRefusal | None = None
    for route in mine:
        variables = _variables(route, segments)
        if not isinstance(variables, GateRefusal):
            variables = _own(route, variables, caller)
        made = (
            variables
            if isinstance(variables, GateRefusal)
            else _build(route, variables, method, pairs, body, content_type, audiences)
        )
        if isinstance(made, Forward):
            return made
        first = first or made
    assert first is not None
    return first


def _build(
    route: Route,
    variables: dict[str, str],
    method: bytes,
    pairs: list[tuple[str, str]],
    body: bytes,
    content_type: bytes,
    audiences: frozenset[str] = frozenset({routes.USER}),
) -> GateRefusal | Forward:
    params: dict[str, Any] = {}
    for name, text in pairs:
        kind = route.query.get(name)
        if kind is None:
            taken = ", ".join(route.query) or "none"
            return _bad(f"query parameter {name[:100]!r} is not taken by {route.template} "
                        f"(it takes: {taken})")  # fmt: skip
        try:
            params[name] = kind.from_text(text)
        except Invalid as exc:
            return _bad(f"query parameter {name[:100]} must be {exc}")
    sent, options, documents = _body(route, variables, body, content_type)
    if isinstance(sent, GateRefusal):
        return sent
    twice = sorted(set(params) & set(options))
    if twice:
        return _bad(f"{twice[0]!r} is given in the query and in the body")
    given = {**params, **options}
    for one, other in routes.ALIASES:  # the stores take either spelling: the gate checks one
        if one in given and other in given:
            return _bad(f"{one} and {other} name one parameter: give one of them")
    refused = _rules(route, given) or _store_rows(route, given, audiences)
    if refused:
        return refused
    with_docs = bool(given.get("include_docs")) and route.kind in ("read", "poll")
    if with_docs and "keys" not in given:
        limit = given.get("limit")
        if limit is None:
            params["limit"] = routes.MAX_DOC_ROWS  # a documented bound: page with limit
        elif limit > routes.MAX_DOC_ROWS:
            return _bad(f"a read with include_docs takes a limit of at most {routes.MAX_DOC_ROWS}")
    nodes: frozenset[str] = frozenset()
    if "keys" in given and route.kind == "read" and "limit" not in given:
        # Distinct keys may still match the same rows: CouchDB's collation ignores some
        # characters ("d\u00adone" is "done"), and 1000 spellings of a key had read 126 MiB.
        # Where a key names one row, the keys bound the page.
        one_row = _one_row_a_key(route)
        params["limit"] = len(given["keys"]) if one_row else routes.MAX_LIMIT
    if "since" in given:
        try:
            nodes = sequences.check(str(given["since"]))
        except sequences.Invalid as exc:
            return _bad(f"since must be {exc}")
    longpoll = route.kind == "poll" and given.get("feed") == "longpoll"
    if route.kind == "poll" and not longpoll and "limit" not in given:
        # A batch without a limit had answered the whole feed (24,211 changes, 3.4 MB): a page
        # at most, the next from its last_seq, as docs/frontend.md says.
        params["limit"] = routes.MAX_DOC_ROWS
        given = {**given, "limit": routes.MAX_DOC_ROWS}
    # A page at most, the next from its last_seq: a long poll without a limit had answered a
    # whole feed, read whole by the front end, without a heavy read's turn. A user's, from an
    # old `since`, answers at once as a batch would, in a poll's slot: a light batch's page.
    most = routes.MAX_DOC_ROWS if audiences & routes.SERVICES else LIGHT_LOOKUPS
    if longpoll and given.get("limit", routes.MAX_LIMIT + 1) > most:
        params["limit"] = most
    # A long poll's slot would be held for its whole wait: it is bounded by its limit alone.
    unpaged = _unpaged(route, {**given, **params}) or _many_changes(route, given, audiences)
    heavy = (with_docs or unpaged) and not longpoll
    poll_ms, since = None, None
    heartbeat = params.pop("heartbeat", None)
    if longpoll:
        poll_ms = min(params.get("timeout", routes.MAX_POLL_MS), routes.MAX_POLL_MS)
        params["timeout"] = poll_ms
        since = str(params.get("since", "0"))
    target = _target(route, variables, params)
    beat = heartbeat if poll_ms else None
    filtered = route.kind == "poll" and "filter" in given
    return Forward(route, method, target, sent, poll_ms, since, beat, heavy, nodes, with_docs,
                   documents, filtered, _reduces(route, given))  # fmt: skip


def as_batch(made: Forward) -> Forward:
    """The long poll `made` asked as a batch (`feed=normal`), from the same `since`: what it
    would answer at once if a change of its ids came after `since`."""
    path, _, query = made.target.partition(b"?")
    pairs = [p for p in query.split(b"&")
             if p.partition(b"=")[0] not in (b"feed", b"timeout", b"heartbeat")]  # fmt: skip
    target = path + b"?" + b"&".join([*pairs, b"feed=normal"])
    return dataclasses.replace(made, target=target, poll_ms=None, heartbeat_ms=None)


def with_since(made: Forward, since: str) -> Forward:
    """`made` asking from `since` instead of `now` (or from the 0 it stood for when it named
    none): a long poll that ends quiet can then say where the next one starts (its
    `last_seq`), as CouchDB's does, and one that has caught up waits from there."""
    path, _, query = made.target.partition(b"?")
    pairs = [
        (name, value)
        for name, value in (p.split("=", 1) for p in query.decode("ascii").split("&") if p)
        if name != "since"
    ]
    pairs.append(("since", since))
    target = path + b"?" + "&".join(f"{n}={quote(v, safe='') if n == 'since' else v}"
                                    for n, v in pairs).encode("ascii")  # fmt: skip
    return dataclasses.replace(made, target=target, since=since)


def _body(
    route: Route, variables: dict[str, str], body: bytes, content_type: bytes
) -> tuple[bytes | GateRefusal | None, dict[str, Any], int]:
    """The body to send (None: none), the options it carries and the documents it writes."""
    if route.body is None:
        if body.strip():
            return _bad(f"{route.method} {route.template} takes no body"), {}, 0
        return None, {}, 0
    if body.strip() and content_type.split(b";")[0].strip().lower() != b"application/json":
        # A page of another site may send a form or text/plain without asking first; a JSON
        # body needs the browser to ask (CORS), and the front end answers no one.
        return GateRefusal(415, "unsupported_media_type", "a body is sent as application/json "
                           f"(not {content_type.decode('latin-1')[:60]!r})"), {}, 0  # fmt: skip
    if not body.strip():
        if isinstance(route.body, routes.Options):
            return None, {}, 0
        return _bad(f"{route.method} {route.template} needs a JSON body"), {}, 0
    try:
        data = routes.parse_json(body, "the body")
        value = route.body.read(data, variables.get("doc_id"))
    except routes.TooLarge as exc:
        return GateRefusal(413, "too_large", str(exc)[:600]), {}, 0
    except Invalid as exc:
        return _bad(str(exc)[:600]), {}, 0
    options = value if isinstance(route.body, routes.Options) else {}
    if isinstance(route.body, routes.Bulk):
        documents = len(value["docs"])
    else:
        documents = int(isinstance(route.body, routes.Document))
    return routes.dumps(value).encode(), options, documents


# The status cursor's page skips its first row, the last of the page before (docs/status-api.md).
CURSOR_SKIP = 1


def _unpaged(route: Route, given: dict[str, Any]) -> bool:
    """A read whose cost is not bounded by a page: a reduce (the embedded store reduces every
    row of the range per read, EMBEDDED_REDUCES_EVERY_ROW: 60 grouped reads of 3,000 rows had
    stalled everyone 13 s), rows without a limit or with one over a page (bursts of 10,000-row
    reads had held bob's reads 15 s), or a filtered `_changes` batch (the store reads every
    change from `since` to find those of the ids, whatever the limit: 1 s a read of a
    59k-change history, and a flood of them had slowed bob's reads 7 to 16 times), or rows by
    `keys` where a key may name many rows (the embedded store reads every row of each key
    before its limit: `limit=1` of one key had read 76k rows, 7-12 s, and held the view for
    everyone; EMBEDDED_KEYS_READ_WHOLE), or by more than LIGHT_LOOKUPS keys of any kind (each
    key is a lookup: four reads of 1,000 at once had kept the store 80 % busy). The rows
    skipped are read too: `skip=10000&limit=1000` read 11,000 rows, three times a page."""
    literals = {s for s in route.path if isinstance(s, str)}
    if route.kind not in ("read", "poll") or not {"_view", "_all_docs", "_changes"} & literals:
        return False
    reduces = _reduces(route, given)
    scans = "_changes" in literals and "filter" in given
    keys = given.get("keys")
    many_keys = keys is not None and len(keys) > LIGHT_LOOKUPS
    by_keys = many_keys or (keys is not None and not _one_row_a_key(route))
    skipped = max(given.get("skip", 0) - CURSOR_SKIP, 0)  # rows the store reads and drops
    unbounded = given.get("limit", math.inf) + skipped > routes.MAX_DOC_ROWS
    return reduces or scans or by_keys or unbounded


def _reduces(route: Route, given: dict[str, Any]) -> bool:
    """A view read answered by the view's reduce (a view with one, not told reduce=false)."""
    return "reduce" in route.query and given.get("reduce") is not False


def _one_row_a_key(route: Route) -> bool:
    """A key of this read names at most one row: `_all_docs` (an id) and the views whose key
    ends with the document's id (routes.ONE_ROW_A_KEY)."""
    if route.path[-1:] == ("_all_docs",):
        return True
    return route.path[1:2] == ("_design",) and route.path[2::2] in ONE_ROW_A_KEY


def _many_changes(route: Route, given: dict[str, Any], audiences: frozenset[str]) -> bool:
    """A user's `_changes` batch of more than LIGHT_LOOKUPS changes: the embedded store reads
    each change's document, whatever the options (EMBEDDED_CHANGES_READ_DOCUMENTS), 0.2-0.3 s a
    page of 1,000 large requests; 16 of alice's connections had made the operator's reads 12
    times slower. The status cursor's `_changes` is filtered (heavy already); the agents' pages
    have the services' own slots."""
    if route.kind != "poll" or audiences & routes.SERVICES:
        return False
    return bool(given.get("limit", math.inf) > LIGHT_LOOKUPS)


# Ids starting with `_` (the store's: design documents) sort from "_" to "`" on both stores
# (`_all_docs` compares ids by code point, raw).
STORE_IDS = ("_", "`")


def _store_rows(
    route: Route, given: dict[str, Any], audiences: frozenset[str]
) -> GateRefusal | None:
    """A user's `_all_docs` range must not reach ids starting with `_`: design documents (the
    agents' views, the validation) are not a user's to read. Agents and operators keep theirs."""
    if route.path[-1:] != ("_all_docs",) or audiences & routes.SERVICES or "keys" in given:
        return None
    if "key" in given:
        return None  # a key is never such an id (routes.DOCUMENT_KEY)
    start = given.get("startkey", given.get("start_key"))
    end = given.get("endkey", given.get("end_key"))
    end_open = given.get("inclusive_end") is False
    low, high = (end, start) if given.get("descending") else (start, end)
    high_open = end_open and not given.get("descending")
    below = high is not None and (high < STORE_IDS[0] or (high == STORE_IDS[0] and high_open))
    above = low is not None and low >= STORE_IDS[1]
    if below or above:
        return None
    return _bad('a user\'s _all_docs range may not reach ids starting with _ (the store\'s own, '
                'sorted between "_" and "`"): read below endkey "_" with inclusive_end=false, '
                'or from startkey "`"')  # fmt: skip


def _rules(route: Route, given: dict[str, Any]) -> GateRefusal | None:
    for name, other in route.rules:
        if given.get(name) in (None, False):  # a flag given as false is the flag not given
            continue
        if other.startswith("!") and other[1:] in given:
            return _bad(f"{name} is not taken together with {other[1:]}")
        if not other.startswith("!") and other not in given:
            return _bad(f"{name} is taken only together with {other}")
    return None


def _target(route: Route, variables: dict[str, str], params: dict[str, Any]) -> bytes:
    parts = [s if isinstance(s, str) else variables[s.name] for s in route.path]
    path = "/" + "/".join(quote(p, safe="") for p in parts)
    query = "&".join(
        f"{quote(n, safe='')}={quote(route.query[n].to_text(v), safe='')}"
        for n, v in params.items()
    )
    return (path + ("?" + query if query else "")).encode("ascii")
