"""An HTTPS double of the DBS3 reader and writer APIs that ASO's DBS catalog calls through the
official client (PyPI `dbs3-client`, pycurl), with client-certificate (RFC 3820 proxy) auth.

Written from DBS's Go server, dmwm/dbs2go: web/handlers.go (routing of GET/POST per API, POST
only with Content-Type application/json, 400 for an API's error, ServerInfoHandler), the error
body of web/handlers.go `responseMsg` and docs/DBSServer.md (a list of one ServerError:
{"error": {reason, message, function, code}, "http": {method, code, timestamp, path, user_agent,
x_forwarded_host, x_forwarded_for, remote_addr}, "exception": <status>, "type": "HTTPError",
"message": ...}), dbs/errors.go (DBS error codes and their descriptions), dbs/bulkblocks.go
(BulkBlocks structure; parents must already be in DBS; the insert is one transaction),
dbs/files.go (Files record: check_sum, adler32, file_size > 0 required; list parameters), and
from the Python server's DBSBlockInsert.py ("Block ... already exists", duplicated LFNs refused:
400). Listing answers have the keys the client documents for detail=False/True.

What it reproduces, since the client or ASO depends on it:
* URLs <base>/dbs/<instance>/<db>/DBSReader|DBSWriter/<api>; the reader answers GETs, the writer
  GETs and POSTs (dbs2go registers both per handler), other methods 405;
* the client's list parameters: it urlencodes a Python list as its repr ("['a', 'b']"), which
  dbs2go's parseParams reads back by stripping brackets and quotes and splitting on commas;
* parameter checks per API (an unknown parameter: 400, code 118), listFiles and listBlocks
  without a required parameter: 400;
* bulkblocks: JSON and schema validation, lexicon patterns (dataset, block, LFN), parents that
  must exist, a block name that exists (400, code 128 BlockAlreadyExists), an LFN that exists
  (400, code 110, the unique constraint), all or nothing;
* identity: the DN of the end-entity certificate of the client's chain becomes create_by.

Test controls: `fail_next` (the next N matching requests answer an error: DBS's JSON body, or
an HTML/plain page as a front end would send), `requests` (every request with headers, query and
parsed body), `blocks`/`files`/`datasets` (what was inserted), `bulk_dumps` (every accepted
insertBulkBlock body).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cryptography import x509

from aso.local import pki as certs

DBS_VERSION = "3.16.0-comp4"  # web/handlers.go ServerInfoHandler
PREFIX = re.compile(r"^/dbs/([^/]+)/([^/]+)/(DBSReader|DBSWriter)/([A-Za-z_]+)$")

# dbs/errors.go
GENERIC, DATABASE, GETID, INSERT, VALIDATE, PATTERN = 100, 101, 109, 110, 113, 114
CONTENT_TYPE, PARAMETERS, UNMARSHAL, BLOCK_EXISTS = 117, 118, 122, 128
EXPLAIN = {
    GENERIC: "Generic DBS error",
    DATABASE: "DBS DB error",
    GETID: "DBS DB ID error for provided entity, e.g. there is no record in DB for provided value",
    INSERT: "DBS DB insert record error",
    VALIDATE: "DBS validation error, e.g. input parameter does not match lexicon rules",
    PATTERN: "DBS validation error when wrong pattern is provided",
    CONTENT_TYPE: "Wrong Content-Type HTTP header in HTTP request",
    PARAMETERS: "DBS invalid parameter for the DBS API",
    UNMARSHAL: "DBS unable to parse JSON record",
    BLOCK_EXISTS: "Not defined",  # dbs2go's Explain() has no text for codes past 127
}

# Lexicon (dbs2go static/lexicon*.json), as far as ASO's names go.
DATASET_RE = re.compile(r"^/([a-zA-Z][a-zA-Z0-9_-]{0,99})/([a-zA-Z0-9_.-]{1,199})/([A-Z-]{1,50})$")
BLOCK_RE = re.compile(r"^(/[^/#]+/[^/#]+/[^/#]+)#([a-zA-Z0-9._-]{1,100})$")
LFN_RE = re.compile(r"^/store/[A-Za-z0-9_.+=/-]+$")
ACCESS_TYPES = ("VALID", "INVALID", "PRODUCTION", "DEPRECATED", "DELETED")

# Parameters each GET API accepts (the client's validParameters; dbs2go checks them too).
GET_PARAMS = {
    "blocks": {
        "dataset",
        "block_name",
        "data_tier_name",
        "origin_site_name",
        "logical_file_name",
        "run_num",
        "open_for_writing",
        "min_cdate",
        "max_cdate",
        "min_ldate",
        "max_ldate",
        "cdate",
        "ldate",
        "detail",
    },
    "files": {
        "dataset",
        "block_name",
        "logical_file_name",
        "release_version",
        "pset_hash",
        "app_name",
        "output_module_label",
        "run_num",
        "origin_site_name",
        "lumi_list",
        "detail",
        "validFileOnly",
        "sumOverLumi",
    },
    "datasets": {
        "dataset",
        "parent_dataset",
        "is_dataset_valid",
        "release_version",
        "pset_hash",
        "app_name",
        "output_module_label",
        "processing_version",
        "acquisition_era_name",
        "run_num",
        "physics_group_name",
        "logical_file_name",
        "primary_ds_name",
        "primary_ds_type",
        "processed_ds_name",
        "data_tier_name",
        "dataset_access_type",
        "prep_id",
        "create_by",
        "last_modified_by",
        "min_cdate",
        "max_cdate",
        "min_ldate",
        "max_ldate",
        "cdate",
        "ldate",
        "detail",
        "dataset_id",
    },
    "serverinfo": set(),
}


class DbsError(Exception):
    """A DBS failure: HTTP status, DBS error code, message and reason, the function that
    failed; or a raw body (HTML or text) as a front end in front of DBS would answer."""

    def __init__(
        self,
        status: int,
        code: int = GENERIC,
        message: str = "",
        reason: str = "",
        function: str = "",
        *,
        raw: str | None = None,
        content_type: str = "application/json",
    ):
        super().__init__(message or reason)
        self.status, self.code, self.message, self.reason = status, code, message, reason
        self.function, self.raw, self.content_type = function, raw, content_type

    def text(self) -> str:
        """DBSError.Error() of dbs/errors.go."""
        sep = ": nested " if "DBSError" in self.reason else ": "
        return (
            f"DBSError Code:{self.code} Description:{EXPLAIN.get(self.code, 'Not defined')} "
            f"Function:{self.function} Message:{self.message} Error{sep}{self.reason}"
        )


@dataclass
class Recorded:
    method: str
    path: str
    api: str
    server: str  # DBSReader or DBSWriter
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any  # parsed JSON, text, or None
    dn: str | None
    status: int = 0


@dataclass
class Failure:
    status: int
    count: int
    method: str | None
    api: str | None
    body: str | None  # raw body (HTML, text); None: DBS's JSON error
    content_type: str

    def matches(self, method: str, api: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.api is None or self.api == api
        )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request.do_handshake()  # in the connection's thread, not in accept()
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _serve(self) -> None:
        self.server.double.serve(self)

    do_GET = do_POST = do_PUT = do_DELETE = _serve


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    double: DbsDouble

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.double.refused_connections += 1  # refused handshakes end up here


class DbsDouble:
    def __init__(self, pki: certs.Pki, *, instance: str = "int", db: str = "phys03"):
        self.pki = pki
        self.instance, self.db = instance, db
        self.datasets: dict[str, dict[str, Any]] = {}
        self.blocks: dict[str, dict[str, Any]] = {}
        self.files: dict[str, dict[str, Any]] = {}
        self.primary_datasets: dict[str, dict[str, Any]] = {}
        self.output_configs: list[dict[str, Any]] = []
        self.bulk_dumps: list[dict[str, Any]] = []
        self.requests: list[Recorded] = []
        self.failures: list[Failure] = []
        self.refused_connections = 0
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._server: _Server | None = None

    # -- life cycle -------------------------------------------------------------------------

    def tls_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.pki.host_cert, self.pki.host_key)
        context.load_verify_locations(capath=str(self.pki.capath))
        context.verify_mode = ssl.CERT_REQUIRED
        context.verify_flags |= ssl.VERIFY_ALLOW_PROXY_CERTS  # grid proxies, as cmsweb
        return context

    def start(self) -> DbsDouble:
        server = _Server(("127.0.0.1", 0), _Handler, bind_and_activate=False)
        server.double = self
        server.server_bind()
        server.server_activate()
        server.socket = self.tls_context().wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
        self._server = server
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> DbsDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base(self) -> str:
        assert self._server is not None, "not started"
        return f"https://127.0.0.1:{self._server.server_address[1]}/dbs/{self.instance}/{self.db}"

    @property
    def writer_url(self) -> str:
        return self.base + "/DBSWriter"

    @property
    def reader_url(self) -> str:
        return self.base + "/DBSReader"

    # -- test controls ----------------------------------------------------------------------

    def fail_next(
        self,
        status: int,
        count: int = 1,
        *,
        method: str | None = None,
        api: str | None = None,
        body: str | None = None,
        content_type: str = "text/html",
    ) -> None:
        """The next `count` requests of `method` to `api` answer `status`: with DBS's JSON
        error body, or with `body` (e.g. a front end's HTML page) as `content_type`."""
        with self._lock:
            self.failures.append(Failure(status, count, method, api, body, content_type))

    def requests_to(self, method: str, api: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.api == api]

    # -- HTTP -------------------------------------------------------------------------------

    def serve(self, handler: _Handler) -> None:
        raw = urlsplit(handler.path)
        query = parse_qs(raw.query, keep_blank_values=True)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        match = PREFIX.match(raw.path)
        api, server = (match.group(4), match.group(3)) if match else ("", "")
        record = Recorded(
            handler.command,
            raw.path,
            api,
            server,
            query,
            {k: v for k, v in handler.headers.items()},
            _parse_body(body),
            self._peer_dn(handler.request),
        )
        try:
            status, payload = self._answer(handler, match, query, body, record)
            content_type = "application/json"
            data = json.dumps(payload).encode()
        except DbsError as exc:
            status, content_type = exc.status, exc.content_type
            if exc.raw is not None:
                data = exc.raw.encode()
            else:
                data = json.dumps([self._error_body(handler, exc)]).encode()
        record.status = status
        with self._lock:
            self.requests.append(record)
        handler.send_response(status, HTTPStatus(status).phrase)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    @staticmethod
    def _error_body(handler: _Handler, exc: DbsError) -> dict[str, Any]:
        """web/handlers.go responseMsg: one ServerError."""
        return {
            "error": {
                "reason": exc.reason,
                "message": exc.message,
                "function": exc.function,
                "code": exc.code,
                "stacktrace": "",
            },
            "http": {
                "method": handler.command,
                "code": exc.status,
                "timestamp": str(dt.datetime.now(dt.UTC)),
                "path": handler.path,
                "user_agent": handler.headers.get("User-Agent", ""),
                "x_forwarded_host": "",
                "x_forwarded_for": "",
                "remote_addr": "{}:{}".format(*handler.client_address[:2]),
            },
            "exception": exc.status,
            "type": "HTTPError",
            "message": exc.text(),
        }

    @staticmethod
    def _peer_dn(sock: ssl.SSLSocket) -> str | None:
        try:  # private in Python 3.11: the chain OpenSSL verified
            chain = [
                x509.load_der_x509_certificate(c.public_bytes(ssl._ssl.ENCODING_DER))  # type: ignore[attr-defined]
                for c in sock._sslobj.get_verified_chain()  # type: ignore[union-attr]
            ]
        except AttributeError:
            der = sock.getpeercert(binary_form=True)
            if der is None:
                return None
            chain = [x509.load_der_x509_certificate(der)]
        return certs.end_entity_dn(chain)

    def _answer(
        self,
        handler: _Handler,
        match: re.Match[str] | None,
        query: dict[str, list[str]],
        body: bytes,
        record: Recorded,
    ) -> tuple[int, Any]:
        if match is None or (match.group(1), match.group(2)) != (self.instance, self.db):
            raise DbsError(404, raw="404 page not found\n", content_type="text/plain")
        server, api = match.group(3), match.group(4)
        method = handler.command
        with self._lock:
            for failure in self.failures:
                if failure.count > 0 and failure.matches(method, api):
                    failure.count -= 1
                    if failure.body is not None:
                        raise DbsError(
                            failure.status, raw=failure.body, content_type=failure.content_type
                        )
                    raise DbsError(
                        failure.status,
                        GENERIC,
                        "injected failure",
                        f"{HTTPStatus(failure.status).phrase}",
                        f"web.{api}",
                    )
        routes: dict[tuple[str, str], Callable[..., tuple[int, Any]]] = {
            ("GET", "serverinfo"): self._serverinfo,
            ("GET", "datasets"): self._list_datasets,
            ("GET", "blocks"): self._list_blocks,
            ("GET", "files"): self._list_files,
            ("POST", "bulkblocks"): self._bulkblocks,
        }
        action = routes.get((method, api))
        allowed = method == "GET" or (server == "DBSWriter" and method == "POST")
        if action is None or not allowed:
            if any(a == api for _, a in routes):
                raise DbsError(405, raw="", content_type="text/plain")
            raise DbsError(404, raw="404 page not found\n", content_type="text/plain")
        if method == "POST":
            content_type = handler.headers.get("Content-Type", "")
            if content_type != "application/json":
                raise DbsError(
                    415,
                    CONTENT_TYPE,
                    f"unsupported Content-Type: '{content_type}'",
                    "content-type error",
                    "web.DBSPostHandler",
                )
            return action(body, record.dn or "DBS-workflow")
        params = _parse_params(query)
        unknown = sorted(set(params) - GET_PARAMS[api])
        if unknown:
            raise DbsError(
                400,
                PARAMETERS,
                f"parameter '{unknown[0]}' is not accepted by '{api}' API",
                "invalid parameter(s)",
                "dbs.parameters.CheckQueryParameters",
            )
        with self._lock:
            return action(params)

    # -- reader APIs --------------------------------------------------------------------------

    def _serverinfo(self, params: dict[str, list[str]]) -> tuple[int, Any]:
        return 200, {"server": {"name": "dbs2go-double"}, "dbs_version": DBS_VERSION}

    def _list_datasets(self, params: dict[str, list[str]]) -> tuple[int, Any]:
        wanted = params.get("dataset", [])
        access = (params.get("dataset_access_type") or ["VALID"])[0]
        rows = [
            d
            for name, d in sorted(self.datasets.items())
            if (not wanted or _glob_any(wanted, name))
            and (access == "*" or d["dataset_access_type"] == access)
        ]
        if _detail(params):
            return 200, [dict(d) for d in rows]
        return 200, [{"dataset": d["dataset"]} for d in rows]

    def _list_blocks(self, params: dict[str, list[str]]) -> tuple[int, Any]:
        needed = ("dataset", "block_name", "data_tier_name", "logical_file_name")
        if not any(params.get(k) for k in needed):
            raise DbsError(
                400,
                PARAMETERS,
                "dataset, block_name, data_tier_name or logical_file_name is required",
                "invalid parameter(s)",
                "dbs.blocks.Blocks",
            )
        rows = list(self.blocks.values())
        if params.get("block_name"):
            rows = [b for b in rows if _glob_any(params["block_name"], b["block_name"])]
        if params.get("dataset"):
            rows = [b for b in rows if _glob_any(params["dataset"], b["dataset"])]
        if params.get("logical_file_name"):
            held = {
                self.files[lfn]["block_name"]
                for lfn in params["logical_file_name"]
                if lfn in self.files
            }
            rows = [b for b in rows if b["block_name"] in held & set(self.blocks)]
        if params.get("origin_site_name"):
            rows = [b for b in rows if b["origin_site_name"] in params["origin_site_name"]]
        rows.sort(key=lambda b: b["block_id"])
        if _detail(params):
            return 200, [dict(b) for b in rows]
        return 200, [{"block_name": b["block_name"]} for b in rows]

    def _list_files(self, params: dict[str, list[str]]) -> tuple[int, Any]:
        if not params:
            raise DbsError(
                400, GENERIC, "", "Files API with empty parameter map", "dbs.files.Files"
            )
        if not any(params.get(k) for k in ("dataset", "block_name", "logical_file_name")):
            raise DbsError(
                400,
                PARAMETERS,
                "logical_file_name, dataset or block_name is required",
                "invalid parameter(s)",
                "dbs.files.Files",
            )
        rows = list(self.files.values())
        for key in ("dataset", "block_name", "logical_file_name"):
            if params.get(key):
                rows = [f for f in rows if _glob_any(params[key], f[key])]
        if (params.get("validFileOnly") or ["0"])[0] == "1":
            rows = [f for f in rows if f["is_file_valid"] == 1]
        rows.sort(key=lambda f: f["file_id"])
        if _detail(params):
            return 200, [{k: v for k, v in f.items() if not k.startswith("_")} for f in rows]
        return 200, [{"logical_file_name": f["logical_file_name"]} for f in rows]

    # -- writer: bulkblocks -------------------------------------------------------------------

    def _bulkblocks(self, body: bytes, create_by: str) -> tuple[int, Any]:
        function = "dbs.bulkblocks.InsertBulkBlocks"
        try:
            rec = json.loads(body)
            if not isinstance(rec, dict):
                raise ValueError("json: cannot unmarshal array into Go value of type BulkBlocks")
        except ValueError as exc:
            raise DbsError(400, UNMARSHAL, "", str(exc), function) from None
        with self._lock:
            plan = self._validate_bulk(rec, function)
            self._insert_bulk(rec, plan, create_by)
            self.bulk_dumps.append(rec)
        return 200, []  # dbs2go writes `[]`

    def _validate_bulk(self, rec: dict[str, Any], function: str) -> dict[str, Any]:
        def refuse(code: int, message: str, reason: str = "invalid parameter(s)") -> DbsError:
            return DbsError(400, code, message, reason, function)

        try:
            dataset = rec["dataset"]
            block = rec["block"]
            files = rec["files"]
            primds = rec["primds"]
            acq = rec["acquisition_era"]
            proc = rec["processing_era"]
            conf_list = rec["dataset_conf_list"]
            file_conf_list = rec["file_conf_list"]
        except (KeyError, TypeError) as exc:
            raise refuse(VALIDATE, f"missing {exc} in bulkblocks record") from None
        name = dataset.get("dataset", "")
        match = DATASET_RE.match(name)
        if not match:
            raise refuse(PATTERN, f"unable to match 'dataset' value '{name}'")
        primary, processed, tier = match.groups()
        if (primary, processed, tier) != (
            primds.get("primary_ds_name"),
            dataset.get("processed_ds_name"),
            dataset.get("data_tier_name"),
        ):
            raise refuse(VALIDATE, "dataset name does not match primds/processed/tier")
        if dataset.get("dataset_access_type") not in ACCESS_TYPES:
            raise refuse(GETID, "", "sql: no rows in result set (dataset_access_type)")
        if not acq.get("acquisition_era_name") or not isinstance(
            proc.get("processing_version"), int
        ):
            raise refuse(VALIDATE, "acquisition_era_name and processing_version are required")
        block_name = block.get("block_name", "")
        bmatch = BLOCK_RE.match(block_name)
        if not bmatch or bmatch.group(1) != name:
            raise refuse(PATTERN, f"unable to match 'block_name' value '{block_name}'")
        if not block.get("origin_site_name"):
            raise refuse(VALIDATE, "origin_site_name is required")
        if block_name in self.blocks:  # BlockAlreadyExists (dbs/errors.go)
            raise refuse(
                BLOCK_EXISTS, f"Block {block_name} already exists", "Data already exist in DBS"
            )
        for key in ("release_version", "pset_hash", "app_name", "output_module_label"):
            if not all(c.get(key) for c in conf_list):
                raise refuse(VALIDATE, f"dataset_conf_list: {key} is required")
        lfns = [f.get("logical_file_name", "") for f in files]
        if not files or len(set(lfns)) != len(lfns):
            raise refuse(VALIDATE, "files must be a non-empty list of distinct files")
        for f in files:
            lfn = f.get("logical_file_name", "")
            if not LFN_RE.match(lfn) or "/../" in lfn:
                raise refuse(PATTERN, f"unable to match 'logical_file_name' value '{lfn}'")
            # Files record (dbs/files.go): check_sum, adler32, event_count required, size > 0.
            if not f.get("check_sum") or not f.get("adler32"):
                raise refuse(VALIDATE, f"{lfn}: check_sum and adler32 are required")
            if not isinstance(f.get("file_size"), int) or f["file_size"] <= 0:
                raise refuse(VALIDATE, f"{lfn}: file_size must be a number greater than 0")
            if not isinstance(f.get("event_count"), int):
                raise refuse(VALIDATE, f"{lfn}: event_count is required")
            for lumi in f.get("file_lumi_list", []):
                if not isinstance(lumi.get("run_num"), int) or not isinstance(
                    lumi.get("lumi_section_num"), int
                ):
                    raise refuse(VALIDATE, f"{lfn}: run_num and lumi_section_num must be numbers")
        if {c.get("lfn") for c in file_conf_list} != set(lfns):
            raise refuse(VALIDATE, "file_conf_list does not match files")
        for parent in rec.get("file_parent_list") or []:
            plfn = parent.get("parent_logical_file_name", "")
            if parent.get("logical_file_name") not in lfns:
                raise refuse(DATABASE, f"no file id found for '{parent.get('logical_file_name')}'")
            if plfn not in self.files:
                raise DbsError(
                    400,
                    DATABASE,
                    f"unable to find parent lfn {plfn}",
                    "sql: no rows in result set",
                    "dbs.bulkblocks.InsertBulkBlocksConcurrently",
                )
        taken = [lfn for lfn in lfns if lfn in self.files]
        if taken:
            constraint = f"ORA-00001: unique constraint (CMS_DBS3_{self.db.upper()}_OWNER."
            raise DbsError(
                400,
                INSERT,
                f"unable to insert files, error {taken[0]}",
                constraint + "TUC_FL_LOGICAL_FILE_NAME) violated",
                "dbs.bulkblocks.insertFilesViaChunks",
            )
        return {"primary": primary, "processed": processed, "tier": tier}

    def _insert_bulk(self, rec: dict[str, Any], plan: Mapping[str, str], create_by: str) -> None:
        now = int(dt.datetime.now(dt.UTC).timestamp())
        ds = rec["dataset"]
        name = ds["dataset"]
        self.output_configs.extend(rec["dataset_conf_list"])
        self.primary_datasets.setdefault(
            plan["primary"],
            {
                "primary_ds_name": plan["primary"],
                "primary_ds_type": rec["primds"].get("primary_ds_type", ""),
                "create_by": create_by,
                "creation_date": now,
            },
        )
        if name not in self.datasets:
            self.datasets[name] = {
                "dataset_id": next(self._ids),
                "dataset": name,
                "primary_ds_name": plan["primary"],
                "primary_ds_type": rec["primds"].get("primary_ds_type", ""),
                "processed_ds_name": plan["processed"],
                "data_tier_name": plan["tier"],
                "dataset_access_type": ds["dataset_access_type"],
                "acquisition_era_name": rec["acquisition_era"]["acquisition_era_name"],
                "processing_version": rec["processing_era"]["processing_version"],
                "physics_group_name": ds.get("physics_group_name"),
                "xtcrosssection": ds.get("xtcrosssection"),
                "prep_id": ds.get("prep_id"),
                "create_by": create_by,
                "creation_date": now,
                "last_modified_by": create_by,
                "last_modification_date": now,
            }
        dataset = self.datasets[name]
        block = rec["block"]
        block_id = next(self._ids)
        files = rec["files"]
        self.blocks[block["block_name"]] = {
            "block_id": block_id,
            "block_name": block["block_name"],
            "dataset": name,
            "dataset_id": dataset["dataset_id"],
            "origin_site_name": block["origin_site_name"],
            "open_for_writing": block.get("open_for_writing", 1),
            "file_count": block.get("file_count", len(files)),
            "block_size": block.get("block_size", sum(f["file_size"] for f in files)),
            "create_by": create_by,
            "creation_date": now,
            "last_modified_by": create_by,
            "last_modification_date": now,
        }
        parents: dict[str, list[str]] = {}
        for p in rec.get("file_parent_list") or []:
            parents.setdefault(p["logical_file_name"], []).append(p["parent_logical_file_name"])
        for f in files:
            lfn = f["logical_file_name"]
            self.files[lfn] = {
                "file_id": next(self._ids),
                "logical_file_name": lfn,
                "block_id": block_id,
                "block_name": block["block_name"],
                "dataset_id": dataset["dataset_id"],
                "dataset": name,
                "file_type": f.get("file_type", "EDM"),
                "file_type_id": 1,
                "check_sum": f["check_sum"],
                "adler32": f["adler32"],
                "md5": f.get("md5"),
                "file_size": f["file_size"],
                "event_count": f["event_count"],
                "is_file_valid": f.get("is_file_valid", 1),
                "auto_cross_section": f.get("auto_cross_section"),
                "branch_hash_id": None,
                "create_by": create_by,
                "creation_date": now,
                "last_modified_by": create_by,
                "last_modification_date": now,
                # Not part of listFiles answers (filelumis/fileparents APIs hold them).
                "_lumis": [(x["run_num"], x["lumi_section_num"]) for x in f["file_lumi_list"]],
                "_parents": parents.get(lfn, []),
            }

    # -- what tests read back -----------------------------------------------------------------

    def file_lumis(self, lfn: str) -> list[tuple[int, int]]:
        return sorted(self.files[lfn]["_lumis"])

    def file_parents(self, lfn: str) -> list[str]:
        return sorted(self.files[lfn]["_parents"])


# -- helpers ----------------------------------------------------------------------------------


def _parse_params(query: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """dbs2go web/handlers.go parseParams: a value with '[' is a list written as
    ['a', 'b'] (the client's urlencode of a Python list); quotes are dropped."""
    params: dict[str, list[str]] = {}
    for key, values in query.items():
        out: list[str] = []
        for value in values:
            if "[" in value:
                inner = value[value.index("[") + 1 : value.rindex("]")]
                out += [x.strip().replace("'", "") for x in inner.split(",") if x.strip()]
            else:
                out.append(value.replace("'", ""))
        params[key] = out
    return params


def _detail(params: Mapping[str, list[str]]) -> bool:
    return (params.get("detail") or ["false"])[0].lower() in ("true", "1")


def _glob_any(patterns: list[str], value: str) -> bool:
    """DBS accepts '*' wildcards in names."""
    return any(re.fullmatch(re.escape(p).replace(r"\*", ".*"), value) for p in patterns)


def _parse_body(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")
