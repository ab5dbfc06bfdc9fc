"""The catalog interface: what the publisher needs from DBS3 or from the embedded catalog.

A block is published whole and at most once: its name is derived from its content (dataset and
the sorted LFNs of its files), so a publisher that crashed after the catalog call and publishes
the same block again finds it there (`publish_block` is idempotent), and a block name never
stands for two different sets of files.
"""

from __future__ import annotations

import abc
import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

BLOCK_NAMESPACE = uuid.UUID("3b0d6c3e-8a55-5c1f-9d0e-7a1b2c3d4e5f")


@dataclass(frozen=True)
class CatalogFile:
    lfn: str
    size: int
    adler32: str
    events: int = 0
    lumis: Mapping[str, Sequence[int]] = field(default_factory=dict)  # run → lumi sections
    parents: tuple[str, ...] = ()  # parent LFNs


@dataclass(frozen=True)
class Block:
    name: str  # "<dataset>#<uuid5 of the content>"
    dataset: str  # /primary/processed/USER
    user: str
    origin_site: str  # where the files are (the destination of their transfer)
    files: tuple[CatalogFile, ...]

    def lfns(self) -> list[str]:
        return sorted(f.lfn for f in self.files)


def block_name(dataset: str, lfns: Sequence[str]) -> str:
    """The block's name from its content: the same files always make the same name."""
    digest = hashlib.sha256("\n".join([dataset, *sorted(lfns)]).encode()).hexdigest()
    return f"{dataset}#{uuid.uuid5(BLOCK_NAMESPACE, digest)}"


class CatalogError(Exception):
    """The catalog refused or failed; `retryable` says whether trying later may help."""

    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


class CatalogStoreDown(CatalogError):
    """The embedded catalog's document store is unreachable or overloaded: as for any command
    meeting a store that is down, `aso` exits with its retryable code (75)."""


class BlockConflict(CatalogError):
    """A block of that name exists with other files (never overwritten), or some of the
    block's files are already in other blocks (`elsewhere`: LFN → the block holding it)."""

    def __init__(self, message: str, elsewhere: Mapping[str, str] | None = None):
        super().__init__(message, retryable=False)
        self.elsewhere = dict(elsewhere or {})


def content_message(name: str, stored: list[str], wanted: list[str]) -> str:
    """Why a block name is refused: the catalog holds it with other files."""
    missing = sorted(set(wanted) - set(stored))
    extra = sorted(set(stored) - set(wanted))
    return (
        f"block {name} exists with other files ({len(stored)} stored, {len(wanted)} given; "
        f"not stored: {missing[:3]}, stored but not given: {extra[:3]})"
    )


class Catalog(abc.ABC):
    name = "abstract"

    @abc.abstractmethod
    def publish_block(self, block: Block) -> bool:
        """Insert the block with its files (dataset created if needed). True if inserted now,
        False if the same block was already there; BlockConflict if the name exists with other
        files; CatalogError otherwise."""

    def publish_blocks(self, blocks: Sequence[Block]) -> list[bool | Exception]:
        """publish_block for each block, in order: what it answered (True, False) or what it
        raised (a CatalogError; any other exception is the client's and is returned too, so
        that one block cannot stop the others). A catalog that can take several blocks in
        fewer round trips overrides it (the embedded catalog); DBS takes a block per call."""
        outcomes: list[bool | Exception] = []
        for block in blocks:
            try:
                outcomes.append(self.publish_block(block))
            except Exception as exc:  # the block's outcome, returned
                outcomes.append(exc)
        return outcomes

    @abc.abstractmethod
    def block_files(self, name: str) -> list[str] | None:
        """LFNs of a published block, or None if there is no such block."""

    @abc.abstractmethod
    def dataset_files(self, dataset: str) -> dict[str, list[str]]:
        """{block name: LFNs} of a dataset (empty if unknown)."""

    def settle(self) -> int:
        """Look again at the blocks published lately, for a catalog whose checks may miss
        another's block at first (the embedded catalog on a cluster); returns how many blocks
        were withdrawn. Nothing to do by default."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional for catalogs without resources
        """Release connections."""
