"""What the publisher decides, as plain functions over documents: which of a (user, dataset)'s
waiting files make the blocks to publish now (`close_blocks`: full ones, by files or by the
bytes of their entries, then the rest once its oldest file waited long enough or its tasks are
over), each block's catalog entries, and how many publications a file has failed."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from aso.catalog.base import Block, CatalogFile, block_name
from aso.catalog.embedded import file_entry
from aso.model import PUBLICATION, STATE

# publisher.max_block_bytes's default (aso/config.py), for callers without a configuration.
DEFAULT_BLOCK_BYTES = 2_000_000

WAITING = "pending"
ERROR = "publication_error"


def dataset_of(doc: Mapping[str, Any]) -> str:
    return cast(str, (doc.get("publish_info") or {}).get("dataset", ""))


def done_at(doc: Mapping[str, Any]) -> float:
    """When the file's copy ended (its `done` transition)."""
    ended: float = max(
        (h["at"] for h in doc.get("history", []) if h["axis"] == STATE and h["to"] == "done"),
        default=doc["last_update"],
    )
    return ended


def failures_since_reset(doc: Mapping[str, Any]) -> int:
    """Failed publications since the owner last reset the file (`aso publish --retry`)."""
    pub = [h for h in doc.get("history", []) if h["axis"] == PUBLICATION]
    reset = max((h["at"] for h in pub if h["from"] == "publication_failed"), default=0.0)
    return sum(1 for h in pub if h["to"] == ERROR and h["at"] >= reset)


def catalog_file(doc: Mapping[str, Any]) -> CatalogFile:
    info = doc.get("publish_info") or {}
    return CatalogFile(
        lfn=doc["destination_lfn"],
        size=doc["size"],
        adler32=doc["checksum"]["adler32"],
        events=info.get("events", 0),
        lumis=info.get("lumis", {}),
        parents=tuple(info.get("parents", [])),
    )


def make_block(docs: Sequence[Mapping[str, Any]], name: str | None = None) -> Block:
    first = docs[0]
    dataset = dataset_of(first)
    return Block(
        name=name or block_name(dataset, [d["destination_lfn"] for d in docs]),
        dataset=dataset,
        user=first["user"],
        origin_site=first["destination"],
        files=tuple(catalog_file(d) for d in docs),
    )


def entry_chars(doc: Mapping[str, Any]) -> int:
    """The file's entry in a catalog block, as JSON, in characters (what the store's document
    size limit measures)."""
    return len(json.dumps(file_entry(catalog_file(doc))))


def fill_blocks(
    ordered: list[dict[str, Any]], max_files: int, max_bytes: int
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Full blocks out of files in order (each of at most `max_files` files and `max_bytes`
    of entries: a file that would make it larger starts the next one), and the files left."""
    full: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    size = 0
    for doc in ordered:
        chars = entry_chars(doc)
        if current and size + chars > max_bytes:
            full.append(current)
            current, size = [], 0
        current.append(doc)
        size += chars
        if len(current) >= max_files:
            full.append(current)
            current, size = [], 0
    return full, current


def close_blocks(
    waiting: list[dict[str, Any]],
    now: float,
    max_files: int,
    timeout: float,
    task_over: Callable[[str], bool],
    max_bytes: int = DEFAULT_BLOCK_BYTES,
) -> list[list[dict[str, Any]]]:
    """The blocks to publish now out of one (user, dataset)'s waiting files, oldest first: the
    full ones (by files or by size, so that no block is larger than the store takes), then the
    rest once its oldest file waited `timeout` or its tasks are over."""
    ordered = sorted(waiting, key=lambda d: (done_at(d), d["_id"]))
    blocks, rest = fill_blocks(ordered, max_files, max_bytes)
    if rest and (
        now - done_at(rest[0]) >= timeout
        or all(task_over(task) for task in {d["task"] for d in rest})
    ):
        blocks.append(rest)
    return blocks
