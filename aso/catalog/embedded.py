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

The database's validate_doc_update lets agents (aso-agent) create documents and delete blocks,
admins (aso-admin, _admin) do anything, and nobody else write; catalog documents never change
once written. Members (aso-user, aso-agent, aso-admin) read.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aso.catalog.base import (
    Block,
    BlockConflict,
    Catalog,
    CatalogError,
    CatalogFile,
    CatalogStoreDown,
    content_message,
)
from aso.store import Conflict, Database, Forbidden, Server, StoreError, StoreUnavailable

log = logging.getLogger("aso.catalog.embedded")

DEFAULT_DB = "aso_catalog"
DDOC = "catalog"
BLOCK, DATASET = "block", "dataset"
DATASET_PREFIX = "dataset:"
SCHEMA_VERSION = 1

SECURITY = {
    "admins": {"names": [], "roles": ["aso-admin"]},
    "members": {"names": [], "roles": ["aso-agent", "aso-admin", "aso-user"]},
}

VALIDATE = r"""function (newDoc, oldDoc, userCtx, secObj) {
  // EMBEDDED_VALIDATES_BEFORE_CONFLICT (aso/store.py): the embedded store runs this for a create
  // of an existing id before it finds the conflict; let it pass so that both stores answer 409.
  if (oldDoc && !newDoc._rev && !newDoc._deleted) { return; }
  var roles = userCtx.roles || [];
  function has(role) { return roles.indexOf(role) !== -1; }
  function refuse(rule, why) { throw({forbidden: '[' + rule + '] ' + why}); }
  var admin = has('_admin') || has('aso-admin');
  if (!admin && !has('aso-agent')) {
    refuse('catalog', 'only agents and admins write the catalog');
  }
  if (newDoc._deleted) {
    if (admin || (oldDoc && oldDoc.type === 'block')) { return; }
    refuse('catalog', 'agents delete blocks only');
  }
  if (oldDoc && !admin) { refuse('immutable', 'catalog documents do not change once written'); }
  if (newDoc._id.indexOf('_design/') === 0) {
    if (!admin) { refuse('design', 'only admins may change design documents'); }
    return;
  }
  function str(v) { return typeof v === 'string' && v.length > 0 && v.length <= 1024; }
  function num(v) { return typeof v === 'number' && v >= 0 && Math.floor(v) === v; }
  if (newDoc.type === 'dataset') {
    if (!str(newDoc.dataset) || newDoc._id !== 'dataset:' + newDoc.dataset) {
      refuse('schema', 'a dataset document is dataset:<name> with its name in dataset');
    }
    return;
  }
  if (newDoc.type !== 'block') { refuse('schema', 'type must be block or dataset'); }
  if (!str(newDoc.dataset) || newDoc._id.indexOf(newDoc.dataset + '#') !== 0) {
    refuse('schema', 'a block is named <dataset>#<id>');
  }
  if (!str(newDoc.origin_site) || !str(newDoc.user)) {
    refuse('schema', 'a block needs origin_site and user');
  }
  if (!Array.isArray(newDoc.files) || newDoc.files.length === 0) {
    refuse('schema', 'a block needs files');
  }
  var seen = {};
  for (var i = 0; i < newDoc.files.length; i++) {
    var f = newDoc.files[i];
    if (!f || !str(f.lfn) || f.lfn.indexOf('/store/') !== 0) {
      refuse('schema', 'files[' + i + '].lfn must be an LFN under /store/');
    }
    if (seen[f.lfn]) { refuse('schema', 'file ' + f.lfn + ' twice in the block'); }
    seen[f.lfn] = true;
    if (!num(f.size) || !str(f.adler32) || !num(f.events)) {
      refuse('schema', 'files[' + i + '] needs size, adler32 and events');
    }
    if (typeof f.lumis !== 'object' || !Array.isArray(f.parents)) {
      refuse('schema', 'files[' + i + '] needs lumis (object) and parents (list)');
    }
  }
}"""

DESIGN = {
    "_id": f"_design/{DDOC}",
    "language": "javascript",
    "validate_doc_update": VALIDATE,
    "views": {
        # Which block holds an LFN (at most one, enforced by publish_block).
        "files": {
            "map": "function (doc) { if (doc.type === 'block') { for (var i = 0; i < "
            "doc.files.length; i++) { emit(doc.files[i].lfn, {block: doc._id, dataset: "
            "doc.dataset, created: doc.created}); } } }"
        },
        # The blocks of a dataset, oldest first, with their counts.
        "blocks": {
            "map": "function (doc) { if (doc.type === 'block') { var size = 0; for (var i = 0; "
            "i < doc.files.length; i++) { size += doc.files[i].size; } emit([doc.dataset, "
            "doc.created, doc._id], {files: doc.files.length, size: size, origin_site: "
            "doc.origin_site, user: doc.user}); } }"
        },
    },
}


def init_catalog_db(admin: Server, name: str = DEFAULT_DB) -> bool:
    """Create the catalog database (True if created now), set its `_security` and push its
    design document. Idempotent."""
    created = admin.create_db(name, SECURITY)
    admin.db(name).push_design(DESIGN)
    return created


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


def _store_error(action: str, exc: StoreError) -> CatalogError:
    # A store that is down or overloaded may come back; a refusal (403) or a bad request will
    # not by itself.
    retryable = (
        isinstance(exc, StoreUnavailable) or exc.status in (0, 408, 429) or exc.status >= 500
    )
    kind = CatalogStoreDown if retryable else CatalogError
    return kind(f"embedded catalog: {action}: {exc}", retryable=retryable)


class EmbeddedCatalog(Catalog):
    name = "embedded"

    def __init__(self, db: Database, *, clock: Any = time.time):
        self.db = db
        self._clock = clock
        # Datasets known to have their document: a block's dataset is written once, not
        # tried again (a refused write) for every block (datasets are never deleted).
        self._datasets: set[str] = set()

    @classmethod
    def open(cls, server: Server, name: str = DEFAULT_DB) -> EmbeddedCatalog:
        return cls(server.db(name))

    # -- publishing -----------------------------------------------------------------------

    def publish_block(self, block: Block) -> bool:
        check_block(block)
        try:
            elsewhere = self._published_elsewhere(block)
            if elsewhere:
                raise BlockConflict(elsewhere_message(block, elsewhere), elsewhere)
            self._ensure_dataset(block)
            doc = block_document(block, self._clock())
            try:
                rev = self.db.create(doc)
            except Conflict:
                return self._compare_existing(block)
            # Another block with one of these files may have been written at the same moment.
            elsewhere = self._published_elsewhere(block)
            if elsewhere:
                self.db.delete(block.name, rev)
                raise CatalogError(
                    elsewhere_message(block, elsewhere)
                    + " (published at the same moment; this block was withdrawn)",
                    retryable=True,
                )
        except Forbidden as exc:
            raise CatalogError(
                f"embedded catalog refused block {block.name}: {exc}", False
            ) from None
        except StoreError as exc:
            raise _store_error(f"publishing block {block.name}", exc) from None
        log.debug("published block %s (%d files)", block.name, len(block.files))
        return True

    def _compare_existing(self, block: Block) -> bool:
        stored = self.db.get(block.name)
        if stored is None or stored.get("type") != BLOCK:
            # Withdrawn in between (a racing publisher's back-off): try again later.
            raise CatalogError(f"block {block.name} changed while publishing", retryable=True)
        stored_lfns = sorted(f["lfn"] for f in stored["files"])
        if stored_lfns == block.lfns():
            log.debug("block %s was already published", block.name)
            return False
        raise BlockConflict(content_message(block.name, stored_lfns, block.lfns()))

    def _published_elsewhere(self, block: Block) -> dict[str, str]:
        """{LFN: other block} for the block's LFNs that another block holds."""
        rows = self.db.view(DDOC, "files", keys=block.lfns()).rows
        return {r["key"]: r["value"]["block"] for r in rows if r["value"]["block"] != block.name}

    def _ensure_dataset(self, block: Block) -> None:
        if block.dataset in self._datasets:
            return
        doc = {
            "_id": DATASET_PREFIX + block.dataset,
            "type": DATASET,
            "schema": SCHEMA_VERSION,
            "dataset": block.dataset,
            "user": block.user,
            "created": self._clock(),
        }
        with contextlib.suppress(Conflict):  # there already
            self.db.create(doc)
        self._datasets.add(block.dataset)

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
