"""Hypothesis strategies and settings of the hostile-input suite (tests/test_hostile.py):
requests as jobs make them, and everything a hostile or broken client can make of them.

Profiles: "ci" (the default, what `make test` runs: bounded, derandomized, no example database)
and "long" (`make fuzz`: many more examples, random, failures kept in var/hypothesis), chosen
by ASO_HYPOTHESIS_PROFILE.
"""

from __future__ import annotations

import copy
import os
import string
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from aso import model
from tests.conftest import owned_request

PROFILE_ENV = "ASO_HYPOTHESIS_PROFILE"
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("ASO_HYPOTHESIS_EXAMPLES", "120")),
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=_SLOW_OK,
)
settings.register_profile(
    "long",
    max_examples=int(os.environ.get("ASO_HYPOTHESIS_EXAMPLES", "600")),
    deadline=None,
    database=DirectoryBasedExampleDatabase(
        Path(__file__).resolve().parent.parent / "var" / "hypothesis"
    ),
    print_blob=True,
    suppress_health_check=_SLOW_OK,
)
settings.load_profile(os.environ.get(PROFILE_ENV, "ci"))
LONG = os.environ.get(PROFILE_ENV) == "long"

USERS = ("alice", "bob")
# The default catalogue's sites (the hostile store's): generated valid requests name these;
# the mutations of a field give other names, which the store refuses as unknown.
SITES = ("T2_CH_CERN", "T2_DE_DESY", "T2_IT_Pisa")

# Names a JavaScript object already has, or that the store reads: as keys and as values.
NASTY_KEYS = ("hasOwnProperty", "__proto__", "constructor", "toString", "valueOf", "length",
              "0", "1", "10", "007", "-1", "4294967295", "", " ", "é", "😀", "a.b", "_id",
              "type", "history", "state")  # fmt: skip
VALID_KEYS = tuple(k for k in NASTY_KEYS if k != "__proto__")  # the model refuses that one
# Strings at the edges of the schema's limits and of JavaScript's view of strings.
NASTY_STRINGS = (
    "",
    "\n",
    "\x00",
    "\u2028",
    "\ud800",  # a lone surrogate
    "0a1b2c3d\n",  # `$` before a final newline matches in Python, not in JavaScript
    "0A1B2C3D",
    "/store/user/a/../b.root",
    "/store/user/./b.root",
    "/store/user/x.root\n",
    "/store/user/ü.root",
    "T2_CH_CERN\n",
    "new\n",
    "x" * 1024,
    "x" * 1025,
    "é" * 1024,
    "😀" * 512,  # 1024 UTF-16 units
    "😀" * 513,  # 513 characters, 1026 UTF-16 units
    "transfer_request",
    "heartbeat",
    "alice",
    "bob",
    *NASTY_KEYS[:6],
)
NUMBERS = (0, -0.0, 1, -1, 0.5, 5.0, 1e-320, 2**31, 2**53 - 1, 2**53, 2**53 + 1, 2**63,
           -(2**53) - 1, 1e16, 1e21, 1.7976931348623157e308, 100, 101, -100, -101)  # fmt: skip

texts = st.one_of(
    st.sampled_from(NASTY_STRINGS),
    st.text(st.characters(exclude_categories=()), max_size=24),  # surrogates included
    st.text(string.ascii_letters + string.digits + "_./-:@", max_size=24),
)
numbers = st.one_of(
    st.sampled_from(NUMBERS),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False, allow_infinity=False),
)
keys = st.one_of(st.sampled_from(NASTY_KEYS), texts)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=10,
)

_lfn_part = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)
_free = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)  # unicode, in limits


# Seconds from the store's clock: stamps inside the window an owner's stamps must be in
# (model.CLOCK_AHEAD, CLOCK_BEHIND) and outside it, each well away from its edges (the test's
# run of the validation reads the clock a moment before the store does).
INSIDE = (-86_000.0, -3600.0, -1.0, 0.0, 500.0)
OUTSIDE = (-87_000.0, -1e7, 1500.0, 1e7)
# What agents write, as they would write it (each valid for the schema): an owner forges it.
FORGED_BOOKKEEPING = {
    "attempts": [{"job_id": "j", "service": "gfal", "submitted": 1.0}],
    "lease": {"owner": "submitter-x", "until": 9e9, "job_key": "k"},
    "transfer": {"job_id": "bobs-job", "service": "gfal", "file_id": "f"},
    "retry_after": 9e9,
    "failure_reason": "",
    "error_class": "permanent",
    "cleanup_attempts": 1,
    "cleanup_retry_after": 0,
    "cleanup_error": "x",
    "publication_block": "/P/bob-x/USER#b",
    "publication_attempts": 2,
    "publication_retry_after": 1.5,
    "publication_error": "x",
}


def stamps() -> st.SearchStrategy[float]:
    """A time an owner may stamp (mostly) or may not, from now; or far from any clock."""
    inside = st.one_of(st.sampled_from(INSIDE), st.floats(INSIDE[0], INSIDE[-1]))
    offsets = st.one_of(inside, inside, st.sampled_from(OUTSIDE))
    return st.one_of(offsets.map(lambda o: model.now() + o), st.sampled_from([0.0, 9.9e12, 1.0]))


@st.composite
def requests(draw: st.DrawFn, user: Any = None) -> dict[str, Any]:
    """A valid new request as tests.conftest.owned_request makes it, with unicode where the
    schema allows it (DN, group, role, lumi runs), sizes and ids drawn over their whole range,
    and a time the store's clock allows an owner, drawn over that window."""
    user = user or draw(st.sampled_from(USERS))
    token = draw(st.lists(_lfn_part, min_size=1, max_size=3).map("/".join))
    publish = draw(st.booleans())
    file_type = draw(st.sampled_from(["output", "log"]))
    info = None
    if publish or draw(st.booleans()):
        runs = st.dictionaries(
            st.one_of(st.sampled_from(VALID_KEYS), st.from_regex(r"\A[0-9]{1,6}\Z")),
            st.lists(st.integers(0, 2**53 - 1), max_size=5),
            max_size=4,
        )
        info = {"dataset": f"/prim/{user}-proc-v1/USER", "events": draw(st.integers(0, 2**53 - 1))}
        info["lumis"] = draw(runs)
    return owned_request(
        user=user,
        task=f"261121_120000:{user}_{draw(_lfn_part)}",
        job_id=draw(st.integers(0, 10**6)),
        source=draw(st.sampled_from(SITES)),
        destination=draw(st.sampled_from(SITES)),
        source_lfn=f"/store/temp/user/{user}/{token}.root",
        destination_lfn=f"/store/user/{user}/{token}.root",
        size=draw(st.integers(0, 2**53 - 1)),
        adler32=draw(st.from_regex(r"\A[0-9a-f]{1,8}\Z")),
        file_type=file_type,
        publish=publish and file_type == "output",
        publish_info=info,
        job_retry=draw(st.integers(0, 20)),
        user_dn=draw(st.none() | _free),
        group=draw(st.none() | _free),
        role=draw(st.none() | _free),
        priority=draw(st.none() | st.integers(-100, model.OWNER_MAX_PRIORITY)),
        already_at_destination=draw(st.booleans()),
        at=model.now() + draw(st.sampled_from(INSIDE) | st.floats(INSIDE[0], INSIDE[-1])),
    )


# Where a mutation may strike: every field of the schema, nested ones, and names it lacks.
FIELDS = tuple(model.REQUEST_SCHEMA["fields"])
NESTED = (("checksum", "adler32"), ("publish_info", "dataset"), ("publish_info", "lumis"),
          ("history", 0), ("lease", "until"))  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with one to three hostile edits: a field set to any JSON value or to an edge value,
    removed, a nested value replaced, an unknown member, the document grown to around the size
    limit, or what only agents write forged by its owner (valid for the schema)."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        edit = draw(
            st.sampled_from(["set", "edge", "drop", "nested", "unknown", "grow", "forge", "forge"])
        )
        if edit == "set":
            doc[draw(st.sampled_from(FIELDS))] = draw(json_values)
        elif edit == "edge":
            doc[draw(st.sampled_from(FIELDS))] = draw(st.sampled_from(NASTY_STRINGS + NUMBERS))
        elif edit == "drop" and doc:
            doc.pop(draw(st.sampled_from(sorted(doc))), None)
        elif edit == "nested":
            _set_nested(doc, draw(st.sampled_from(NESTED)), draw(scalars))
        elif edit == "unknown":
            doc[draw(keys.filter(lambda k: not k.startswith("_")))] = draw(json_values)
        elif edit == "grow":
            grow_to(doc, model.MAX_DOC_CHARS + draw(st.integers(-3, 3)))
        elif edit == "forge":
            forge(draw, doc)
    return doc


def forge(draw: st.DrawFn, doc: dict[str, Any]) -> None:
    """What an owner may not write, in values the schema accepts: the agents' bookkeeping, a
    priority above the owner's, stamps of another clock, a publication its intent does not
    have, another user's task, a retry's cool-off in a history entry."""
    what = draw(st.sampled_from(["bookkeeping", "priority", "stamp", "publication", "task",
                                 "until"]))  # fmt: skip
    history = doc.get("history")
    entry = history[-1] if isinstance(history, list) and history else None
    if what == "bookkeeping":
        field = draw(st.sampled_from(sorted(FORGED_BOOKKEEPING)))
        doc[field] = draw(st.sampled_from([FORGED_BOOKKEEPING[field], model.BOOKKEEPING[field]]))
    elif what == "priority":
        doc["priority"] = draw(st.integers(-100, 100))
    elif what == "stamp":
        at = draw(stamps())
        for field in draw(st.sets(st.sampled_from(["created", "last_update", "at"]), min_size=1)):
            if field != "at":
                doc[field] = at
            elif isinstance(entry, dict):
                entry["at"] = at
    elif what == "publication":
        doc["publication"] = draw(st.sampled_from(["pending", "not_required"]))
    elif what == "task":
        owner = draw(st.sampled_from([*USERS, "nobody", "alice_x"]))
        doc["task"] = draw(st.sampled_from([f"261121_120000:{owner}_crab_x", "ceiling:abc"]))
    elif isinstance(entry, dict):
        entry["until"] = draw(stamps())


def _set_nested(doc: dict[str, Any], where: tuple[str, Any], value: Any) -> None:
    outer, inner = where
    container = doc.get(outer)
    if (isinstance(container, dict) and isinstance(inner, str)) or (
        isinstance(container, list) and isinstance(inner, int) and container
    ):
        container[inner] = value
    else:
        doc[outer] = {inner: value} if isinstance(inner, str) else [value]


def grow_to(doc: dict[str, Any], target: int) -> None:
    """Make the document's size (as both sides measure it) exactly `target`, or as near as the
    document allows, with lumi lists: each ",1" adds two characters, "1" → "10" one."""
    info = doc.setdefault("publish_info", {"dataset": f"/prim/{doc.get('user')}-grow-v1/USER"})
    if not isinstance(info, dict):
        return
    lumis = info["lumis"] = {str(run): [] for run in range(30)}
    size = model.doc_chars(doc)
    for run in lumis.values():
        room = min(10_000, (target - size) // 2)
        if room <= 0:
            break
        run.extend([1] * room)
        size = model.doc_chars(doc)
    if target - size == 1:
        last = next((r for r in lumis.values() if r), None)
        if last is not None:
            last[-1] = 10
