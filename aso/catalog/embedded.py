"""The embedded catalog: datasets, blocks and their files in a database of the document store.

For one machine, demos and tests, in place of DBS. One document per block, its `_id` the block
name (content-derived, aso.catalog.base.block_name), holding the block's files (LFN, size,
adler32, events, lumis, parents); one document per dataset, `_id` "dataset:<name>". Two views:
`files` (key: LFN; value: block and dataset) and `blocks` (key: [dataset, created, block]).

Publishing is idempotent and race-safe:

* the block document is created by id, never updated: a second publisher of the same block (a
  race, or a retry after a crash) gets 409 and compares the stored LFNs: the same set is
  "already published" (False), another set is a BlockConflict;
* a file is in at most one block: before inserting, the `files` view must not know any of the
  block's LFNs under another block (BlockConflict naming them). Two *different* blocks sharing
  a file and published at the same moment could both pass that check, so the check is made
  again after the insert: a publisher that then finds one of its LFNs in another block removes
  the block it has just written and reports a retryable error (at the next attempt the
  pre-insert check decides). The block that stays is never removed, so a file is never left
  in two blocks; in the rare case where both racers see each other, both step back and retry.
* so a block another publisher wrote is relied on (its files recorded published in it: "already
  published", or held elsewhere) only when no other block shares any of its files, once read
  at the quorum, and on a cluster once older than its writer's check after the write: a block
  about to be withdrawn, or withdrawn already on the copy a cluster's view read, left files
  recorded published in no block. Else a retryable error.
* on a cluster both checks read one copy of each shard, so two blocks sharing a file may both
  pass them: each publisher looks at its blocks again for a while (`settle`), and of blocks
  sharing a file the later by name is withdrawn once its other files are in a block of their
  own (the same rule whoever applies it, so that the blocks converge).

The database's validate_doc_update lets agents (aso-agent) create documents and delete blocks,
admins (aso-admin, _admin) do anything, and nobody else write; catalog documents never change
once written. Members (aso-user, aso-agent, aso-admin) read.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aso.catalog.base import (
    Block,
    BlockConflict,
    Catalog,
    CatalogError,
    CatalogFile,
    CatalogStoreDown,
    block_name,
    content_message,
)
from aso.limits import MAX_WRITTEN_DOC_CHARS
from aso.store import Database, Forbidden, Server, StoreError, StoreUnavailable, Unauthorized

log = logging.getLogger("aso.catalog.embedded")

DEFAULT_DB = "aso_catalog"
DDOC = "catalog"
BLOCK, DATASET = "block", "dataset"
DATASET_PREFIX = "dataset:"
SCHEMA_VERSION = 1
# The largest block document written (the embedded store takes up to its request size, 4 GiB;
# CouchDB 8 MB). The publisher closes blocks well below it (publisher.max_block_bytes); a
# larger block is refused here, alone.
MAX_BLOCK_CHARS = MAX_WRITTEN_DOC_CHARS

# On a cluster, a block this publisher wrote is looked at again when it is this many seconds
# old (by then a restarted node's copy has caught up), at most once every SETTLE_EVERY s for
# all of them. A block younger than the first may still be withdrawn by its writer's own check.
SETTLE_LOOKS = (8.0, 30.0, 90.0)
SETTLE_EVERY = 3.0
SETTLE_KEYS = 1000  # LFNs per view read


@dataclass
class _Written:
    """A block this publisher wrote, to look at again (`settle`)."""

    at: float
    lfns: tuple[str, ...]
    looks: int = 0


SECURITY = {
    "admins": {"names": [], "roles": []},
    "members": {"names": [], "roles": ["aso-agent", "aso-admin", "aso-user"]},
}


def block_document(block: Block, now: float) -> dict[str, Any]:
    return {
        "_id": block.name,
        "type": BLOCK,
        "schema": SCHEMA_VERSION,
        "dataset": block.dataset,
        "user": block.user,
        "origin_site": block.origin_site,
        "created": now,
        "files": [file_entry(f) for f in sorted(block.files, key=lambda f: f.lfn)],
    }


def file_entry(f: CatalogFile) -> dict[str, Any]:
    return {
        "lfn": f.lfn,
        "size": int(f.size),
        "adler32": f.adler32,
        "events": int(f.events),
        "lumis": {str(run): [int(x) for x in lumis] for run, lumis in f.lumis.items()},
        "parents": list(f.parents),
    }


def catalog_file(entry: Mapping[str, Any]) -> CatalogFile:
    return CatalogFile(
        lfn=entry["lfn"],
        size=entry["size"],
        adler32=entry["adler32"],
        events=entry.get("events", 0),
        lumis={run: list(lumis) for run, lumis in (entry.get("lumis") or {}).items()},
        parents=tuple(entry.get("parents") or ()),
    )


def check_block(block: Block) -> None:
    """What both catalogs refuse before asking anyone (not retryable)."""
    if not block.name.startswith(block.dataset + "#") or block.name == block.dataset + "#":
        raise CatalogError(f"block {block.name} is not named <dataset>#<id>", retryable=False)
    if not block.files:
        raise CatalogError(f"block {block.name} has no files", retryable=False)
    lfns = [f.lfn for f in block.files]
    doubles = sorted({lfn for lfn in lfns if lfns.count(lfn) > 1})
    if doubles:
        raise CatalogError(
            f"block {block.name} lists {', '.join(doubles)} more than once", retryable=False
        )


def block_chars(block: Block) -> int:
    """The block's document as JSON, in characters (what the store's size limit measures)."""
    return len(json.dumps(block_document(block, 0.0)))


def check_size(block: Block) -> None:
    """A block the store would refuse as too large is refused before asking, alone (not
    retryable: the same files make the same block)."""
    chars = block_chars(block)
    if chars > MAX_BLOCK_CHARS:
        raise CatalogError(
            f"block {block.name} is {chars} characters as JSON, over the embedded catalog's "
            f"{MAX_BLOCK_CHARS} (fewer files per block: publisher.max_block_bytes)",
            retryable=False,
        )


def _store_error(action: str, exc: StoreError) -> CatalogError:
    # A store that is down or overloaded may come back; a refusal (403) or a bad request will
    # not by itself.
    retryable = (
        isinstance(exc, StoreUnavailable) or exc.status in (0, 408, 429) or exc.status >= 500
    )
    kind = CatalogStoreDown if retryable else CatalogError
    return kind(f"embedded catalog: {action}: {exc}", retryable=retryable)


def refusal(block: str, why: str) -> CatalogError:
    return CatalogError(f"embedded catalog refused block {block}: {why}", retryable=False)


class EmbeddedCatalog(Catalog):
    name = "embedded"

    def __init__(self, db: Database, *, clock: Any = time.time):
        self.db = db
        self._clock = clock
        # Datasets known to have their document: a block's dataset is written once, not
        # tried again (a refused write) for every block (datasets are never deleted).
        self._datasets: set[str] = set()
        # Blocks written lately, looked at again by `settle` (on a cluster only).
        self._written: dict[str, _Written] = {}
        self._settled_at = float("-inf")
        self._copies: int | None = None  # copies of each document the store keeps

    @classmethod
    def open(cls, server: Server, name: str = DEFAULT_DB) -> EmbeddedCatalog:
        return cls(server.db(name))

    # -- publishing -----------------------------------------------------------------------

    def publish_block(self, block: Block) -> bool:
        """The one-block case of the batch: the same checks and outcomes (True: published
        now, False: already there with these files; a CatalogError otherwise)."""
        check_block(block)
        check_size(block)
        outcome = self._publish_together([block])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def publish_blocks(self, blocks: Sequence[Block]) -> list[bool | Exception]:
        """The blocks of a publisher's cycle in a handful of requests whatever their number,
        with publish_block's outcomes and checks: one `files` view read before, one bulk
        create of their new datasets and one of the blocks, one read after (one block at a
        time took three requests each: 300 blocks a cycle at 20x design made cycles of a
        minute). A block sharing a file with an earlier one of the batch is
        published after them, on its own, so that the checks decide between the two."""
        outcomes: list[bool | Exception | None] = [None] * len(blocks)
        together: list[int] = []
        alone: list[int] = []
        taken: set[str] = set()
        for i, block in enumerate(blocks):
            try:
                check_block(block)
                check_size(block)
            except CatalogError as exc:
                outcomes[i] = exc
                continue
            lfns = block.lfns()
            (alone if taken.intersection(lfns) else together).append(i)
            taken.update(lfns)
        published = self._publish_together([blocks[i] for i in together])
        for i, outcome in zip(together, published, strict=True):
            outcomes[i] = outcome
        for i in alone:
            outcomes[i] = super().publish_blocks([blocks[i]])[0]
        return [o if o is not None else CatalogError("not published", True) for o in outcomes]

    def _publish_together(self, blocks: Sequence[Block]) -> list[bool | Exception]:
        """Blocks without a file in common, checked beforehand (check_block). A request of the
        batch that fails as a whole (a block the store refuses as too large made CouchDB
        refuse the write of every block) is tried again block by block: each block
        gets its own outcome, never another's. Only a store that cannot be reached fails them
        all at once."""
        try:
            return self._publish_batch(blocks)
        except StoreUnavailable as exc:
            return [self._refused_or_down(f"publishing block {b.name}", exc) for b in blocks]
        except StoreError as exc:
            if len(blocks) == 1:
                return [self._refused_or_down(f"publishing block {blocks[0].name}", exc)]
            log.warning(
                "a catalog write of %d blocks failed (%s): block by block", len(blocks), exc
            )
            return [self._publish_together([block])[0] for block in blocks]

    def _publish_batch(self, blocks: Sequence[Block]) -> list[bool | Exception]:
        """_publish_together's one attempt at the whole batch; a StoreError of a request of it
        is raised (the whole batch's)."""
        outcomes: list[bool | Exception] = [CatalogError("not published", True)] * len(blocks)
        if not blocks:
            return outcomes
        before = self._holders_of(blocks)
        fresh = []
        for i, (block, holders) in enumerate(zip(blocks, before, strict=True)):
            if holders:
                outcomes[i] = self._held_elsewhere(block, holders)
            else:
                fresh.append(i)
        refused = self._ensure_datasets([blocks[i] for i in fresh])
        for i in [i for i in fresh if blocks[i].dataset in refused]:
            outcomes[i] = refusal(blocks[i].name, refused[blocks[i].dataset])
        fresh = [i for i in fresh if blocks[i].dataset not in refused]
        now = self._clock()
        results = self.db.bulk_write([block_document(blocks[i], now) for i in fresh])
        written: list[tuple[int, str]] = []
        for i, result in zip(fresh, results, strict=True):
            name = blocks[i].name
            if result.ok and result.rev:
                written.append((i, result.rev))
            elif result.conflict:
                outcomes[i] = self._existing_outcome(blocks[i])
            elif isinstance(error := result.as_error(), Forbidden | Unauthorized):
                outcomes[i] = refusal(name, str(error))
            elif error.status == 413:  # this block alone is too large: it will stay so
                outcomes[i] = CatalogError(f"embedded catalog: block {name}: {error}", False)
            else:
                reason = f"embedded catalog: publishing block {name}: {result.error}: "
                outcomes[i] = CatalogError(reason + str(result.reason), retryable=True)
        # Another block with one of these files may have been written at the same moment. A
        # failed check is the batch's: block by block, a written block is found there.
        after = self._elsewhere_of([blocks[i] for i, _ in written])
        withdrawn = []
        for (i, rev), elsewhere in zip(written, after, strict=True):
            if not elsewhere:
                outcomes[i] = True
                continue
            withdrawn.append({"_id": blocks[i].name, "_rev": rev, "_deleted": True})
            outcomes[i] = CatalogError(
                elsewhere_message(blocks[i], elsewhere)
                + " (published at the same moment; this block was withdrawn)",
                retryable=True,
            )
        if withdrawn:
            self.db.bulk_write(withdrawn)
        for i, _ in written:
            if outcomes[i] is True:
                self._to_look_at(blocks[i].name, blocks[i].lfns())
                log.debug("published block %s (%d files)", blocks[i].name, len(blocks[i].files))
        return outcomes

    def _elsewhere_of(self, blocks: Sequence[Block]) -> list[dict[str, str]]:
        """For each block, {LFN: other block} of its LFNs that another block holds: one view
        read for them all."""
        return [
            {lfn: [b for b in held if b != block.name][-1] for lfn, held in holders.items()}
            for block, holders in zip(blocks, self._holders_of(blocks), strict=True)
        ]

    def _holders_of(self, blocks: Sequence[Block]) -> list[dict[str, list[str]]]:
        """For each block, {LFN: every block holding it} of its LFNs that another block holds
        (the block itself among them if it is there too): one view read for them all."""
        if not blocks:
            return []
        keys = sorted({lfn for block in blocks for lfn in block.lfns()})
        rows = self.db.view(DDOC, "files", keys=keys).rows
        held: dict[str, list[str]] = {}
        for r in rows:
            held.setdefault(r["key"], []).append(r["value"]["block"])
        return [
            {
                lfn: held[lfn]
                for lfn in block.lfns()
                if any(other != block.name for other in held.get(lfn, []))
            }
            for block in blocks
        ]

    def _held_elsewhere(self, block: Block, holders: Mapping[str, list[str]]) -> CatalogError:
        """The block's files that other blocks hold, as the `files` view says: a BlockConflict
        naming them (the publisher records them published there) only once each is confirmed.
        A file in two blocks at once was published twice at the same moment, and one of the
        two is about to be withdrawn; a view on a cluster reads one copy of each shard, which
        may still show a block withdrawn since: each holder is read at the quorum. Either
        way a file recorded published in a block that then goes is in no block (aso sim's
        `catalog_missing`): a retryable error instead, and the next cycle looks again."""
        twice = sorted(lfn for lfn, held in holders.items() if len(set(held)) > 1)
        if twice:
            return CatalogError(
                f"block {block.name}: {twice[0]} is in {len(set(holders[twice[0]]))} blocks at "
                "once (published at the same moment): tried again",
                retryable=True,
            )
        elsewhere = {lfn: held[0] for lfn, held in holders.items()}
        others: list[dict[str, Any]] = []
        for other in sorted(set(elsewhere.values())):
            try:
                stored = self.db.get(other)
            except StoreError as exc:
                return _store_error(f"reading block {other}", exc)
            lfns = (
                {f["lfn"] for f in stored["files"]}
                if stored and stored.get("type") == BLOCK
                else set()
            )
            lacking = sorted(lfn for lfn, o in elsewhere.items() if o == other and lfn not in lfns)
            if lacking:
                return CatalogError(
                    f"block {block.name}: the catalog's view has {lacking[0]} in block {other}, "
                    "which does not hold it (withdrawn, or a copy behind): tried again",
                    retryable=True,
                )
            others += [stored] if stored else []
        # The holders' own other files count too: a holder sharing one with a third block is
        # withdrawn by its writer, taking this block's files with it.
        unsettled = self._unsettled(others)
        if unsettled:
            return CatalogError(f"block {block.name}: {unsettled}: tried again", retryable=True)
        return BlockConflict(elsewhere_message(block, elsewhere), elsewhere)

    def _unsettled(self, docs: Sequence[Mapping[str, Any]]) -> str | None:
        """Why blocks read at the quorum (another publisher's, maybe) cannot have files recorded
        published in them yet, or None. A block sharing a file with another is withdrawn by its
        writer's check after the write (or `settle`); on a cluster that check may see a block
        this one's view missed, so a block younger than its writer's check is not relied on."""
        now = self._clock()
        young = [d for d in docs if now - d.get("created", 0) < SETTLE_LOOKS[0]]
        if young and self._keeps_copies():
            return f"block {young[0]['_id']} is too young to rely on (its writer may withdraw it)"
        holders: dict[str, set[str]] = {}
        for doc in docs:
            for f in doc["files"]:
                holders.setdefault(f["lfn"], set()).add(doc["_id"])
        try:
            for lfn, blocks in self._blocks_holding(sorted(holders)).items():
                holders[lfn] |= blocks
        except StoreError as exc:
            return f"the catalog's files not read: {exc}"
        shared = sorted(lfn for lfn, held in holders.items() if len(held) > 1)
        if shared:
            return (
                f"{shared[0]} is in {len(holders[shared[0]])} blocks at once (published at the "
                "same moment; one is withdrawn)"
            )
        return None

    def _ensure_datasets(self, blocks: Sequence[Block]) -> dict[str, str]:
        """The datasets of these blocks created if new, in one bulk write; {dataset: why} of
        those the store refused."""
        new = {b.dataset: b for b in blocks if b.dataset not in self._datasets}
        if not new:
            return {}
        now = self._clock()
        docs = [self._dataset_document(b, now) for b in new.values()]
        refused = {}
        for dataset, result in zip(new, self.db.bulk_write(docs), strict=True):
            if result.ok or result.conflict:  # created now, or there already
                self._datasets.add(dataset)
            else:
                refused[dataset] = str(result.as_error())
        return refused

    def _existing_outcome(self, block: Block) -> bool | Exception:
        """A block whose create found its name taken: _compare_existing's answer."""
        try:
            return self._compare_existing(block)
        except CatalogError as exc:
            return exc
        except StoreError as exc:
            return _store_error("reading a block", exc)

    @staticmethod
    def _refused_or_down(action: str, exc: StoreError) -> CatalogError:
        if isinstance(exc, Forbidden):
            return CatalogError(f"embedded catalog refused: {action}: {exc}", False)
        return _store_error(action, exc)

    def _compare_existing(self, block: Block) -> bool:
        stored = self.db.get(block.name)
        if stored is None or stored.get("type") != BLOCK:
            # Withdrawn in between (a racing publisher's back-off): try again later.
            raise CatalogError(f"block {block.name} changed while publishing", retryable=True)
        stored_lfns = sorted(f["lfn"] for f in stored["files"])
        if stored_lfns == block.lfns():
            # Its writer withdraws it if another block holds one of its files (published at
            # the same moment): not "already published" until that is settled.
            unsettled = self._unsettled([stored])
            if unsettled:
                raise CatalogError(f"block {block.name}: {unsettled}", retryable=True)
            log.debug("block %s was already published", block.name)
            return False
        raise BlockConflict(content_message(block.name, stored_lfns, block.lfns()))

    @staticmethod
    def _dataset_document(block: Block, now: float) -> dict[str, Any]:
        return {
            "_id": DATASET_PREFIX + block.dataset,
            "type": DATASET,
            "schema": SCHEMA_VERSION,
            "dataset": block.dataset,
            "user": block.user,
            "created": now,
        }

    # -- settling a file in two blocks (CLUSTER_VIEW_READS_ONE_COPY) ---------------------------

    def settle(self) -> int:
        """Blocks written lately, looked at again: a cluster's view reads one copy of each
        shard, so two publishers' blocks sharing a file may both pass the check made after
        their write (each read a copy without the other's). Every publisher applies one
        rule to such blocks (`settle_blocks`), so that they converge. Returns how many blocks
        were withdrawn."""
        now = self._clock()
        if now - self._settled_at < SETTLE_EVERY:
            return 0
        self._settled_at = now
        due = [w for w in self._written.values() if now - w.at >= SETTLE_LOOKS[w.looks]]
        lfns = sorted({lfn for w in due for lfn in w.lfns})
        try:
            holders = self._blocks_holding(lfns)
        except StoreError as exc:
            log.warning("blocks written lately not looked at again: %s", exc)
            return 0
        for w in due:
            w.looks += 1
        self._written = {n: w for n, w in self._written.items() if w.looks < len(SETTLE_LOOKS)}
        shared = sorted({b for held in holders.values() if len(held) > 1 for b in held})
        return self.settle_blocks(shared) if shared else 0

    def _blocks_holding(self, lfns: Sequence[str]) -> dict[str, set[str]]:
        """{LFN: the blocks the `files` view has it in} of these LFNs, SETTLE_KEYS a read."""
        holders: dict[str, set[str]] = {}
        for start in range(0, len(lfns), SETTLE_KEYS):
            keys = lfns[start : start + SETTLE_KEYS]
            for r in self.db.view(DDOC, "files", keys=keys).rows:
                holders.setdefault(r["key"], set()).add(r["value"]["block"])
        return holders

    def settle_blocks(self, names: Sequence[str]) -> int:
        """Blocks that may share files, read at the quorum, settled by a fixed order (their
        names): a block keeps its files but those an earlier block holds. One that shares a
        file with an earlier block is withdrawn once a block of its other files (if any) is
        in the catalog, so that no file is ever in no block. Returns how many were withdrawn."""
        live = {}
        for name in sorted(set(names)):
            try:
                doc = self.db.get(name)
            except StoreError as exc:
                log.warning("block %s not read to settle it: %s", name, exc)
                return 0
            if doc and doc.get("type") == BLOCK:
                live[name] = doc
        if any(self._clock() - doc.get("created", 0) < SETTLE_LOOKS[0] for doc in live.values()):
            return 0  # one may be about to be withdrawn by its writer: the next look settles
        taken: set[str] = set()
        withdrawn = 0
        for doc in live.values():
            lfns = {f["lfn"] for f in doc["files"]}
            if lfns & taken and self._replace(doc, lfns - taken):
                withdrawn += 1
            taken |= lfns
        return withdrawn

    def _replace(self, doc: Mapping[str, Any], keep: set[str]) -> bool:
        """Block `doc` withdrawn, after a block of its files `keep` is confirmed at the quorum
        (none when every file is in an earlier block). True if withdrawn."""
        try:
            if keep and not self._write_remainder(doc, keep):
                return False
            [result] = self.db.bulk_write(
                [{"_id": doc["_id"], "_rev": doc["_rev"], "_deleted": True}]
            )
        except StoreError as exc:
            log.warning("block %s not settled: %s", doc["_id"], exc)
            return False
        log.warning(
            "block %s shared files with another block (published at the same moment): "
            "withdrawn, %d of its files left in their own block",
            doc["_id"],
            len(keep),
        )
        return bool(result.ok or result.accepted)

    def _write_remainder(self, doc: Mapping[str, Any], keep: set[str]) -> bool:
        """A block of the files `keep` of block `doc` (created, or there already), read back
        at the quorum. True once it is there with them."""
        entries = [f for f in doc["files"] if f["lfn"] in keep]
        name = block_name(doc["dataset"], sorted(keep))
        remainder = dict(doc, _id=name, created=self._clock(), files=entries)
        remainder.pop("_rev", None)
        self.db.bulk_write([remainder])
        stored = self.db.get(name)
        if not stored or {f["lfn"] for f in stored.get("files", [])} != keep:
            return False
        self._to_look_at(name, sorted(keep))
        return True

    def _to_look_at(self, name: str, lfns: Sequence[str]) -> None:
        """A block written here, to look at again if the store keeps copies that may lag."""
        if self._keeps_copies(unknown=False):  # not known yet: the next block asks again
            self._written[name] = _Written(self._clock(), tuple(lfns))

    def _keeps_copies(self, unknown: bool = True) -> bool:
        """The store keeps several copies of each document (a cluster), whose reads may lag;
        `unknown` if the store cannot tell now."""
        if self._copies is None:
            try:
                self._copies = int((self.db.info().get("cluster") or {}).get("n", 1))
            except StoreError:
                return unknown
        return self._copies > 1

    # -- reading ----------------------------------------------------------------------------

    def block_files(self, name: str) -> list[str] | None:
        files = self.block_details(name)
        return None if files is None else sorted(f.lfn for f in files)

    def block_details(self, name: str) -> list[CatalogFile] | None:
        """The files of a block with their metadata, or None if there is no such block."""
        try:
            doc = self.db.get(name)
        except StoreError as exc:
            raise _store_error(f"reading block {name}", exc) from None
        if doc is None or doc.get("type") != BLOCK:
            return None
        return [catalog_file(f) for f in doc["files"]]

    def dataset_files(self, dataset: str) -> dict[str, list[str]]:
        return {
            doc["_id"]: sorted(f["lfn"] for f in doc["files"]) for doc in self._block_docs(dataset)
        }

    def dataset_exists(self, dataset: str) -> bool:
        try:
            return self.db.get(DATASET_PREFIX + dataset) is not None
        except StoreError as exc:
            raise _store_error(f"reading dataset {dataset}", exc) from None

    def blocks(self, dataset: str) -> list[dict[str, Any]] | None:
        """The dataset's blocks, oldest first: block, files, size, origin_site, created; None if
        the dataset is unknown."""
        if not self.dataset_exists(dataset):
            return None
        try:
            rows = self.db.view(DDOC, "blocks", start_key=[dataset], end_key=[dataset, {}]).rows
        except StoreError as exc:
            raise _store_error(f"listing blocks of {dataset}", exc) from None
        return [
            {
                "block": r["key"][2],
                "files": r["value"]["files"],
                "size": r["value"]["size"],
                "origin_site": r["value"]["origin_site"],
                "created": r["key"][1],
            }
            for r in rows
        ]

    def files(self, dataset: str) -> list[dict[str, Any]] | None:
        """The dataset's files: lfn, size, events, adler32, block; None if it is unknown."""
        if not self.dataset_exists(dataset):
            return None
        return [
            {
                "lfn": f["lfn"],
                "size": f["size"],
                "events": f["events"],
                "adler32": f["adler32"],
                "block": doc["_id"],
            }
            for doc in self._block_docs(dataset)
            for f in doc["files"]
        ]

    def _block_docs(self, dataset: str) -> Iterable[dict[str, Any]]:
        try:
            result = self.db.view(
                DDOC, "blocks", start_key=[dataset], end_key=[dataset, {}], include_docs=True
            )
        except StoreError as exc:
            raise _store_error(f"listing blocks of {dataset}", exc) from None
        return result.docs()


def elsewhere_message(block: Block, elsewhere: Mapping[str, str]) -> str:
    shown = sorted(elsewhere.items())
    listed = "; ".join(f"{lfn} in {other}" for lfn, other in shown[:5])
    more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
    return (
        f"block {block.name}: {len(shown)} file(s) already published in another block: "
        f"{listed}{more}"
    )
