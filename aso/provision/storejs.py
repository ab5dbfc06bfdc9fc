"""The store's own JavaScript run in QuickJS, as the stores run it: the design documents `aso db
init` pushes (designdocs assembles them from couchapp/), in the environment a CouchDB query
server gives their functions (`require` of the design document's CommonJS modules, `emit`, `sum`,
`log`, `isArray`, `toJSON`, validate_doc_update's four arguments).

ASO judges an upload with lib/schema.js and lib/owner.js before it sends it (`request_refusal`,
`owner_refusal`), the front end reads group roles and the deleter temporary areas with
lib/owner.js, and the tests judge writes and map documents with the same files: one source for
each rule.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import quickjs

from aso.config import Config
from aso.model import Refusal, request_id
from aso.monitoring import statistics
from aso.provision import designdocs

Doc = Mapping[str, Any]
FILES_DDOC = "_design/asyncstageout"
# What a CouchDB query server gives a design document's functions (couchjs's main.js, util.js).
ENVIRONMENT = r"""
var __emitted = [];
function emit(key, value) { __emitted.push([key, value === undefined ? null : value]); }
function log(message) {}
function isArray(value) { return Array.isArray(value); }
function toJSON(value) { return JSON.stringify(value); }
function sum(values) {
  var s = 0;
  for (var i = 0; i < values.length; i++) { s += values[i]; }
  return s;
}

function __requireIn(ddoc) {
  var cache = {};
  return function require(path) {
    if (cache.hasOwnProperty(path)) { return cache[path].exports; }
    var source = ddoc, parts = path.split('/');
    for (var i = 0; i < parts.length && source !== undefined; i++) { source = source[parts[i]]; }
    if (typeof source !== 'string') { throw new Error('require: no module ' + path); }
    var module = {id: path, exports: {}};
    cache[path] = module;
    (new Function('module', 'exports', 'require', source))(module, module.exports, require);
    return module.exports;
  };
}

function __compile(ddoc, source) {
  var compile = new Function('require', 'emit', 'log', 'isArray', 'toJSON', 'sum',
                             'return (' + source + ');');
  return compile(__requireIn(ddoc), emit, log, isArray, toJSON, sum);
}

var __ddoc = null, __validate = null, __maps = {}, __hostNow = Date.now;

function __load(ddocJson) {
  __ddoc = JSON.parse(ddocJson);
  __validate = __ddoc.validate_doc_update ? __compile(__ddoc, __ddoc.validate_doc_update) : null;
  var views = __ddoc.views || {};
  for (var name in views) {
    if (!views.hasOwnProperty(name)) { continue; }
    __maps[name] = __compile(__ddoc, views[name].map);
  }
}

// A verdict as JSON: {"ok": true} or {"thrown": what the function threw}.
function __validateJson(newJson, oldJson, userCtxJson, secObjJson, nowMs) {
  Date.now = nowMs === null ? __hostNow : function () { return nowMs; };
  try {
    __validate(JSON.parse(newJson), JSON.parse(oldJson), JSON.parse(userCtxJson),
               JSON.parse(secObjJson));
    return JSON.stringify({ok: true});
  } catch (thrown) {
    return JSON.stringify({thrown: thrown instanceof Error ? {error: String(thrown)} : thrown});
  }
}

function __mapJson(name, docJson) {
  __emitted = [];
  __maps[name](JSON.parse(docJson));
  return JSON.stringify(__emitted);
}

// lib/schema.js's verdict on a request, as __validateJson's.
var __schema = null;
function __checkRequestJson(docJson, creation) {
  try {
    if (__schema === null) {
      var require = __requireIn(__ddoc);
      var hash = typeof __hostRequestId === 'undefined' ? require('lib/sha256').hex
                                                        : __hostRequestId;
      __schema = require('lib/schema')(require('lib/model'), hash);
    }
    __schema.checkRequest(JSON.parse(docJson), creation);
    return JSON.stringify({ok: true});
  } catch (thrown) {
    return JSON.stringify({thrown: thrown instanceof Error ? {error: String(thrown)} : thrown});
  }
}

// lib/owner.js's function `name` over the arguments `argsJson`, its answer as JSON.
var __ownership = null;
function __ownershipJson(name, argsJson) {
  if (__ownership === null) {
    var require = __requireIn(__ddoc);
    __ownership = require('lib/owner')(require('lib/model'));
  }
  return JSON.stringify(__ownership[name].apply(null, JSON.parse(argsJson)));
}
"""
RULE = re.compile(r"^\[([\w-]+)\] (.*)$", re.S)
# One thread at a time in QuickJS, whatever the context: the binding lets go of Python's lock
# while a function runs, and two threads in it at once abort the process (the simulator's
# uploaders, eight threads judging their uploads, did).
ENGINE = threading.Lock()
TIME_LIMIT = 10  # seconds a call may run (a loop in a function must not hang the tests)
MEMORY_LIMIT = 512 << 20


class DesignDocument:
    """One design document's functions in a QuickJS context of their own."""

    def __init__(self, ddoc: Mapping[str, Any], time_limit: float | None = TIME_LIMIT):
        """`time_limit`: seconds a call may run; None for the one ASO judges uploads with, which
        computes the request id's hash as aso/model.py does (hashlib; QuickJS calls no Python
        function under a time limit) instead of lib/sha256.js, what the stores run, 300 us a
        call here. Its functions are ASO's own, each bounded by the schema's limits."""
        self.ddoc = ddoc
        with ENGINE:
            self.context = quickjs.Context()
            self.context.set_memory_limit(MEMORY_LIMIT)
            if time_limit is None:
                self.context.add_callable("__hostRequestId", request_id)
            else:
                self.context.set_time_limit(time_limit)
            self.context.eval(ENVIRONMENT)
            self.context.eval("__load")(json.dumps(ddoc))

    def _call(self, function: str, *args: Any) -> Any:
        """`function` of the environment called with `args`, in the engine's turn."""
        with ENGINE:
            return self.context.eval(function)(*args)

    def validate(self, new: Doc, old: Doc | None, user_ctx: Doc, *context: Any) -> None:
        """Returns when validate_doc_update lets the write through; raises Refusal with the
        store's reason ("[rule] message" split in two) otherwise. A document without an `_id`
        is given one first, as both stores do for a POST before they validate it. `context`:
        the security object and the store's clock, as `verdict` takes them."""
        refusal = self.verdict(new, old, user_ctx, *context)
        if refusal is not None:
            raise as_refusal(refusal)

    def verdict(
        self, new: Doc, old: Doc | None, user_ctx: Doc, sec_obj: Doc | None = None, now: Any = None
    ) -> tuple[str, str] | None:
        """validate_doc_update's verdict as the store answers it: None (written), or the error
        ("forbidden": 403, "unauthorized": 401) and its reason, the text the function threw;
        `now`: the store's clock (None: this host's)."""
        if "_id" not in new:
            new = {**new, "_id": uuid.uuid4().hex}
        verdict = json.loads(
            self._call(
                "__validateJson",
                json.dumps(new),
                json.dumps(old),
                json.dumps(user_ctx),
                json.dumps(sec_obj or {}),
                None if now is None else now * 1000,
            )
        )
        return _refusal_of(verdict)

    def check_request(self, doc_json: str, creation: bool) -> Refusal | None:
        """lib/schema.js's verdict on the request `doc_json` (see request_refusal)."""
        verdict = json.loads(self._call("__checkRequestJson", doc_json, creation))
        refusal = _refusal_of(verdict)
        return None if refusal is None else as_refusal(refusal)

    def ownership(self, function: str, *args: Any) -> Any:
        """lib/owner.js's `function` called with `args`."""
        return json.loads(self._call("__ownershipJson", function, json.dumps(args)))

    def map(self, view: str, doc: Mapping[str, Any]) -> list[tuple[Any, Any]]:
        """The (key, value) rows the view's map function emits for `doc`."""
        rows = json.loads(self._call("__mapJson", view, json.dumps(doc)))
        return [(key, value) for key, value in rows]

    def reduce(self, view: str, values: Sequence[Any]) -> Any:
        """The view's reduce over `values` (its map rows' values, reduced at once: no
        rereduce). ASO's views reduce with CouchDB's builtins only, computed here as CouchDB's
        query server does; a JavaScript reduce would need its rereduce modelled too."""
        source = self.ddoc["views"][view]["reduce"].strip()
        if source not in BUILTIN_REDUCE:
            raise NotImplementedError(f"{view}: only the builtin reduces are run, not {source!r}")
        return BUILTIN_REDUCE[source](list(values))


def _sum(values: list[Any]) -> Any:
    """`_sum`: numbers added; arrays added member by member (the shorter padded with 0);
    objects added key by key."""
    if all(isinstance(v, list) for v in values):
        width = max((len(v) for v in values), default=0)
        return [_sum([v[i] for v in values if i < len(v)]) for i in range(width)]
    if all(isinstance(v, dict) for v in values):
        keys = dict.fromkeys(k for v in values for k in v)
        return {k: _sum([v[k] for v in values if k in v]) for k in keys}
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ValueError(f"_sum of values that are not all numbers, arrays or objects: {values}")
    return sum(values)


def _stats(values: list[Any]) -> Any:
    """`_stats` of numbers (arrays of numbers: the stats of each member)."""
    if values and all(isinstance(v, list) for v in values):
        return [_stats([v[i] for v in values]) for i in range(len(values[0]))]
    return {
        "sum": sum(values),
        "count": len(values),
        "min": min(values),
        "max": max(values),
        "sumsqr": sum(v * v for v in values),
    }


BUILTIN_REDUCE = {"_count": len, "_sum": _sum, "_stats": _stats}


def _refusal_of(verdict: Mapping[str, Any]) -> tuple[str, str] | None:
    """A verdict's refusal: the error ("forbidden": 403, "unauthorized": 401) and the text the
    function threw; None when it let the write through."""
    if verdict.get("ok"):
        return None
    thrown = verdict["thrown"]
    for error in ("forbidden", "unauthorized"):
        text = thrown.get(error) if isinstance(thrown, dict) else None
        if isinstance(text, str):
            return error, text
    raise AssertionError(f"the store's JavaScript threw no refusal: {thrown!r}")


def as_refusal(refusal: tuple[str, str]) -> Refusal:
    """A thrown refusal as the model's: "[rule] message" split in two."""
    rule = RULE.match(refusal[1])
    return Refusal(*rule.groups()) if rule else Refusal("unauthorized", refusal[1])


def files_design(config: Config, time_limit: float | None = TIME_LIMIT) -> DesignDocument:
    """The files database's design document as `aso db init` pushes it for `config`."""
    [ddoc] = [d for d in designdocs.design_documents(config) if d["_id"] == FILES_DDOC]
    return DesignDocument(ddoc, time_limit)


T = TypeVar("T")
_MAKING = threading.Lock()


def _made_once(make: Callable[[], T]) -> Callable[[], T]:
    """What `make` makes, made once whatever the threads (functools.cache alone may call it
    twice at once: a QuickJS context is costly to make)."""
    cached = functools.cache(make)

    def made() -> T:
        with _MAKING:
            return cached()

    return made


# The design document lib/schema.js and lib/owner.js are run from (neither depends on the
# configuration: the sites are judged after them).
_schema_design = _made_once(lambda: files_design(Config(), time_limit=None))


def request_refusal(doc: Any, *, creation: bool = True) -> Refusal | None:
    """Why `doc` is no request of the schema (lib/schema.js: type, size, fields, id, publication
    intent), in the store's words; None when it is one. `creation`: `doc` is to be created, so
    its id must be the request id of its source_lfn."""
    if not isinstance(doc, Mapping):
        return Refusal("schema", "a request must be a JSON object")
    try:
        text = json.dumps(doc, allow_nan=False)
    except ValueError:
        return Refusal("schema", "a number is not finite (NaN or Infinity): JSON has none")
    return _schema_design().check_request(text, creation)


def granted_groups(roles: Any) -> list[str]:
    """The groups whose areas `roles` grant (`group:<group>`), as the store judges them."""
    return list(_schema_design().ownership("grantedGroups", roles))


def in_temp_area(name: str, lfn: str) -> bool:
    """`lfn` is in user `name`'s temporary area, as the store judges it."""
    return bool(_schema_design().ownership("inTempArea", name, lfn))


def owner_refusal(doc: Mapping[str, Any]) -> Refusal | None:
    """Why the owner of `doc`, a request of the schema, may not create it, in the store's words:
    another user's task, a priority above the owner's (lib/owner.js); None when they may. The
    store judges the namespaces (the owner's group roles), the sites and the clock as well."""
    design = _schema_design()
    task = design.ownership("taskRefusal", doc["task"], doc["user"])
    if task is not None:
        return Refusal("task", task)
    priority = design.ownership("priorityRefusal", dict(doc))
    return None if priority is None else Refusal("create", priority)


class _Contributions:
    """couchapp/shared/statistics/contribution.js with its tables, as the live views include
    it, in a QuickJS context of its own."""

    SOURCE = designdocs.COUCHAPP_DIR / "shared" / "statistics" / "contribution.js"

    def __init__(self) -> None:
        with ENGINE:
            self.context = quickjs.Context()
            self.context.set_time_limit(TIME_LIMIT)
            self.context.set_memory_limit(MEMORY_LIMIT)
            self.context.eval(designdocs.with_tables(self.SOURCE.read_text()))
            self.context.eval(
                "function __contributionJson(t) {"
                " return JSON.stringify(contribution(JSON.parse(t))); }"
            )

    def of(self, doc_json: str) -> Any:
        with ENGINE:
            return json.loads(self.context.eval("__contributionJson")(doc_json))


_contributions = _made_once(_Contributions)


def contribution(doc: Mapping[str, Any]) -> statistics.Contribution | None:
    """What a request counts for in the statistics, as the live views count it (the same
    contribution.js); None while its copy is not over."""
    got = _contributions().of(json.dumps(doc))
    return None if got is None else statistics.Contribution.from_json(got)
