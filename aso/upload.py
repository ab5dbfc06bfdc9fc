"""Recording transfer requests: the job wrapper's stage-out step.

`upload(db, docs)` writes many requests in one bulk call. It is idempotent: a request whose id
already exists with the same file (LFNs, size, checksum) counts as already recorded, so a job
that runs its stage-out twice (or a retried upload after a lost answer) creates nothing new.
A different file under an existing id is reported, never overwritten.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aso import model
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
    recorded: list[str] = field(default_factory=list)  # new requests
    already: list[str] = field(default_factory=list)  # the same request existed
    refused: dict[str, str] = field(default_factory=dict)  # id → reason

    @property
    def ok(self) -> bool:
        return not self.refused


def _same_file(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in IDENTITY)


def upload(db: Database, docs: Iterable[Mapping[str, Any]]) -> UploadReport:
    """Record requests (already built with model.new_request); one bulk write per BATCH."""
    report = UploadReport()
    pending = list(docs)
    for start in range(0, len(pending), BATCH):
        _upload_batch(db, pending[start : start + BATCH], report)
    return report


def _upload_batch(db: Database, docs: list[Mapping[str, Any]], report: UploadReport) -> None:
    by_id: dict[str, Mapping[str, Any]] = {}
    for doc in docs:
        if doc["_id"] in by_id:
            if not _same_file(by_id[doc["_id"]], doc):
                report.refused[doc["_id"]] = "two different files with the same source LFN"
            continue
        by_id[doc["_id"]] = doc
    results = db.bulk_write(list(by_id.values()))
    conflicts = [r.id for r in results if r.conflict]
    existing = db.get_many(conflicts) if conflicts else {}
    for result in results:
        doc = by_id[result.id]
        if result.ok:
            report.recorded.append(result.id)
            log.info(
                "recorded request %s for %s (task %s)", result.id, doc["source_lfn"], doc["task"]
            )
        elif result.conflict and existing.get(result.id) and _same_file(existing[result.id], doc):
            report.already.append(result.id)
            log.info("request %s for %s was already recorded", result.id, doc["source_lfn"])
        elif result.conflict:
            report.refused[result.id] = (
                f"a different request for {doc['source_lfn']} already exists"
            )
        else:
            report.refused[result.id] = f"{result.error}: {result.reason}"
        if result.id in report.refused:
            log.warning(
                "request %s for %s refused: %s",
                result.id,
                doc["source_lfn"],
                report.refused[result.id],
            )


def adler32_of(path: Path, chunk: int = 1 << 20) -> tuple[int, str]:
    """(size, adler32 as 8 hex digits) of a local file, read once in chunks."""
    value, size = 1, 0
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            value = zlib.adler32(block, value)
            size += len(block)
    return size, f"{value & 0xFFFFFFFF:08x}"


def requests_from_json(path: Path, *, default_user: str | None = None) -> list[dict[str, Any]]:
    """Build requests from a JSON file: a list of objects with model.new_request's arguments."""
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
        try:
            docs.append(model.new_request(**args))
        except TypeError as exc:
            raise model.ModelError(f"{path}: item {index}: {exc}") from None
        except model.ModelError as exc:
            raise model.ModelError(f"{path}: item {index}: {exc}") from None
    return docs
