"""Recording transfer requests: the job wrapper's stage-out step.

`upload(db, docs)` writes many requests in one bulk call. It is idempotent: a request whose id
already exists with the same file (LFNs, size, checksum) counts as already recorded, so a job
that runs its stage-out twice (or a retried upload after a lost answer) creates nothing new.
A different file under an existing id is reported, never overwritten.
"""

from __future__ import annotations

import inspect
import json
import logging
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aso import jsvalues as js
from aso import model
from aso.core import request
from aso.provision import storejs
from aso.store import Database

log = logging.getLogger("aso.upload")

# What makes two requests "the same file": the fields that identify the copy to be made.
IDENTITY = (
    "user",
    "task",
    "source_lfn",
    "destination_lfn",
    "source",
    "destination",
    "size",
    "checksum",
)
BATCH = 500


@dataclass
class UploadReport:
    """Every document given ends in exactly one of the four, under its id (under "item N", its
    place in the input, when it has no id of its own)."""

    recorded: list[str] = field(default_factory=list)  # new requests
    already: list[str] = field(default_factory=list)  # the same request existed
    renewed: list[str] = field(default_factory=list)  # a job retry's file replaced a failed one
    refused: dict[str, str] = field(default_factory=dict)  # id → reason

    @property
    def ok(self) -> bool:
        return not self.refused


def _same_file(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(js.same(a.get(k, js.UNDEFINED), b.get(k, js.UNDEFINED)) for k in IDENTITY)


# How a creation's 409 reads once the stored request is compared with it (the front end answers
# so, docs/status-api.md): a client tells the cases apart without asking again, by the stable
# `code` (CONFLICT_CODES) or the reason's words.
ALREADY_RECORDED = "already recorded: the same file (nothing to do)"
DIFFERENT_FILE = "a different file"  # how every other such reason begins
ANOTHER_USERS = "a request with this id exists and is another user's"
SAME_FILE, RENEWABLE, NOT_RENEWABLE, ANOTHERS, EXISTS = (
    "same_file", "renewable", "not_renewable", "another_users", "exists",
)  # fmt: skip
CONFLICT_CODES = {
    SAME_FILE: "the same file is recorded: nothing to do",
    RENEWABLE: "a different file, which this job retry may renew (docs/status-api.md)",
    NOT_RENEWABLE: "a different file, which this upload may not replace (the reason says why)",
    ANOTHERS: "another user's request has this id",
    EXISTS: "a request with this id exists (the stored one could not be compared)",
}


@dataclass(frozen=True)
class Conflict:
    code: str  # one of CONFLICT_CODES
    reason: str


def conflict_of(stored: Mapping[str, Any] | None, doc: Any, caller: str) -> Conflict:
    """What `caller`'s creation is told when it found `stored` under its id: the same
    request, or a different file (and whether a job retry may renew it). Another user's request
    is never "already recorded" for the caller, even with the same fields: the caller's upload
    recorded nothing."""
    if stored is None or not isinstance(doc, Mapping):
        return Conflict(EXISTS, "a request with this id exists")
    if stored.get("user") != caller:
        return Conflict(ANOTHERS, ANOTHER_USERS)
    if _same_file(stored, doc):
        return Conflict(SAME_FILE, ALREADY_RECORDED)
    why = request.renewable(stored, doc)  # "a different file for LFN is recorded (...): ..."
    if why is not None:
        return Conflict(NOT_RENEWABLE, why)
    stored_as = f"job retry {stored.get('job_retry', 0)}, {stored.get(model.STATE)}"
    return Conflict(
        RENEWABLE,
        f"{DIFFERENT_FILE} is recorded under this id ({stored_as}): this job retry may renew "
        "it (docs/status-api.md, Job retries)",
    )


def upload(db: Database, docs: Iterable[Any]) -> UploadReport:
    """Record requests (built with judged_request); one bulk write per BATCH. What cannot be
    a new request is refused here, with the model's reason, and never sent."""
    report = UploadReport()
    pending = _screen(list(docs), report)
    for start in range(0, len(pending), BATCH):
        _upload_batch(db, pending[start : start + BATCH], report)
    return report


def _screen(docs: list[Any], report: UploadReport) -> list[Mapping[str, Any]]:
    """One document per id, in input order; an id whose documents do not all describe the same
    valid new request is refused as a whole (which of them was meant is not known), so that it
    ends in one place of the report whatever the batches."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for index, doc in enumerate(docs):
        doc_id = doc.get("_id") if isinstance(doc, Mapping) else None
        key = doc_id if isinstance(doc_id, str) else f"item {index}"
        reason = refusal(doc)
        if reason and key not in report.refused:
            report.refused[key] = reason
        groups.setdefault(key, []).append(doc)
    chosen = []
    for key, group in groups.items():
        if key in report.refused:
            continue
        if not all(_same_file(group[0], other) for other in group[1:]):
            report.refused[key] = "two different files with the same source LFN"
            continue
        chosen.append(group[0])
    return chosen


def judged_request(**fields: Any) -> dict[str, Any]:
    """model.request_of(**fields), judged first as the store judges it: its schema (the
    store's own lib/schema.js), then what its owner may record; the first refusal is raised."""
    doc = model.request_of(**fields)
    refused = storejs.request_refusal(doc)
    if refused is not None:
        raise refused
    refused = storejs.owner_refusal(doc)
    if refused is not None:
        raise refused
    return doc


def refusal(doc: Any) -> str | None:
    """Why `doc` cannot be recorded as a new request (None: it can, as far as the model can tell
    without knowing the user; the store judges that)."""
    if not isinstance(doc, Mapping):
        return "[schema] a request must be a JSON object"
    members = sorted(k for k in doc if isinstance(k, str) and k.startswith("_") and k != "_id")
    if members:
        return f"[upload] {members[0]} belongs to updates: upload records new requests"
    refused = storejs.request_refusal(doc)
    return None if refused is None else refused.reason


def _upload_batch(db: Database, docs: list[Mapping[str, Any]], report: UploadReport) -> None:
    by_id = {doc["_id"]: doc for doc in docs}
    results = db.bulk_write(docs)
    conflicts = [r.id for r in results if r.conflict]
    existing = db.get_many(conflicts) if conflicts else {}
    renewals: list[dict[str, Any]] = []
    for result in results:
        doc = by_id[result.id]
        if result.ok:
            report.recorded.append(result.id)
            log.debug(
                "recorded request %s for %s (task %s)", result.id, doc["source_lfn"], doc["task"]
            )
        # COUCHDB_BULK_NOT_ATOMIC: a batch sent again finds its own earlier documents
        elif result.conflict and (found := existing.get(result.id)) and _same_file(found, doc):
            report.already.append(result.id)
            log.debug("request %s for %s was already recorded", result.id, doc["source_lfn"])
        elif result.conflict and found is not None:
            reason = request.renewable(found, doc)
            if reason is None:
                renewals.append(request.renewed(found, doc, doc["history"][0]["by"], model.now()))
            else:
                report.refused[result.id] = reason
        elif result.conflict:
            report.refused[result.id] = f"a request for {doc['source_lfn']} exists (deleted since?)"
        else:
            report.refused[result.id] = f"{result.error}: {model.in_words(result.reason or '')}"
        if result.id in report.refused:
            log.warning(
                "request %s for %s refused: %s",
                result.id,
                doc["source_lfn"],
                report.refused[result.id],
            )
    for doc, result in zip(renewals, db.bulk_write(renewals) if renewals else [], strict=True):
        if result.ok:
            report.renewed.append(result.id)
            log.debug("request %s for %s renewed by a job retry", result.id, doc["source_lfn"])
        else:
            report.refused[result.id] = f"not renewed: {result.error}: {result.reason}"


def adler32_of(path: Path, chunk: int = 1 << 20) -> tuple[int, str]:
    """(size, adler32 as 8 hex digits) of a local file, read once in chunks."""
    value, size = 1, 0
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            value = zlib.adler32(block, value)
            size += len(block)
    return size, f"{value & 0xFFFFFFFF:08x}"


def _fields_problem(args: Mapping[str, Any]) -> str | None:
    """A request object's missing or unknown fields, in the file's terms (not a Python call's)."""
    parameters = inspect.signature(model.request_of).parameters
    known = [name for name in parameters if name not in ("by", "at")]
    required = [n for n in known if parameters[n].default is inspect.Parameter.empty]
    missing = [n for n in required if n not in args]
    if missing:
        return f"missing {', '.join(missing)}"
    unknown = sorted(k for k in args if k not in known)
    if unknown:
        return f"unknown field {unknown[0]!r} (the fields: {', '.join(known)})"
    return None


def requests_from_json(path: Path, *, default_user: str | None = None) -> list[dict[str, Any]]:
    """Build requests from a JSON file: a list of objects with model.request_of's arguments."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise model.ModelError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise model.ModelError(f"{path}: not valid JSON: {exc}") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise model.ModelError(f"{path}: expected a list of request objects")
    docs = []
    for index, item in enumerate(data):
        if not isinstance(item, dict):
            raise model.ModelError(f"{path}: item {index} is not an object")
        args = dict(item)
        if default_user and "user" not in args:
            args["user"] = default_user
        problem = _fields_problem(args)
        if problem:
            raise model.ModelError(f"{path}: item {index}: {problem}")
        try:
            docs.append(judged_request(**args))
        except model.ModelError as exc:
            raise model.ModelError(f"{path}: item {index}: {model.in_words(str(exc))}") from None
    return docs
