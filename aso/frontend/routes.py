"""The front end's one table: every request a grid user, an agent or an operator may send through
the X.509 front end, as typed routes (the only source of docs/openapi.yaml and of docs/security.md's
route table).

A route is a method, a path of literal and typed segments, the query parameters it takes (each
typed and bounded), the body it takes (a schema with bounded sizes and item counts) and the
audiences it serves: `user` (roles aso-user, group:<group>), `agent` (aso-agent), `operator`
(aso-admin). aso/frontend/gate.py matches a request against this table and builds the store request
from what it parsed; anything the table does not hold is refused. Nothing of the store's own names
(`_local`, `_design` writes, `_users`, `_replicator`, `_config`, ...) is in it, for anyone: the
store is administered on its loopback port with its admin account (`aso db init`).

The table is made for a config (the databases' names, the design documents and their views,
the pages' files): `table(config)`.
"""

from __future__ import annotations

import codecs
import functools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aso import model
from aso.config import Config
from aso.jsvalues import MAX_SAFE_INTEGER
from aso.limits import MAX_DOCS, MAX_FEED_TIMEOUT, MAX_KEYS, MAX_WRITTEN_DOC_CHARS
from aso.provision import storejs

USER, AGENT, OPERATOR = "user", "agent", "operator"
AUDIENCES = (USER, AGENT, OPERATOR)
EVERYONE = frozenset(AUDIENCES)
SERVICES = frozenset({AGENT, OPERATOR})

# Bounds of what one request may carry (docs/openapi.yaml's maxItems): the store's work per
# request stays bounded, whoever sends it (100,000 view keys had stalled the embedded store).
MAX_LIMIT = 10_000  # rows of one view or _all_docs page, changes of one _changes batch
# Two spellings of one parameter that the stores both take: a request gives one of them.
ALIASES = (("startkey", "start_key"), ("endkey", "end_key"))
MAX_SKIP = 10_000
MAX_KEY_CHARS = 4096  # one JSON key as sent
MAX_DEPTH = 16  # nesting of any JSON value sent (a request's history entries are at depth 3)
# Objects and lists of one body, counted before it is parsed: parsing is the front end's CPU,
# and a 63 MiB body of `{}` had taken a minute (1000 requests of ASO take ~10,000).
MAX_CONTAINERS = 200_000
# Values of one body, scalars too, counted before it is parsed: each costs the front end and the
# store memory and CPU (58 MiB of 30M zeros had grown the front end by GBs and held the store
# for minutes). A request as large as the model allows (MAX_DOC_CHARS) holds at most ~262,000; a
# body over the bound gets 413, which ASO's clients answer by sending it again in halves.
MAX_VALUES = 1_000_000
# Rows of one read that carries the documents (include_docs): each may be 256 KiB, and the
# embedded store builds an answer whole in its one process (six of 475 MiB had ended it).
MAX_DOC_ROWS = 1000
# A long poll is ended by the front end at most this long after it began (plus a grace for the
# store to answer first): the embedded store never ends one itself.
MAX_POLL_MS = int(MAX_FEED_TIMEOUT * 1000)
FEEDS = ("normal", "longpoll")

# A store revision: CouchDB's and the embedded store's are both N-<32 hex digits>.
REV_PATTERN = r"^[1-9][0-9]{0,9}-[0-9a-f]{32}$"
# An update sequence as handed out: a number on the embedded store, N-<opaque> on CouchDB (whose
# opaque part aso.frontend.sequences checks before the store decodes it).
SEQ_PATTERN = r"^(now|0|[1-9][0-9]{0,15}|[0-9]{1,16}-g[A-Za-z0-9_-]{1,4093})$"
# A document id of ASO's own documents other than requests (heartbeats, jobs, blocks, statistics):
# never one of the store's names (`_local`, `_design`), no control characters.
DOC_ID_PATTERN = r"^[A-Za-z0-9][^\x00-\x1f\x7f]{0,511}$"
# A file of the pages' design document.
ATTACHMENT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"

ROLE_AUDIENCE = {model.USER_ROLE: USER, model.AGENT_ROLE: AGENT, "aso-admin": OPERATOR}


@functools.lru_cache(maxsize=1024)
def audiences_of(roles: tuple[str, ...]) -> frozenset[str]:
    """The audiences a mapped identity's roles make it part of (the mapfile's few sets of roles,
    each judged once)."""
    found = {ROLE_AUDIENCE[r] for r in roles if r in ROLE_AUDIENCE}
    if storejs.granted_groups(list(roles)):
        found.add(USER)
    return frozenset(found)


class Invalid(ValueError):
    """A value that is not what its parameter takes; the message says what it must be."""


class TooLarge(Invalid):
    """A body or a document over a bound of size or values (answered 413: a client may send
    its documents again in smaller batches)."""


# -- values ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Value:
    """How one parameter's value is read from a query's text or a body's JSON, bounded, and
    written again for the store."""

    def from_text(self, text: str) -> Any:
        return self.from_json(text)

    def from_json(self, value: Any) -> Any:
        raise NotImplementedError

    def to_text(self, value: Any) -> str:
        return str(value)

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class Flag(Value):
    def from_text(self, text: str) -> bool:
        if text not in ("true", "false"):
            raise Invalid("true or false")
        return text == "true"

    def from_json(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise Invalid("true or false")
        return value

    def to_text(self, value: Any) -> str:
        return "true" if value else "false"

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True)
class Count(Value):
    low: int = 0
    high: int = MAX_LIMIT

    def from_text(self, text: str) -> int:
        if not (text.isascii() and text.isdigit() and len(text) <= 10):
            raise Invalid(f"a whole number from {self.low} to {self.high}")
        return self.from_json(int(text))

    def from_json(self, value: Any) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not (self.low <= value <= self.high)
        ):
            raise Invalid(f"a whole number from {self.low} to {self.high}")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.low, "maximum": self.high}


@dataclass(frozen=True)
class Text(Value):
    pattern: str
    meaning: str

    def from_text(self, text: str) -> str:
        return self.from_json(text)

    def from_json(self, value: Any) -> str:
        if not isinstance(value, str) or not re.fullmatch(self.pattern.strip("^$"), value):
            raise Invalid(self.meaning)
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": self.pattern}


@dataclass(frozen=True)
class Choice(Value):
    choices: tuple[str, ...]

    def from_json(self, value: Any) -> str:
        if value not in self.choices or not isinstance(value, str):
            raise Invalid("one of " + ", ".join(self.choices))
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.choices)}


@dataclass(frozen=True)
class Key(Value):
    """A JSON value used as a key (a view's; `_all_docs`' are strings): sent as JSON text in a
    query, bounded in size and depth."""

    strings: bool = False
    documents: bool = False  # a document id: `_all_docs` keys name documents, never `_local` ones

    def from_text(self, text: str) -> Any:
        try:
            value = parse_json(text.encode("utf-8"), "the key")
        except Invalid as exc:
            raise Invalid(f"JSON text ({exc})") from None
        return self.from_json(value)

    def from_json(self, value: Any) -> Any:
        if self.strings and not isinstance(value, str):
            raise Invalid("a JSON string (a document id)")
        if self.documents and value.startswith("_"):
            # Both stores answer `_local` and `_design` documents by key: they are the store's.
            raise Invalid("a document id of ASO's, not a _local one or another starting with _")
        check_json(value, "the key")
        if len(dumps(value)) > MAX_KEY_CHARS:
            raise Invalid(f"a JSON value of at most {MAX_KEY_CHARS} characters")
        return value

    def to_text(self, value: Any) -> str:
        return dumps(value)

    def schema(self) -> dict[str, Any]:
        if self.strings:
            string = {"type": "string", "maxLength": MAX_KEY_CHARS}
            return {**string, "not": {"pattern": "^_"}} if self.documents else string
        return {"description": "a JSON value (in a query: as JSON text)"}


@dataclass(frozen=True)
class Listed(Value):
    """A JSON list of values of one kind, at most `most` of them."""

    item: Value
    most: int = MAX_KEYS

    def from_text(self, text: str) -> list[Any]:
        return self.from_json(parse_json(text.encode("utf-8"), "the list"))

    def from_json(self, value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise Invalid(f"a JSON list of at most {self.most} items")
        if len(value) > self.most:
            raise Invalid(f"a JSON list of at most {self.most} items, not {len(value)}")
        out = []
        for index, item in enumerate(value):
            try:
                out.append(self.item.from_json(item))
            except Invalid as exc:
                raise Invalid(f"a list whose items are each {exc} (item {index} is not)") from None
        # A key named twice is read twice: 100 copies of a key matching 40 large requests had
        # made the embedded store build an answer of 850 MB, and die.
        seen: set[str] = set()
        for index, item in enumerate(out):
            text = dumps(item)
            if text in seen:
                raise Invalid(f"a JSON list of distinct items (item {index} repeats one)")
            seen.add(text)
        return out

    def to_text(self, value: Any) -> str:
        return dumps(value)

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "maxItems": self.most, "uniqueItems": True,
                "items": self.item.schema()}  # fmt: skip


REV = Text(REV_PATTERN, "a revision N-<32 hex digits> as the store handed it out")
SEQ = Text(SEQ_PATTERN, "an update sequence as the store handed it out, 0 or now")
REQUEST_ID = Text(model.DOC_ID_PATTERN, "a request id: sha256 of its source LFN, 64 hex digits")
USER_DOC_ID = Text(
    f"^(?:{model.DOC_ID_PATTERN[1:-1]}|{model.HOLD_ID_PATTERN[1:-1]})$",
    "a request id (sha256 of its source LFN, 64 hex digits) or a hold's id (hold:SITE:USER)",
)
DOC_ID = Text(
    DOC_ID_PATTERN, "a document id of ASO's, not starting with _ (at most 512 characters)"
)
ATTACHMENT = Text(ATTACHMENT_PATTERN, "a file of the monitoring pages")
SUBSCRIPTION_ID = Text(model.NOTIFY_ID_PATTERN, "notify:<your user name>")
OWN_SUBSCRIPTION = "notify:"
STRING_KEY = Key(strings=True)
DOCUMENT_KEY = Key(strings=True, documents=True)


# -- JSON -----------------------------------------------------------------------------------------
def dumps(value: Any) -> str:
    """JSON as the front end sends it on: compact, and non-ASCII escaped so that what the store
    reads is what was checked, byte for byte, on both stores."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            # Two parsers may keep different ones: the store must see what the front end judged.
            raise Invalid(f"member {key[:100]!r} appears twice")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise Invalid(f"{name} is not a JSON value")


def _no_underflow(text: str) -> float:
    """A number literal as a double, unless a non-zero one would become 0 (`1e-400`): the
    value checked would not be the value written."""
    value = float(text)
    mantissa = text.lower().partition("e")[0]
    if value == 0 and any(digit in mantissa for digit in "123456789"):
        raise Invalid(f"{text[:40]} is too small for a double (it would be 0)")
    return value


LONG_DIGITS = re.compile(rb"[0-9]{17}")


def _safe_integer(text: str) -> int:
    """An integer literal, refused before Python converts it when JavaScript could not hold it
    (Python's own refusal of 4,300 digits and more names one of its settings)."""
    if len(text.lstrip("-")) > len(str(MAX_SAFE_INTEGER)) or abs(int(text)) > MAX_SAFE_INTEGER:
        raise Invalid(_UNSAFE_INTEGER)
    return int(text)


_UNSAFE_INTEGER = (
    f"an integer beyond JavaScript's safe range (at most {MAX_SAFE_INTEGER} either way)"
)


def parse_json(raw: bytes, what: str) -> Any:
    """`raw` as JSON: UTF-8, no NaN/Infinity, no member twice, nested at most MAX_DEPTH deep,
    at most MAX_CONTAINERS objects and lists and MAX_VALUES values (counted on the bytes first:
    a bound, since a brace or a comma inside a string counts too)."""
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > MAX_CONTAINERS:
        raise TooLarge(f"{what} holds more than {MAX_CONTAINERS} objects and lists")
    # Every value but a container's first item follows a comma.
    if containers + raw.count(b",") + 1 > MAX_VALUES:
        raise TooLarge(f"{what} holds more than {MAX_VALUES} values (objects, lists, strings, "
                       "numbers, literals)")  # fmt: skip
    if raw.startswith(codecs.BOM_UTF8):
        raise Invalid(
            f"{what} starts with a byte order mark, which JSON has none of (RFC 8259 8.1)"
        )
    try:
        text = raw.decode("utf-8")
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
            parse_float=_no_underflow,
            # Only a body with 17 digits in a row may hold an integer Python would refuse in its
            # own words: the others keep the parser's C path (a call per integer had tripled
            # the cost of a body of zeros).
            parse_int=_safe_integer if LONG_DIGITS.search(raw) else None,
        )
    except Invalid as exc:
        raise Invalid(f"{what} is not JSON the front end takes: {exc}") from None
    except RecursionError:  # the parser's own bound, far beyond ours
        raise Invalid(f"{what} is nested deeper than {MAX_DEPTH}") from None
    except UnicodeDecodeError as exc:
        raise Invalid(f"{what} is not UTF-8 (byte {exc.object[exc.start]:#04x} at offset "
                      f"{exc.start}; JSON is UTF-8: RFC 8259 8.1)") from None  # fmt: skip
    except json.JSONDecodeError as exc:
        raise Invalid(f"{what} is not JSON: {_json_fault(exc)}") from None
    except ValueError as exc:
        raise Invalid(f"{what} is not JSON: {str(exc)[:200]}") from None
    check_json(value, what)
    return value


def _json_fault(exc: json.JSONDecodeError) -> str:
    """The parser's complaint in words a client of any language reads, with where (a
    character's offset from 0)."""
    fault = {"Extra data": "something follows the JSON value"}.get(exc.msg, exc.msg[:100])
    return f"{fault} (at character {exc.pos})"


def check_json(value: Any, what: str) -> None:
    """Nesting at most MAX_DEPTH, strings valid Unicode (no lone surrogate), finite numbers,
    integers a double holds (CouchDB's JavaScript had answered 10**4200 with a 500), no -0.0.
    Scalars are judged where their container is read, not queued one by one (a body of 250k
    zeros had taken 0.2 s of the interpreter that serves every client)."""
    # (container, how many containers hold it): the value itself in a list of its own.
    pending: list[tuple[Any, int]] = [([value], -1)]
    while pending:
        container, depth = pending.pop()
        if isinstance(container, dict):
            for key in container:
                _check_string(key, what)
            items = container.values()
        else:
            items = container
        for item in items:
            kind = type(item)
            if kind is dict or kind is list or isinstance(item, (dict, list)):
                if depth + 1 >= MAX_DEPTH:  # `depth + 1` containers hold it: one too many
                    raise Invalid(f"{what} is nested deeper than {MAX_DEPTH}")
                pending.append((item, depth + 1))
            elif kind is str or isinstance(item, str):
                _check_string(item, what)
            elif kind is float:
                _check_float(item, what)
            elif kind is int and abs(item) > MAX_SAFE_INTEGER:
                raise Invalid(f"{what} holds {_UNSAFE_INTEGER}")


def _check_float(number: float, what: str) -> None:
    if not math.isfinite(number):
        raise Invalid(f"{what} holds a number that is not finite")
    if number == 0 and math.copysign(1.0, number) < 0:
        # JavaScript writes it 0 and takes it >= 0: a size of -0.0 was recorded.
        raise Invalid(f"{what} holds -0.0 (write 0)")


def _check_string(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise Invalid(
            f"{what} holds a string that is not valid Unicode (a lone surrogate)"
        ) from None


# -- bodies ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Body:
    """What a route's body must be; `read` gives the value re-serialised for the store."""

    description: str = ""

    def read(self, data: Any, url_id: str | None) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class Document(Body):
    """One document: a JSON object with `_id` of `ids`, and of the store's members only
    `members` (the store would act on any other: `_deleted` deletes, `_attachments` uploads)."""

    ids: Text = DOC_ID
    members: tuple[str, ...] = ("_id", "_rev")
    schema_ref: str = ""
    # its own fields as JSON, in characters (aso/limits.py: the bound of a written document)
    max_chars: int = MAX_WRITTEN_DOC_CHARS
    # members at most (a request: its schema's fields and the store's `_id`, `_rev`): the store
    # judges each member in JavaScript, and 1000 documents of 990 members each, every one
    # refused, had kept it busy 9 s a request
    max_members: int | None = None

    def read(self, data: Any, url_id: str | None, what: str = "the document") -> dict[str, Any]:
        if not isinstance(data, dict):
            raise Invalid(f"{what} must be a JSON object")
        if self.max_members is not None and len(data) > self.max_members:
            raise Invalid(f"{what} has {len(data)} members; a transfer request has at most "
                          f"{self.max_members} (its schema's fields, _id and _rev)")  # fmt: skip
        special = sorted(k for k in data if k.startswith("_") and k not in self.members)
        if special:
            raise Invalid(
                f"{what}: {special[0][:100]!r} is not a member the front end takes "
                f"(of the store's: {', '.join(self.members)})"
            )
        if "__proto__" in _all_keys(data):
            raise Invalid(f"{what} has a member named __proto__, which the store would drop")
        doc_id = data.get("_id", url_id)
        if doc_id is None:
            raise Invalid(f"{what} needs an _id")
        if url_id is not None and doc_id != url_id:
            raise Invalid(f"{what}: _id differs from the URL's")
        for member, kind, value in (("_id", self.ids, doc_id), ("_rev", REV, data.get("_rev")),
                                    ("_deleted", Flag(), data.get("_deleted"))):  # fmt: skip
            if member == "_id" or member in data:
                try:
                    kind.from_json(value)
                except Invalid as exc:
                    raise Invalid(f"{what}: {member} must be {exc}") from None
        if _larger_than(data, self.max_chars):
            raise TooLarge(f"{what} is larger than {self.max_chars} characters as JSON (its "
                           "fields but the store's _ members)")  # fmt: skip
        return {"_id": doc_id, **{k: v for k, v in data.items() if k != "_id"}}

    def schema(self) -> dict[str, Any]:
        if self.schema_ref:
            return {"$ref": self.schema_ref}
        return {
            "type": "object",
            "required": ["_id"],
            "properties": {"_id": self.ids.schema(), "_rev": REV.schema()},
        }


@dataclass(frozen=True)
class Bulk(Body):
    """`{"docs": [...]}`: at most MAX_DOCS documents, each id once (a second write of one id in
    one batch is judged against the first's parent by the embedded store)."""

    doc: Document = field(default_factory=Document)

    def read(self, data: Any, url_id: str | None) -> dict[str, Any]:
        if (
            not isinstance(data, dict)
            or set(data) != {"docs"}
            or not isinstance(data["docs"], list)
        ):
            raise Invalid('_bulk_docs takes {"docs": [documents]} and nothing else')
        docs = data["docs"]
        if len(docs) > MAX_DOCS:
            raise Invalid(f"_bulk_docs takes at most {MAX_DOCS} documents, not {len(docs)}")
        out, seen = [], set()
        for index, doc in enumerate(docs):
            checked = self.doc.read(doc, None, f"docs[{index}]")
            if checked["_id"] in seen:
                raise Invalid(f"docs[{index}]: _id {checked['_id'][:100]!r} appears twice")
            seen.add(checked["_id"])
            out.append(checked)
        return {"docs": out}

    def schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "required": ["docs"],
            "additionalProperties": False,
            "properties": {
                "docs": {"type": "array", "maxItems": MAX_DOCS, "items": self.doc.schema()}
            },
        }


@dataclass(frozen=True)
class Options(Body):
    """An object of the route's own parameters (a view's, `_all_docs'`, `_changes'`), typed as
    in the query."""

    params: Mapping[str, Value] = field(default_factory=dict)

    def read(self, data: Any, url_id: str | None) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise Invalid("the body must be a JSON object of options")
        out = {}
        for name, value in data.items():
            kind = self.params.get(name)
            if kind is None:
                raise Invalid(
                    f"{name[:100]!r} is not an option taken here "
                    f"({', '.join(self.params) or 'none'})"
                )
            try:
                out[name] = kind.from_json(value)
            except Invalid as exc:
                raise Invalid(f"option {name[:100]} must be {exc}") from None
        return out

    def schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "additionalProperties": False,
            "properties": {n: v.schema() for n, v in self.params.items()},
        }


def _larger_than(doc: dict[str, Any], bound: int) -> bool:
    """Whether a document is larger than `bound` as model.doc_chars measures it (JSON.stringify
    of its own fields, in UTF-16 units). Python's JSON gives that length but for floats, which
    Python writes longer (5.0, 1e-07): the exact, slower measure is taken only past the bound."""
    own = {k: v for k, v in doc.items() if not k.startswith("_")}
    quick = len(json.dumps(own, ensure_ascii=False, separators=(",", ":"), allow_nan=False))
    return quick > bound and model.doc_chars(doc) > bound


def _all_keys(value: Any) -> Iterable[str]:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            yield from item
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


# -- routes ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Var:
    """A typed path segment."""

    name: str
    value: Text


Segment = str | Var


@dataclass(frozen=True)
class Route:
    name: str  # the operationId
    method: str
    path: tuple[Segment, ...]
    audiences: frozenset[str]
    summary: str
    query: Mapping[str, Value] = field(default_factory=dict)
    body: Body | None = None
    # the query parameters this route always sends the store (a long poll's bound)
    fixed: Mapping[str, str] = field(default_factory=dict)
    kind: str = "read"  # read | write | create (its conflicts are explained) | poll
    tag: str = ""
    # (a, b): parameter a only with parameter b; (a, "!b"): a never with b
    rules: tuple[tuple[str, str], ...] = ()
    # the store's answer is JSON, asked for as such (with `Accept: */*` a store says text/plain)
    json: bool = True
    # a user's own document only: the path's doc_id must be this prefix and the caller's name
    own: str = ""

    @property
    def template(self) -> str:
        return "/" + "/".join(s if isinstance(s, str) else "{" + s.name + "}" for s in self.path)


def _view_params(reduces: bool, by_keys: bool) -> dict[str, Value]:
    params: dict[str, Value] = {
        **dict.fromkeys(("key", "startkey", "start_key", "endkey", "end_key"), Key()),
        **({"keys": Listed(Key())} if by_keys else {}),
        **dict.fromkeys(("descending", "include_docs", "inclusive_end", "update_seq"), Flag()),
        "limit": Count(0, MAX_LIMIT),
        "skip": Count(0, MAX_SKIP),
        # Freshness: the embedded store reads stale/update_after, CouchDB stable/update.
        "stale": Choice(("ok", "update_after")),
        "stable": Flag(),
        "update": Choice(("true", "false", "lazy")),
    }
    if reduces:  # a map-only view answers reduce=true with 400 on CouchDB, map rows elsewhere
        params.update(reduce=Flag(), group=Flag(), group_level=Count(0, 16))
    return params


ALL_DOCS_PARAMS: dict[str, Value] = {
    "key": DOCUMENT_KEY,
    **dict.fromkeys(("startkey", "start_key", "endkey", "end_key"), STRING_KEY),
    "keys": Listed(DOCUMENT_KEY),
    **dict.fromkeys(("descending", "include_docs", "inclusive_end", "conflicts"), Flag()),
    "limit": Count(0, MAX_LIMIT),
    "skip": Count(0, MAX_SKIP),
}
CHANGES_PARAMS: dict[str, Value] = {
    "feed": Choice(FEEDS),
    "since": SEQ,
    "limit": Count(0, MAX_LIMIT),
    "timeout": Count(0, MAX_POLL_MS),
    "heartbeat": Count(1000, MAX_POLL_MS),
    "include_docs": Flag(),
    # Only the built-in filter by id: the others killed the embedded store
    # (EMBEDDED_CHANGES_FILTER_CRASH).
    "filter": Choice(("_doc_ids",)),
    "doc_ids": Listed(DOC_ID),
}
# open_revs=all&latest=true: a cluster's conflicting branches (Database.leaves).
DOC_READ_PARAMS: dict[str, Value] = {
    "rev": REV,
    "conflicts": Flag(),
    "open_revs": Choice(("all",)),
    "latest": Flag(),
}
# Parameters that only mean something with another (`latest` with a `rev` killed the embedded
# store), and pairs that exclude each other.
DOC_READ_RULES = (("latest", "open_revs"), ("open_revs", "!rev"), ("open_revs", "!conflicts"))
# A view's key may match any number of rows, so a read by keys carries no documents: the embedded
# store fetches the documents of every row matched before it applies a limit. Documents by id:
# `_all_docs` with keys (EMBEDDED_KEYS_READ_WHOLE).
VIEW_RULES = (("include_docs", "!keys"),)
# The views whose key ends with the document's id: a key names one row, so a read by `keys` costs
# what its keys do (the cursor's `POST V/by_task {"keys": [...]}`, docs/status-api.md). They are
# the only views users may read by keys: on any other a key may name every row of the view, all
# read before the limit (EMBEDDED_KEYS_READ_WHOLE), holding the view for everyone; read those by
# `key` or by range. The services' views read by keys are heavy reads (gate.py _unpaged).
ONE_ROW_A_KEY = frozenset({("asyncstageout", "by_task"), ("users", "failures")})
CHANGES_RULES = (("filter", "doc_ids"), ("doc_ids", "filter"), ("heartbeat", "feed"))


@dataclass(frozen=True)
class Design:
    """A design document of a database: its name and views (name → has a reduce)."""

    name: str
    views: Mapping[str, bool]
    audiences: frozenset[str]


@dataclass(frozen=True)
class Db:
    key: str  # files, transfers, catalog, stats, pages
    name: str
    readers: frozenset[str]
    writers: frozenset[str]
    designs: tuple[Design, ...]


def databases(config: Config) -> tuple[Db, ...]:
    """ASO's databases as the front end serves them: who reads and writes each, and which
    design documents' views."""
    from aso.provision.store_check import (
        expected_databases,  # the design documents `aso db init` pushes
    )

    store = config.store
    specs = expected_databases(config)
    # Users follow their files and the pages read the monitoring summaries; the transfer
    # service's job table and the catalog are the agents' (a forged "done" job would be trusted).
    user_views = {"asyncstageout", "users"}
    plan: tuple[tuple[str, str, frozenset[str], frozenset[str], set[str]], ...] = (
        ("files", store.files_db, EVERYONE, EVERYONE, user_views),
        ("stats", store.stats_db, EVERYONE, SERVICES, set()),
        ("transfers", store.transfers_db, SERVICES, SERVICES, set()),
        ("catalog", store.catalog_db, SERVICES, SERVICES, set()),
        # users' subscriptions hold their webhooks' secrets: a user reaches their own alone
        # (_notify_routes)
        ("notify", store.notify_db, SERVICES, SERVICES, set()),
    )
    out = []
    for key, name, readers, writers, for_users in plan:
        designs = tuple(
            Design(
                ddoc["_id"].removeprefix("_design/"),
                {v: "reduce" in spec for v, spec in sorted(ddoc.get("views", {}).items())},
                EVERYONE if ddoc["_id"].removeprefix("_design/") in for_users else SERVICES,
            )
            for ddoc in specs[name].design
        )
        out.append(Db(key, name, readers, writers, designs))
    return tuple(out)


def _db_routes(db: Db) -> list[Route]:
    """A database's documents, bulk writes, `_all_docs`, `_changes` and views."""
    n, tag = db.name, db.key
    files = db.key == "files"
    routes = [
        Route(
            f"{tag}Info",
            "GET",
            (n,),
            db.readers,
            f"The {tag} database's information "
            "(its update_seq: where a status client starts following).",
            tag=tag,
        ),
        Route(
            f"{tag}Get",
            "GET",
            (n, Var("doc_id", DOC_ID)),
            db.readers,
            "One document as stored (open_revs=all&latest=true: every live leaf).",
            DOC_READ_PARAMS,
            tag=tag,
            rules=DOC_READ_RULES,
        ),
        Route(
            f"{tag}AllDocs",
            "GET",
            (n, "_all_docs"),
            db.readers,
            "Documents by id or id range.",
            ALL_DOCS_PARAMS,
            tag=tag,
        ),
        Route(
            f"{tag}AllDocsPost",
            "POST",
            (n, "_all_docs"),
            db.readers,
            "Documents by ids (keys) or id range, options in the body.",
            ALL_DOCS_PARAMS,
            Options(params=ALL_DOCS_PARAMS),
            tag=tag,
        ),
        Route(
            f"{tag}Changes",
            "GET",
            (n, "_changes"),
            db.readers,
            f"The changes feed: a batch, or a long poll of at most {MAX_POLL_MS // 1000} s.",
            CHANGES_PARAMS,
            kind="poll",
            tag=tag,
            rules=CHANGES_RULES,
        ),
        Route(
            f"{tag}ChangesPost",
            "POST",
            (n, "_changes"),
            db.readers,
            "The changes feed of the given document ids (doc_ids in the body).",
            CHANGES_PARAMS,
            Options(params={"doc_ids": Listed(DOC_ID)}),
            kind="poll",
            tag=tag,
            rules=CHANGES_RULES,
        ),
    ]
    service_writers = SERVICES & db.writers
    if service_writers:
        doc = Document(members=("_id", "_rev", "_deleted"))
        routes += [
            Route(
                f"{tag}Put",
                "PUT",
                (n, Var("doc_id", DOC_ID)),
                service_writers,
                "Write one document (with _rev to update).",
                body=doc,
                kind="write",
                tag=tag,
            ),
            Route(
                f"{tag}Delete",
                "DELETE",
                (n, Var("doc_id", DOC_ID)),
                service_writers,
                "Delete one revision of a document.",
                {"rev": REV},
                kind="write",
                tag=tag,
            ),
            Route(
                f"{tag}Bulk",
                "POST",
                (n, "_bulk_docs"),
                service_writers,
                f"Write up to {MAX_DOCS} documents, a result each.",
                body=Bulk(doc=doc),
                kind="write",
                tag=tag,
            ),
        ]
    if files:
        request = Document(ids=REQUEST_ID, schema_ref="#/components/schemas/TransferRequest",
                           max_chars=model.MAX_DOC_CHARS,
                           max_members=len(model.REQUEST_SCHEMA["fields"]) + 2)  # fmt: skip
        # A user's one document by id: a request, or a hold on their files to release or cancel.
        own = Document(ids=USER_DOC_ID, schema_ref="#/components/schemas/UserDocument",
                       max_chars=model.MAX_DOC_CHARS,
                       max_members=max(len(model.REQUEST_SCHEMA["fields"]),
                                       len(model.HOLD_SCHEMA["fields"])) + 2)  # fmt: skip
        users = frozenset({USER})
        routes += [
            Route(
                "recordRequest",
                "POST",
                (n,),
                users,
                "Record one transfer request (its owner only; `aso upload` uses _bulk_docs).",
                body=request,
                kind="create",
                tag=tag,
            ),
            Route(
                "writeRequest",
                "PUT",
                (n, Var("doc_id", USER_DOC_ID)),
                users,
                "Create a request, or update it (with _rev) as the rules allow: kill, "
                "resubmit, reset a failed publication, renew for a job retry; or release or "
                "cancel a hold on the user's files (a Hold, with _rev).",
                body=own,
                kind="create",
                tag=tag,
            ),
            Route(
                "recordRequests",
                "POST",
                (n, "_bulk_docs"),
                users,
                f"Record (or update) up to {MAX_DOCS} transfer requests, a result each.",
                body=Bulk(doc=request),
                kind="create",
                tag=tag,
            ),
        ]
    if db.key == "notify":
        routes += _notify_routes(n, tag)
    for design in db.designs:
        for view, reduces in design.views.items():
            by_keys = USER not in design.audiences or (design.name, view) in ONE_ROW_A_KEY
            params = _view_params(reduces, by_keys)
            path = (n, "_design", design.name, "_view", view)
            audiences = design.audiences & db.readers
            routes += [
                Route(
                    f"{tag}View_{design.name}_{view}",
                    "GET",
                    path,
                    audiences,
                    f"View {design.name}/{view}.",
                    params,
                    tag=tag,
                    rules=VIEW_RULES,
                ),
                Route(
                    f"{tag}ViewPost_{design.name}_{view}",
                    "POST",
                    path,
                    audiences,
                    f"View {design.name}/{view}, options (keys) in the body.",
                    params,
                    Options(params=params),
                    tag=tag,
                    rules=VIEW_RULES,
                ),
            ]
    return routes


def _notify_routes(n: str, tag: str) -> list[Route]:
    """A user's own subscription to notices (`aso notify`): read and written by its id,
    notify:<the caller's name>; another's id is refused (403) before the store is asked."""
    users = frozenset({USER})
    body = Document(ids=SUBSCRIPTION_ID, schema_ref="#/components/schemas/Subscription",
                    max_chars=model.MAX_DOC_CHARS,
                    max_members=len(model.SUBSCRIPTION_SCHEMA["fields"]) + 2)  # fmt: skip
    path = (n, Var("doc_id", SUBSCRIPTION_ID))
    return [
        Route(
            "notifyOwnGet",
            "GET",
            path,
            users,
            "Your own subscription to notices.",
            tag=tag,
            own=OWN_SUBSCRIPTION,
        ),
        Route(
            "notifyOwnPut",
            "PUT",
            path,
            users,
            "Write your own subscription to notices (with _rev to update): where to tell you "
            "(mail, webhook, mattermost; the operator's allowlists say which addresses are "
            "told) and of which events.",
            body=body,
            kind="create",
            tag=tag,
            own=OWN_SUBSCRIPTION,
        ),
    ]


def _pages_routes(config: Config) -> list[Route]:
    from aso.provision.designdocs import PAGES_DDOC, pages_design

    pages = config.store.pages_db
    name = PAGES_DDOC.removeprefix("_design/")
    files = sorted(pages_design(config).get("_attachments", {}))
    attachment = Text("^(" + "|".join(re.escape(f) for f in files) + ")$", "a file of the pages")
    return [
        Route(
            "pagesDesign",
            "GET",
            (pages, "_design", name),
            EVERYONE,
            "The monitoring pages' design document (their settings).",
            tag="pages",
        ),
        Route(
            "pagesFile",
            "GET",
            (pages, "_design", name, Var("file", attachment)),
            EVERYONE,
            "A file of the monitoring pages (served with the store's Content-Security-Policy).",
            tag="pages",
            json=False,
        ),
    ]


def _server_routes() -> list[Route]:
    return [
        Route(
            "welcome",
            "GET",
            (),
            EVERYONE,
            "The store's welcome (its vendor and version).",
            tag="server",
        ),
        Route(
            "session",
            "GET",
            ("_session",),
            EVERYONE,
            "Who the front end says the client is: the user its certificate maps to.",
            tag="server",
        ),
    ]


def table(config: Config) -> tuple[Route, ...]:
    """Every route the front end serves for `config` (its databases, design documents and
    pages). Per audience, a method and a path template lead to one route."""
    routes = _server_routes() + _pages_routes(config)
    for db in databases(config):
        routes += _db_routes(db)
    names = [r.name for r in routes]
    assert len(names) == len(set(names)), "route names are operationIds: each once"
    for audience in AUDIENCES:
        shapes = [(r.method, r.template) for r in routes if audience in r.audiences]
        assert len(shapes) == len(set(shapes)), f"two routes of one shape for {audience}"
    return tuple(routes)


def served_to(routes: Sequence[Route], audience: str) -> list[Route]:
    return [r for r in routes if audience in r.audiences]


def describe(value: Value) -> str:
    """A parameter's type in words, for docs/security.md's tables."""
    named = {REV: "a revision", SEQ: "an update sequence", DOC_ID: "a document id (no leading _)",
             REQUEST_ID: "a request id (64 hex)",
             USER_DOC_ID: "a request id (64 hex) or a hold's id (hold:SITE:USER)",
             SUBSCRIPTION_ID: "notify:<the caller's name>",
             STRING_KEY: "a JSON string",
             DOCUMENT_KEY: "a JSON string not starting with _"}  # fmt: skip
    for known, words in named.items():
        if value is known:
            return words
    if isinstance(value, Flag):
        return "true or false"
    if isinstance(value, Count):
        return f"{value.low}..{value.high}"
    if isinstance(value, Choice):
        return " or ".join(value.choices)
    if isinstance(value, Key):
        return f"a JSON value (at most {MAX_KEY_CHARS} characters)"
    if isinstance(value, Listed):
        return f"a list of at most {value.most} of: {describe(value.item)}"
    if isinstance(value, Text):
        return value.meaning
    return type(value).__name__
