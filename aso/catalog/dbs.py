"""The DBS3 catalog (production): blocks published through DBS's official client (PyPI
`dbs3-client`, module `dbs.apis.dbsClient`, over pycurl), the way CRAB's publisher does it.

One `insertBulkBlock` per block (POST <writer>/bulkblocks), with the block dump CRAB builds
(CRABServer src/python/Publisher/PublisherDbsUtils.py: format_file_3, createBulkBlock,
prepareDbsPublishingConfigs; the structure is dbs2go's BulkBlocks, dbs/bulkblocks.go):

    dataset_conf_list  [output config: release_version, pset_hash, app_name "cmsRun",
                        output_module_label "o", global_tag]
    file_conf_list     [output config + lfn, one per file]
    files              [logical_file_name, file_type "EDM", check_sum, adler32, event_count,
                        file_size, file_lumi_list [{run_num, lumi_section_num}]]
    processing_era     {processing_version, description}
    acquisition_era    {acquisition_era_name, start_date 0}
    primds             {primary_ds_name, primary_ds_type}
    dataset            {dataset, processed_ds_name, data_tier_name "USER",
                        dataset_access_type "VALID", physics_group_name,
                        last_modification_date}
    block              {block_name, origin_site_name, open_for_writing 0, file_count,
                        block_size}
    file_parent_list   [{logical_file_name, parent_logical_file_name}]

Idempotence: block names are content-derived, so before inserting, `listBlocks(block_name=)`
tells whether the block is there (then `listFiles(block_name=)` compares its files: same set →
False, another → BlockConflict), and `listFiles(logical_file_name=[...])` whether one of its
files is already in another block (BlockConflict naming them; DBS would refuse the insert on its
unique LFN constraint anyway). An insert DBS refuses (400) is looked at again the same way, since
a racing publisher may have inserted the block in between.

Errors: no connection, TLS failures, timeouts (pycurl errors), 5xx, 408, 429 and refused
credentials (401/403) → CatalogError(retryable=True): the publisher tries again later; 400
(DBS's validation and insert errors) and other 4xx → CatalogError(retryable=False).

Settings come from the `dbs` section of the configuration (read with getattr, defaults here):
url (writer), reader_url (empty: the writer URL with DBSWriter → DBSReader), proxy (empty:
$X509_USER_PROXY, then /tmp/x509up_u<uid>), capath, acquisition_era, processing_version,
global_tag, release_version, timeout.

Client quirks handled here: it needs $USER (it sends USER@host as UserID; set from the account
when missing), finds its CA directory only through $X509_CERT_DIR or
/etc/grid-security/certificates (set from `capath` while the client is built), sets no timeout
(set on its curl options), prints DBS's error bodies on stdout, and one curl handle must not be
used by two threads at once (calls are serialised).
"""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from aso.catalog.base import (
    Block,
    BlockConflict,
    Catalog,
    CatalogError,
    CatalogFile,
    content_message,
)
from aso.catalog.embedded import check_block, elsewhere_message
from aso.grid import gridenv

log = logging.getLogger("aso.catalog.dbs")

T = TypeVar("T")

# DBS lexicon (dbs2go static/lexicon*.json), the parts ASO's datasets and blocks must match.
DATASET_RE = re.compile(r"^/([a-zA-Z][a-zA-Z0-9_-]{0,99})/([a-zA-Z0-9_.-]{1,199})/([A-Z-]{1,50})$")
BLOCK_SUFFIX_RE = re.compile(r"^[a-zA-Z0-9._-]{1,100}$")
PSET_HASH_RE = re.compile(r"^[0-9a-f]{32}$")

USER_TIER = "USER"
APP_NAME = "cmsRun"  # CRAB: appName
OUTPUT_MODULE_LABEL = "o"  # CRAB: output_config['output_module_label']
FILE_TYPE = "EDM"  # CRAB: format_file_3
PRIMARY_DS_TYPE = "mc"  # CRAB's choice without an input dataset ("private MC")
PHYSICS_GROUP = "CRAB3"  # CRAB: dataset_config['physics_group_name']
PROCESSING_ERA_DESCRIPTION = "CRAB3_processing_era"  # CRAB: processing_era_config
NO_PSET_HASH = "dummy_hash"  # when the processed name carries no pset hash
NO_CHECKSUM = "NOTSET"  # DBS requires check_sum (cksum); ASO knows adler32 only
RETRYABLE_STATUS = {401, 403, 408, 429}
TIMEOUT = 300.0
CONNECT_TIMEOUT = 30.0

# The client builds its CA directory from the environment only while it is being made.
_ENV_LOCK = threading.Lock()


@dataclass(frozen=True)
class DbsSettings:
    url: str
    reader_url: str = ""
    proxy: str = ""
    capath: str = "/etc/grid-security/certificates"
    acquisition_era: str = "CRAB"
    processing_version: int = 1
    global_tag: str = "None"
    release_version: str = "CMSSW_X"
    timeout: float = TIMEOUT

    @classmethod
    def from_config(cls, config: Any) -> DbsSettings:
        section = getattr(config, "dbs", None)
        if section is None:
            raise CatalogError("no [dbs] section in the configuration", retryable=False)

        def get(key: str, default: Any) -> Any:
            value = getattr(section, key, default)
            return default if value is None else value

        def path(value: str) -> str:
            return str(config.path(value)) if value and hasattr(config, "path") else value

        return cls(
            url=get("url", ""),
            reader_url=get("reader_url", ""),
            proxy=path(get("proxy", "")),
            capath=path(get("capath", cls.capath)),
            acquisition_era=get("acquisition_era", cls.acquisition_era),
            processing_version=int(get("processing_version", cls.processing_version)),
            global_tag=str(get("global_tag", cls.global_tag)),
            release_version=get("release_version", cls.release_version),
            timeout=float(get("timeout", cls.timeout)),
        )

    @property
    def reader(self) -> str:
        if self.reader_url:
            return self.reader_url
        writer = self.url.rstrip("/")
        if writer.endswith("/DBSWriter"):
            return writer[: -len("DBSWriter")] + "DBSReader"
        return writer

    @property
    def proxy_path(self) -> str:
        return self.proxy or gridenv.default_proxy()


# --- the block dump --------------------------------------------------------------------------


def split_dataset(dataset: str) -> tuple[str, str, str]:
    match = DATASET_RE.match(dataset)
    if not match:
        raise CatalogError(f"{dataset!r} is not a DBS dataset name", retryable=False)
    primary, processed, tier = match.groups()
    return primary, processed, tier


def pset_hash_of(processed: str) -> str:
    """A CRAB user dataset's processed name ends in -<pset hash>; CRAB publishes that hash."""
    tail = processed.rsplit("-", 1)[-1]
    return tail if PSET_HASH_RE.match(tail) else NO_PSET_HASH


def dbs_file(f: CatalogFile) -> dict[str, Any]:
    """A file of the dump (CRAB's format_file_3, without the parents, which go to
    file_parent_list)."""
    lumis = [
        {"lumi_section_num": int(lumi), "run_num": int(run)}
        for run, run_lumis in sorted(f.lumis.items(), key=lambda item: int(item[0]))
        for lumi in run_lumis
    ]
    return {
        "logical_file_name": f.lfn,
        "file_type": FILE_TYPE,
        "check_sum": NO_CHECKSUM,
        "adler32": f.adler32,
        "event_count": int(f.events),
        "file_size": int(f.size),
        "file_lumi_list": lumis,
    }


def block_dump(block: Block, settings: DbsSettings, now: float | None = None) -> dict[str, Any]:
    """The insertBulkBlock argument for a block (CRAB's createBulkBlock)."""
    primary, processed, tier = split_dataset(block.dataset)
    output_config = {
        "release_version": settings.release_version,
        "pset_hash": pset_hash_of(processed),
        "app_name": APP_NAME,
        "output_module_label": OUTPUT_MODULE_LABEL,
        "global_tag": settings.global_tag,
    }
    # Files with lumis first: the client looks at the first file's lumis to decide whether the
    # block gives event counts per lumi, and a first file without lumis makes it raise "Mixed
    # event_count per lumi" after a successful insert.
    files = sorted(block.files, key=lambda f: (not f.lumis, f.lfn))
    return {
        "dataset_conf_list": [output_config],
        "file_conf_list": [{**output_config, "lfn": f.lfn} for f in files],
        "files": [dbs_file(f) for f in files],
        "processing_era": {
            "processing_version": settings.processing_version,
            "description": PROCESSING_ERA_DESCRIPTION,
        },
        "primds": {"primary_ds_name": primary, "primary_ds_type": PRIMARY_DS_TYPE},
        "dataset": {
            "dataset": block.dataset,
            "processed_ds_name": processed,
            "data_tier_name": tier,
            "dataset_access_type": "VALID",
            "physics_group_name": PHYSICS_GROUP,
            "last_modification_date": int(now if now is not None else time.time()),
        },
        "acquisition_era": {"acquisition_era_name": settings.acquisition_era, "start_date": 0},
        "block": {
            "block_name": block.name,
            "origin_site_name": block.origin_site,
            "open_for_writing": 0,
            "file_count": len(files),
            "block_size": sum(int(f.size) for f in files),
        },
        "file_parent_list": [
            {"logical_file_name": f.lfn, "parent_logical_file_name": parent}
            for f in files
            for parent in dict.fromkeys(f.parents)
        ],
    }


def check_dbs_block(block: Block) -> None:
    """What DBS would refuse, said before asking it (not retryable)."""
    check_block(block)
    _, _, tier = split_dataset(block.dataset)
    if tier != USER_TIER:
        raise CatalogError(
            f"{block.dataset}: ASO publishes user datasets (tier {USER_TIER}), not {tier}",
            retryable=False,
        )
    if not BLOCK_SUFFIX_RE.match(block.name.split("#", 1)[1]):
        raise CatalogError(f"{block.name} is not a DBS block name", retryable=False)
    for f in block.files:
        if f.size <= 0:
            raise CatalogError(f"{f.lfn}: DBS refuses files of size {f.size}", retryable=False)
        if not f.adler32:
            raise CatalogError(f"{f.lfn}: no adler32 checksum", retryable=False)


# --- errors ----------------------------------------------------------------------------------


def _dbs_message(body: Any) -> str:
    """The useful part of DBS's JSON error body: [{"error": {"reason", "message", "code"},
    "http": {...}, "exception": <status>, "type": "HTTPError", "message": ...}]."""
    try:
        data = json.loads(body) if isinstance(body, str | bytes) else body
    except ValueError:
        text = str(body or "").strip()
        return re.sub(r"<[^>]+>", " ", text)[:300].strip()
    if isinstance(data, list) and data:
        data = data[0]
    if not isinstance(data, dict):
        return str(data)[:300]
    error = data.get("error")
    if isinstance(error, dict):
        parts = [str(error.get(k)) for k in ("message", "reason") if error.get(k)]
        code = error.get("code")
        return (f"DBS error {code}: " if code else "") + " - ".join(parts)
    return str(data.get("message") or error or data)[:500]


def map_error(action: str, exc: BaseException) -> CatalogError:
    """A failure of the DBS client as a CatalogError with the right `retryable`."""
    import pycurl
    from dbs.exceptions.dbsClientException import dbsClientException
    from RestClient.ErrorHandling.RestClientExceptions import ClientAuthException, HTTPError

    if isinstance(exc, CatalogError):
        return exc
    if isinstance(exc, HTTPError):
        try:
            status = int(exc.code)
        except (TypeError, ValueError):
            status = 0
        detail = _dbs_message(exc.body) or str(exc.msg)
        retryable = status >= 500 or status in RETRYABLE_STATUS or status == 0
        return CatalogError(f"DBS {action}: HTTP {status}: {detail}", retryable=retryable)
    if isinstance(exc, pycurl.error):
        code, text = (*exc.args, None, "")[:2]
        return CatalogError(f"DBS {action}: cannot reach DBS (curl {code}: {text})", True)
    if isinstance(exc, ClientAuthException):
        # A missing proxy or CA directory: an operator (or the proxy renewal) fixes it.
        detail = getattr(exc, "_msg", exc)
        return CatalogError(f"DBS {action}: credentials: {detail}", retryable=True)
    if isinstance(exc, dbsClientException):
        return CatalogError(f"DBS {action}: {exc.reason}: {exc.message}", retryable=False)
    if isinstance(exc, ValueError):
        # The client lets a JSON decoding error escape when an error answer is neither JSON
        # nor HTML (a front end's plain-text page); the HTTPError it was handling is still in
        # the exception's context and says what DBS answered.
        context = exc.__context__
        while context is not None and not isinstance(context, HTTPError):
            context = context.__context__
        if context is not None:
            return map_error(action, context)
        return CatalogError(f"DBS {action}: unreadable answer ({exc})", retryable=True)
    return CatalogError(f"DBS {action}: {type(exc).__name__}: {exc}", retryable=False)


# --- the catalog -----------------------------------------------------------------------------


class DbsCatalog(Catalog):
    name = "dbs"

    def __init__(self, settings: DbsSettings):
        if not settings.url:
            raise CatalogError("dbs.url (the DBS writer URL) is not set", retryable=False)
        self.settings = settings
        self._writer: Any = None
        self._reader: Any = None
        self._lock = threading.RLock()

    @classmethod
    def from_config(cls, config: Any) -> DbsCatalog:
        return cls(DbsSettings.from_config(config))

    # -- the client -----------------------------------------------------------------------

    def _make_api(self, url: str) -> Any:
        import pycurl
        from dbs.apis.dbsClient import DbsApi

        proxy = self.settings.proxy_path
        # The client sends $USER@host as UserID with every call and fails without $USER.
        if not os.environ.get("USER"):
            os.environ["USER"] = _account_name()
        with _ENV_LOCK, _environment(X509_CERT_DIR=self.settings.capath):
            api = DbsApi(url=url, key=proxy, cert=proxy)
        # No timeout by default: a DBS that hangs would hang the publisher.
        options = api.rest_api._additional_curl_options
        options[pycurl.TIMEOUT] = int(self.settings.timeout)
        options[pycurl.CONNECTTIMEOUT] = int(min(CONNECT_TIMEOUT, self.settings.timeout))
        options[pycurl.NOSIGNAL] = 1
        return api

    def _api(self, which: str) -> Any:
        if which == "writer":
            if self._writer is None:
                self._writer = self._make_api(self.settings.url)
            return self._writer
        if self._reader is None:
            self._reader = self._make_api(self.settings.reader)
        return self._reader

    def _call(self, action: str, which: str, fn: Callable[[Any], T]) -> T:
        printed = io.StringIO()
        with self._lock:
            try:
                # The client prints DBS's error bodies on stdout: keep them for the log.
                with contextlib.redirect_stdout(printed):
                    return fn(self._api(which))
            except Exception as exc:  # the client raises many kinds; map them in one place
                error = map_error(action, exc)
                log.warning("%s (retryable: %s)", error, error.retryable)
                if printed.getvalue().strip():
                    log.debug("DBS client said: %s", printed.getvalue().strip())
                raise error from None

    # -- publishing -----------------------------------------------------------------------

    def publish_block(self, block: Block) -> bool:
        check_dbs_block(block)
        existing = self._existing(block)
        if existing is not None:
            return existing
        elsewhere = self._published_elsewhere(block)
        if elsewhere:
            raise BlockConflict(elsewhere_message(block, elsewhere), elsewhere)
        dump = block_dump(block, self.settings)
        try:
            self._call(
                f"insert block {block.name}", "writer", lambda api: api.insertBulkBlock(dump)
            )
        except CatalogError as exc:
            if exc.retryable:
                raise
            # Refused: did a racing publisher insert this block, or one of its files, meanwhile?
            existing = self._existing(block)
            if existing is not None:
                return existing
            elsewhere = self._published_elsewhere(block)
            if elsewhere:
                raise BlockConflict(elsewhere_message(block, elsewhere), elsewhere) from None
            raise
        log.debug("published block %s (%d files) to DBS", block.name, len(block.files))
        return True

    def _existing(self, block: Block) -> bool | None:
        """False if the block is in DBS with the same files; None if it is not there."""
        stored = self.block_files(block.name)
        if stored is None:
            return None
        if stored == block.lfns():
            log.debug("block %s was already in DBS", block.name)
            return False
        raise BlockConflict(content_message(block.name, stored, block.lfns()))

    def _published_elsewhere(self, block: Block) -> dict[str, str]:
        rows = self._call(
            f"look up the files of {block.name}",
            "reader",
            lambda api: api.listFiles(logical_file_name=block.lfns(), detail=True),
        )
        return {
            r["logical_file_name"]: r["block_name"]
            for r in rows
            if r.get("block_name") != block.name
        }

    # -- reading ----------------------------------------------------------------------------

    def block_files(self, name: str) -> list[str] | None:
        blocks = self._call(
            f"look up block {name}", "reader", lambda api: api.listBlocks(block_name=name)
        )
        if not blocks:
            return None
        rows = self._call(
            f"list the files of {name}", "reader", lambda api: api.listFiles(block_name=name)
        )
        return sorted(r["logical_file_name"] for r in rows)

    def dataset_files(self, dataset: str) -> dict[str, list[str]]:
        files = self.files(dataset) or []
        out: dict[str, list[str]] = {}
        for f in files:
            out.setdefault(f["block"], []).append(f["lfn"])
        return {name: sorted(lfns) for name, lfns in out.items()}

    def dataset_exists(self, dataset: str) -> bool:
        rows = self._call(
            f"look up dataset {dataset}",
            "reader",
            lambda api: api.listDatasets(dataset=dataset, dataset_access_type="*"),
        )
        return bool(rows)

    def blocks(self, dataset: str) -> list[dict[str, Any]] | None:
        """The dataset's blocks (oldest first) or None if DBS does not know the dataset."""
        if not self.dataset_exists(dataset):
            return None
        rows = self._call(
            f"list the blocks of {dataset}",
            "reader",
            lambda api: api.listBlocks(dataset=dataset, detail=True),
        )
        out = [
            {
                "block": r["block_name"],
                "files": r.get("file_count", 0),
                "size": r.get("block_size", 0),
                "origin_site": r.get("origin_site_name", ""),
                "created": r.get("creation_date", 0),
            }
            for r in rows
        ]
        return sorted(out, key=lambda b: (b["created"], b["block"]))

    def files(self, dataset: str) -> list[dict[str, Any]] | None:
        if not self.dataset_exists(dataset):
            return None
        rows = self._call(
            f"list the files of {dataset}",
            "reader",
            lambda api: api.listFiles(dataset=dataset, detail=True),
        )
        return [
            {
                "lfn": r["logical_file_name"],
                "size": r.get("file_size", 0),
                "events": r.get("event_count", 0),
                "adler32": r.get("adler32", ""),
                "block": r["block_name"],
            }
            for r in sorted(rows, key=lambda r: (r["block_name"], r["logical_file_name"]))
        ]

    def close(self) -> None:
        with self._lock:
            self._writer = self._reader = None


def _account_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return f"uid{os.geteuid()}"


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    try:
        for key, value in values.items():
            if value:
                os.environ[key] = value
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
