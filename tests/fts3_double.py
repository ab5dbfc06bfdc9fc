"""An HTTP double of the part of FTS3's REST API that the official client (PyPI `fts3`) and
ASO's fts3 back end use, served over HTTPS with client-certificate (RFC 3820 proxy) auth.

Written from FTS3's server, fts-rest-flask (src/fts3rest/fts3rest/): controllers/api.py (`GET /`),
controllers/delegation.py (whoami and the delegation dance), controllers/jobs.py (submit, get,
get_files, get_dm, cancel, cancel_files), lib/JobBuilder.py and lib/JobBuilder_utils.py
(validation, defaults, deterministic ids), lib/middleware/fts3auth/credentials.py and
methods/ssl.py (DN, VO, delegation id), config/middleware.py (JSON error bodies), the functional
tests (tests/functional/test_job_listing.py, test_delegation.py, test_job_invalid_submit.py) for
status codes and messages, and the database schema (t_file.file_state) for the file states.

What it reproduces, since the client or ASO depends on it:
* URLs: the client asks for `<endpoint>//jobs` (it joins endpoint and an absolute path with a
  '/'); FTS's Apache merges the slashes, so does the double.
* identity: the DN of the end-entity certificate of the client's chain (mod_gridsite), the VOs
  from VOMS FQANs (given to the double per DN, since test proxies carry no VOMS attributes) or
  FTS's "virtual VO" built from the DN, delegation id = sha1(DN + FQANs)[:16];
* authorization of job reads and cancels by level: private (own jobs), vo, all;
* submission: FTS's defaults and validation (messages as FTS words them), max_time_in_queue
  in hours unless suffixed (s, m, h), retry, priority clamped to 1..5, checksum method from
  verify_checksum, job_metadata + auth_method, deterministic ids uuid5(uuid5(BASE_ID, vo), sid),
  409 for a duplicated sid, 419 without a delegation with an hour left;
* status: one job (an object; 404/403 as FTS's JSON error), several jobs (a list; 207 with
  per-job http_status/http_message when some fail), `?files=` field lists, /files, /dm;
* cancel: whole jobs (`304 Not Modified` inside the answer for finished ones) and files by
  FTS file id (the states of the files, or "File does not belong to the job").

Test controls: `set_file_state`, `fail_next` (the next N matching requests answer an error),
`expire_delegation`, `forget_job`, and `requests` (every request, for assertions).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import re
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from aso.local import pki as certs

BASE_ID = uuid.UUID("01874efb-4735-4595-bc9c-591aef8240c9")  # JobBuilder_utils.BASE_ID
API_VERSION = {"major": 3, "minor": 10, "patch": 0}  # controllers/api.py
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"  # helpers/jsonify.py (naive UTC datetimes)

FILE_ACTIVE_STATES = (
    "STAGING",
    "STARTED",
    "SUBMITTED",
    "READY",
    "ACTIVE",
    "ARCHIVING",
    "QOS_TRANSITION",
    "QOS_REQUEST_SUBMITTED",
)
FILE_TERMINAL_STATES = ("FINISHED", "FAILED", "CANCELED")
FILE_ON_HOLD_STATES = ("NOT_USED", "ON_HOLD", "ON_HOLD_STAGING")
# Every state a test may put a file in: the model's, plus FORCE_START and TOKEN_PREP of the
# schema (t_file.file_state) and DELETE of deletion jobs.
FILE_STATES = (
    *FILE_ACTIVE_STATES,
    *FILE_TERMINAL_STATES,
    *FILE_ON_HOLD_STATES,
    "FORCE_START",
    "TOKEN_PREP",
    "DELETE",
)
JOB_ACTIVE_STATES = (
    "STAGING",
    "SUBMITTED",
    "READY",
    "ACTIVE",
    "DELETE",
    "ARCHIVING",
    "QOS_TRANSITION",
    "QOS_REQUEST_SUBMITTED",
)

DEFAULT_PARAMS: dict[str, Any] = {  # JobBuilder_utils.DEFAULT_PARAMS
    "bring_online": -1,
    "verify_checksum": False,
    "copy_pin_lifetime": -1,
    "gridftp": "",
    "job_metadata": None,
    "overwrite": False,
    "reuse": None,
    "multihop": False,
    "source_spacetoken": "",
    "spacetoken": "",
    "retry": 0,
    "retry_delay": 0,
    "priority": 3,
    "max_time_in_queue": 0,
    "s3alternate": False,
}

LEVELS = ("none", "private", "vo", "all")
SUBMIT_HOST = "fts3-double.localdomain"


def utcnow() -> str:
    return dt.datetime.now(dt.UTC).strftime(TIME_FORMAT)


def fts_time(value: dt.datetime | str | None) -> str | None:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).strftime(TIME_FORMAT)
    return value


def vo_from_fqan(fqan: str) -> str:
    groups = []
    for part in fqan.split("/")[1:]:
        if part.lower().startswith("role="):
            break
        groups.append(part)
    return "/".join(groups)


def build_vo_from_dn(dn: str) -> str:
    """FTS's 'virtual VO' of a user without VOMS attributes: CN@reversed.DCs."""
    pairs = [tuple(c.split("=", 1)) for c in dn.split("/") if c.count("=") == 1]
    cns = [v for k, v in pairs if k.upper() == "CN"]
    uname = "".join(cns[-1].split()) if cns else ""
    domain = [v for k, v in pairs if k.upper() == "DC"]
    return uname + "@" + ".".join(reversed(domain))


def delegation_id(dn: str, fqans: Iterable[str]) -> str:
    digest = hashlib.sha1(dn.encode())  # FTS's own naming scheme, not a security measure
    for fqan in fqans:
        digest.update(fqan.encode())
    return digest.hexdigest()[:16]


def deterministic_job_id(vo: str, sid: str) -> str:
    return str(uuid.uuid5(uuid.uuid5(BASE_ID, vo), str(sid)))


def seconds_from_value(value: Any) -> int | None:
    """JobBuilder_utils.seconds_from_value: an int is HOURS; a string takes s/m/h."""
    if isinstance(value, int) and not isinstance(value, bool) and value != 0:
        return value * 3600
    if not isinstance(value, str):
        return None
    try:
        number, suffix = int(value[:-1]), value[-1].lower()
    except (ValueError, IndexError):
        return None
    return {"s": number, "m": number * 60, "h": number * 3600}.get(suffix)


def safe_flag(flag: Any) -> bool:
    if isinstance(flag, str):
        return len(flag) > 0 and flag[0].upper() == "Y"
    return bool(flag)


class HttpError(Exception):
    """An FTS error answer: {"status": "<code> <name>", "message": ...} unless `body` is given."""

    def __init__(self, status: int, message: str = "", body: Any = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body


def status_line(code: int) -> str:
    if code == 419:
        return "419 Authentication Timeout"
    return f"{code} {HTTPStatus(code).phrase}"


@dataclass
class User:
    dn: str
    fqans: list[str]
    vos: list[str]
    delegation_id: str
    level: str  # transfer level: none, private, vo, all


@dataclass
class Recorded:
    method: str
    path: str  # slashes merged, no query
    query: dict[str, str]
    body: Any  # parsed JSON, text, or None
    dn: str | None
    status: int = 0


@dataclass
class Failure:
    status: int
    count: int
    method: str | None
    path: str | None  # regular expression matched against the path
    message: str

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path is None or re.fullmatch(self.path, path) is not None
        )


@dataclass
class Answer:
    status: int
    body: Any
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        # Headers and body go out in separate writes: without TCP_NODELAY the second waits for
        # the client's delayed ACK (40 ms a request).
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The TLS handshake runs here, in the connection's thread, not in accept().
        self.request.do_handshake()
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _serve(self) -> None:
        self.server.double.serve(self)

    do_GET = do_POST = do_PUT = do_DELETE = _serve


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    double: Fts3Double

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Refused handshakes (no or untrusted client certificate) end up here: keep count.
        self.double.refused_connections += 1


class Fts3Double:
    def __init__(
        self,
        pki: certs.Pki,
        *,
        voms: Mapping[str, list[str]] | None = None,
        levels: Mapping[str, str] | None = None,
        public_level: str = "vo",
    ):
        self.pki = pki
        self.voms = dict(voms or {})  # DN -> FQANs its proxies would carry
        self.levels = dict(levels or {})  # DN -> transfer level
        self.public_level = public_level  # fts3restconfig Roles.Public.transfer
        unknown = {public_level, *self.levels.values()} - set(LEVELS)
        if unknown:
            raise ValueError(f"unknown authorization levels {unknown}; known: {LEVELS}")
        self.jobs: dict[str, dict[str, Any]] = {}
        self.files: dict[str, list[dict[str, Any]]] = {}
        self.delegations: dict[str, dict[str, Any]] = {}  # dlg_id -> credential
        self.pending_requests: dict[str, rsa.RSAPrivateKey] = {}  # dlg_id -> pending key
        self.requests: list[Recorded] = []
        self.failures: list[Failure] = []
        self.refused_connections = 0
        self._file_ids = itertools.count(1001)
        self._lock = threading.RLock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle -------------------------------------------------------------------------

    def tls_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.pki.host_cert, self.pki.host_key)
        context.load_verify_locations(capath=str(self.pki.capath))
        context.verify_mode = ssl.CERT_REQUIRED
        # Python's ssl refuses proxy certificates unless told otherwise, as OpenSSL does.
        context.verify_flags |= ssl.VERIFY_ALLOW_PROXY_CERTS
        return context

    def start(self) -> Fts3Double:
        server = _Server(("127.0.0.1", 0), _Handler, bind_and_activate=False)
        server.double = self
        server.server_bind()
        server.server_activate()
        server.socket = self.tls_context().wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Fts3Double:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # -- test controls ----------------------------------------------------------------------

    def fail_next(
        self,
        status: int,
        count: int = 1,
        *,
        method: str | None = None,
        path: str | None = None,
        message: str | None = None,
    ) -> None:
        """The next `count` requests matching method and path (a regex) answer `status`."""
        text = message or f"Injected failure ({status_line(status)})"
        with self._lock:
            self.failures.append(Failure(status, count, method, path, text))

    def requests_to(self, method: str, path: str | None = None) -> list[Recorded]:
        """Recorded requests of a method, optionally whose path matches the regex `path`."""
        with self._lock:
            return [
                r
                for r in self.requests
                if r.method == method and (path is None or re.fullmatch(path, r.path))
            ]

    def user_for(self, dn: str) -> User:
        fqans = list(self.voms.get(dn, []))
        vos = [vo for vo in dict.fromkeys(vo_from_fqan(f) for f in fqans) if vo]
        level = self.levels.get(dn, self.public_level)
        return User(dn, fqans, vos or [build_vo_from_dn(dn)], delegation_id(dn, fqans), level)

    def file(self, job_id: str, which: int | str) -> dict[str, Any]:
        """A file of a job by index in the job, FTS file id, or ASO request id (metadata)."""
        files = self.files[job_id]
        if isinstance(which, int) and which < len(files):
            return files[which]
        for f in files:
            meta = f.get("file_metadata")
            request_id = meta.get("request_id") if isinstance(meta, dict) else None
            if which in (f["file_id"], request_id):
                return f
        raise KeyError(f"job {job_id} has no file {which!r}")

    def set_file_state(
        self,
        job_id: str,
        which: int | str,
        state: str,
        reason: str | None = None,
        *,
        checksum: str | None = None,
        start_time: dt.datetime | None = None,
        finish_time: dt.datetime | None = None,
    ) -> dict[str, Any]:
        """Move a file to `state` as FTS's daemons would: start_time when it goes active,
        finish_time when it ends, the job's state from its files'."""
        if state not in FILE_STATES:
            raise ValueError(f"not an FTS file state: {state}")
        with self._lock:
            f = self.file(job_id, which)
            f["file_state"] = state
            f["reason"] = reason
            if checksum is not None:
                f["checksum"] = checksum
            if start_time or (state == "ACTIVE" and not f["start_time"]):
                f["start_time"] = fts_time(start_time) or utcnow()
            if state in FILE_TERMINAL_STATES:
                f["finish_time"] = fts_time(finish_time) or utcnow()
                f["filesize"] = f["user_filesize"] if state == "FINISHED" else f["filesize"]
            self._update_job_state(job_id)
            return f

    def expire_delegation(self, dn: str) -> None:
        user = self.user_for(dn)
        with self._lock:
            if user.delegation_id in self.delegations:
                past = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
                self.delegations[user.delegation_id]["termination_time"] = fts_time(past)

    def forget_job(self, job_id: str) -> None:
        """The job left FTS's database (archived and purged)."""
        with self._lock:
            self.jobs.pop(job_id, None)
            self.files.pop(job_id, None)

    # -- HTTP -------------------------------------------------------------------------------

    def serve(self, handler: _Handler) -> None:
        raw = urlsplit(handler.path)
        path = re.sub("/+", "/", raw.path)  # Apache's MergeSlashes
        query = {k: v[0] for k, v in parse_qs(raw.query, keep_blank_values=True).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        user = self.user_for(self._peer_dn(handler.request))
        record = Recorded(handler.command, path, query, _parse_body(body), user.dn)
        try:
            answer = self._answer(handler.command, path, query, body, user)
        except HttpError as exc:
            payload = exc.body if exc.body is not None else self._error(exc)
            answer = Answer(exc.status, payload)
        record.status = answer.status
        with self._lock:
            self.requests.append(record)
        _send(handler, answer)

    @staticmethod
    def _error(exc: HttpError) -> dict[str, str]:
        return {"status": status_line(exc.status), "message": exc.message}

    @staticmethod
    def _peer_dn(sock: ssl.SSLSocket) -> str:
        try:  # private in Python 3.11 (public from 3.13): the chain OpenSSL verified
            chain = [
                x509.load_der_x509_certificate(c.public_bytes(ssl._ssl.ENCODING_DER))  # type: ignore[attr-defined]
                for c in sock._sslobj.get_verified_chain()  # type: ignore[union-attr]
            ]
        except AttributeError:
            der = sock.getpeercert(binary_form=True)
            assert der is not None
            chain = [x509.load_der_x509_certificate(der)]
        return certs.end_entity_dn(chain)

    def _answer(
        self, method: str, path: str, query: dict[str, str], body: bytes, user: User
    ) -> Answer:
        with self._lock:
            for failure in self.failures:
                if failure.count > 0 and failure.matches(method, path):
                    failure.count -= 1
                    raise HttpError(failure.status, failure.message)
        for route_method, pattern, action in self._routes():
            match = re.fullmatch(pattern, path)
            if match and method == route_method:
                with self._lock:
                    return action(user, query, body, *[unquote(g) for g in match.groups()])
        if any(re.fullmatch(p, path) for _, p, _ in self._routes()):
            raise HttpError(405, "The method is not allowed for the requested URL.")
        raise HttpError(404, "The requested URL was not found on the server.")

    def _routes(self) -> list[tuple[str, str, Callable[..., Answer]]]:
        return [
            ("GET", "/", self._api_version),
            ("GET", "/whoami", self._whoami),
            ("GET", "/delegation/([^/]+)", self._delegation_view),
            ("DELETE", "/delegation/([^/]+)", self._delegation_delete),
            ("GET", "/delegation/([^/]+)/request", self._delegation_request),
            ("PUT", "/delegation/([^/]+)/credential", self._delegation_credential),
            ("POST", "/delegation/([^/]+)/credential", self._delegation_credential),
            ("POST", "/jobs", self._submit),
            ("PUT", "/jobs", self._submit),
            ("GET", "/jobs/([^/]+)/files", self._get_files),
            ("GET", "/jobs/([^/]+)/dm", self._get_dm),
            ("DELETE", "/jobs/([^/]+)/files/([^/]+)", self._cancel_files),
            ("GET", "/jobs/([^/]+)", self._get_jobs),
            ("DELETE", "/jobs/([^/]+)", self._cancel_jobs),
        ]

    # -- api, whoami, delegation (controllers/api.py, controllers/delegation.py) -------------

    def _api_version(self, user: User, query: dict, body: bytes) -> Answer:
        return Answer(
            200,
            {
                "delegation": {"major": 1, "minor": 0, "patch": 0},
                "api": API_VERSION,
                "core": None,
                "schema": {"major": 9, "minor": 0, "patch": 0, "message": "double"},
                "_links": {
                    "fts:whoami": {"href": "/whoami", "title": "Check user certificate"},
                    "fts:job": {"href": "/jobs/{id}", "templated": True},
                    "fts:jobsubmit": {"href": "/jobs", "hints": {"allow": ["POST"]}},
                },
            },
        )

    def _whoami(self, user: User, query: dict, body: bytes) -> Answer:
        return Answer(
            200,
            {
                "user_dn": user.dn,
                "dn": [user.dn],
                "base_id": str(BASE_ID),
                "voms_cred": user.fqans,
                "vos": user.vos,
                "vos_id": [str(uuid.uuid5(BASE_ID, vo)) for vo in user.vos],
                "roles": [],
                "level": {"transfer": user.level, "deleg": "all"},
                "delegation_id": user.delegation_id,
                "method": "certificate",
                "is_root": user.level == "all",
            },
        )

    @staticmethod
    def _own_delegation(user: User, dlg_id: str) -> None:
        if dlg_id != user.delegation_id:
            raise HttpError(403, "The requested ID and the credentials ID do not match")

    def _delegation_view(self, user: User, query: dict, body: bytes, dlg_id: str) -> Answer:
        self._own_delegation(user, dlg_id)
        cred = self.delegations.get(dlg_id)
        if cred is None:
            return Answer(200, None)
        return Answer(
            200,
            {"termination_time": cred["termination_time"], "voms_attrs": cred["voms_attrs"]},
        )

    def _delegation_delete(self, user: User, query: dict, body: bytes, dlg_id: str) -> Answer:
        self._own_delegation(user, dlg_id)
        if self.delegations.pop(dlg_id, None) is None:
            raise HttpError(404, "Delegated credentials not found")
        return Answer(204, None)

    def _delegation_request(self, user: User, query: dict, body: bytes, dlg_id: str) -> Answer:
        self._own_delegation(user, dlg_id)
        key = self.pending_requests.get(dlg_id)
        if key is None:  # FTS keeps one pending request per (dlg_id, DN), with a 1024-bit key
            key = certs.new_key(1024)
            self.pending_requests[dlg_id] = key
        csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(certs.name(("O", "Dummy")))
            .sign(key, hashes.SHA256())
        )
        pem = csr.public_bytes(serialization.Encoding.PEM).decode()
        return Answer(200, pem, "text/plain", {"X-Delegation-ID": dlg_id})

    def _delegation_credential(self, user: User, query: dict, body: bytes, dlg_id: str) -> Answer:
        self._own_delegation(user, dlg_id)
        key = self.pending_requests.get(dlg_id)
        if key is None:
            raise HttpError(400, "No credential cache found")
        try:
            termination = _validate_proxy(body, key)
        except ValueError as exc:
            raise HttpError(400, f"Could not process the proxy: {exc}") from exc
        self.delegations[dlg_id] = {
            "dn": user.dn,
            "proxy": body.decode(),
            "termination_time": termination,
            "voms_attrs": [" ".join(user.fqans)],
        }
        return Answer(201, "", "text/plain")

    # -- submission (controllers/jobs.py submit, lib/JobBuilder.py) -------------------------

    def _check_delegation(self, user: User) -> None:
        cred = self.delegations.get(user.delegation_id)
        if cred is None:
            raise HttpError(419, f'No delegation found for "{user.dn}"')
        end = dt.datetime.strptime(cred["termination_time"], TIME_FORMAT).replace(tzinfo=dt.UTC)
        remaining = end - dt.datetime.now(dt.UTC)
        if remaining <= dt.timedelta(0):
            raise HttpError(
                419,
                f"The delegated credentials expired {abs(remaining.total_seconds()):.0f} seconds"
                f" ago ({user.delegation_id})",
            )
        if remaining < dt.timedelta(hours=1):
            raise HttpError(
                419,
                f"The delegated credentials has less than one hour left ({user.delegation_id})",
            )

    def _submit(self, user: User, query: dict, body: bytes) -> Answer:
        try:
            submitted = json.loads(body)
        except ValueError as exc:
            raise HttpError(400, f"Badly formatted JSON request ({exc})") from exc
        if not isinstance(submitted, dict):
            raise HttpError(400, "Badly formatted JSON request (not an object)")
        self._check_delegation(user)
        try:
            job, files = self._build_job(user, submitted)
        except ValueError as exc:
            raise HttpError(400, f"Invalid value within the request: {exc}") from exc
        except TypeError as exc:
            raise HttpError(400, f"Malformed request: {exc}") from exc
        except KeyError as exc:
            raise HttpError(400, f"Missing parameter: {exc}") from exc
        if job["job_id"] in self.jobs:
            raise HttpError(409, "The sid provided by the user is duplicated")
        self.jobs[job["job_id"]] = job
        self.files[job["job_id"]] = files
        return Answer(200, {"job_id": job["job_id"]})

    def _build_job(self, user: User, submitted: dict[str, Any]) -> tuple[dict, list[dict]]:
        params = _params(submitted.get("params") or {})
        if submitted.get("delete") is not None:
            raise HttpError(405, "Deletion jobs are no longer supported by FTS")
        files_list = submitted.get("files")
        if files_list is None:
            raise HttpError(400, "No transfers operations specified")
        job_id = self._job_id(user, params)
        job = _job_record(job_id, user, params)
        files: list[dict[str, Any]] = []
        for index, file_dict in enumerate(files_list):
            files += self._file_records(job, file_dict, index)
        if not files:
            raise HttpError(400, "No valid pairs available")
        _check_checksum(job, files)
        job["source_se"] = _common(f["source_se"] for f in files)
        job["dest_se"] = _common(f["dest_se"] for f in files)
        return job, files

    @staticmethod
    def _job_id(user: User, params: dict[str, Any]) -> str:
        if params.get("id_generator", "standard") != "deterministic":
            return str(uuid.uuid1())
        sid = params.get("sid")
        if sid is None:
            raise HttpError(400, "Need sid for deterministic job id generation")
        return deterministic_job_id(user.vos[0], str(sid))

    def _file_records(self, job: dict[str, Any], file_dict: Any, index: int) -> list[dict]:
        sources, destinations = file_dict["sources"], file_dict["destinations"]
        if not isinstance(sources, list) or not isinstance(destinations, list):
            raise TypeError("sources and destinations must be lists")
        state = "NOT_USED" if len(sources) > 1 else "SUBMITTED"
        metadata = file_dict.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            metadata = {"label": metadata}  # lib/JobBuilder_utils.metadata wraps non-dicts
        records = []
        for source in sources:
            for destination in destinations:
                src, dst = _validate_url(source), _validate_url(destination)
                records.append(
                    {
                        "file_id": next(self._file_ids),
                        "file_index": index,
                        "job_id": job["job_id"],
                        "file_state": state,
                        "source_surl": src.geturl(),
                        "dest_surl": dst.geturl(),
                        "source_se": f"{src.scheme}://{src.hostname}",
                        "dest_se": f"{dst.scheme}://{dst.hostname}",
                        "vo_name": job["vo_name"],
                        "priority": job["priority"],
                        "reason": None,
                        "filesize": 0,
                        "user_filesize": float(file_dict.get("filesize") or 0),
                        "checksum": file_dict.get("checksum"),
                        "file_metadata": metadata,
                        "activity": file_dict.get("activity") or "default",
                        "selection_strategy": file_dict.get("selection_strategy", "auto"),
                        "start_time": None,
                        "finish_time": None,
                        "tx_duration": None,
                        "throughput": None,
                        "retry": 0,
                        "transfer_host": None,
                    }
                )
        if state == "NOT_USED":
            records[0]["file_state"] = "SUBMITTED"  # the selected replica
        return records

    # -- status (controllers/jobs.py get, get_files, get_dm) -------------------------------

    def _job_for(self, user: User, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            raise HttpError(404, f'No job with the id "{job_id}" has been found')
        if not _authorized(user, job):
            raise HttpError(403, f'Not enough permissions to check the job "{job_id}"')
        return job

    def _get_jobs(self, user: User, query: dict[str, str], body: bytes, job_list: str) -> Answer:
        job_ids = job_list.split(",")
        fields = [f for f in query.get("files", "").split(",") if f]
        statuses: list[dict[str, Any]] = []
        errors = 0
        for job_id in filter(len, job_ids):
            try:
                job = self._job_for(user, job_id)
            except HttpError as exc:
                if len(job_ids) == 1:
                    raise
                statuses.append(_multistatus_error(job_id, exc))
                errors += 1
                continue
            entry = {**job, "http_status": "200 Ok"}
            if fields:
                entry["files"] = [{k: f[k] for k in fields if k in f} for f in self.files[job_id]]
            statuses.append(entry)
        if len(job_ids) == 1:
            return Answer(200, statuses[0])
        return Answer(207 if errors else 200, statuses)

    def _get_files(self, user: User, query: dict, body: bytes, job_id: str) -> Answer:
        self._job_for(user, job_id)
        return Answer(200, list(self.files[job_id]))

    def _get_dm(self, user: User, query: dict, body: bytes, job_id: str) -> Answer:
        self._job_for(user, job_id)
        return Answer(200, [])  # no data-management tasks: ASO submits transfers only

    # -- cancel (controllers/jobs.py cancel, cancel_files) ----------------------------------

    def _cancel_jobs(self, user: User, query: dict, body: bytes, job_list: str) -> Answer:
        requested = job_list.split(",")
        responses: list[dict[str, Any]] = []
        for job_id in filter(len, requested):
            try:
                job = self._job_for(user, job_id)
            except HttpError as exc:
                responses.append(_multistatus_error(job_id, exc))
                continue
            if job["job_state"] not in JOB_ACTIVE_STATES:
                message = "The job is in a terminal state"
                responses.append(
                    {**job, "http_status": "304 Not Modified", "http_message": message}
                )
                continue
            self._cancel_job(job)
            responses.append({**job, "http_status": "200 Ok", "http_message": None})
        if len(requested) > 1:  # _multistatus(expecting_multistatus=True): errors make a 207
            failed = any(_is_error_entry(r) for r in responses)
            return Answer(207 if failed else 200, responses)
        single = responses[0]
        code = int(single["http_status"].split()[0])
        return Answer(code if code >= 400 else 200, single)

    def _cancel_job(self, job: dict[str, Any]) -> None:
        now = utcnow()
        job.update(job_state="CANCELED", cancel_job=True, job_finished=now)
        job["reason"] = "Job canceled by the user"
        for f in self.files[job["job_id"]]:
            if f["file_state"] in FILE_ACTIVE_STATES:
                f.update(file_state="CANCELED", reason="Job canceled by the user", finish_time=now)

    def _cancel_files(
        self, user: User, query: dict, body: bytes, job_id: str, file_ids: str
    ) -> Answer:
        job = self._job_for(user, job_id)
        if job["job_type"] != "N":
            raise HttpError(
                400, f"Multihop or reuse jobs must be cancelled at once ({job['job_type']})"
            )
        wanted = file_ids.split(",")
        changed: list[str] = []
        for file_id in wanted:
            f = next((f for f in self.files[job_id] if str(f["file_id"]) == file_id), None)
            if f is None:
                changed.append("File does not belong to the job")
            elif f["file_state"] not in FILE_ACTIVE_STATES:
                changed.append(f["file_state"])
            else:
                f.update(file_state="CANCELED", finish_time=utcnow())
                changed.append("CANCELED")
        self._update_job_state(job_id)
        return Answer(200, changed if len(changed) > 1 else changed[0])

    def _update_job_state(self, job_id: str) -> None:
        """The job's state from its files' (an approximation of FTS's daemons; ASO reads file
        states only)."""
        job, states = self.jobs[job_id], [f["file_state"] for f in self.files[job_id]]
        live = [s for s in states if s not in FILE_TERMINAL_STATES and s != "NOT_USED"]
        if live:
            busy = {"ACTIVE", "READY", "STARTED", "ARCHIVING", "QOS_TRANSITION"}
            job["job_state"] = "ACTIVE" if busy & set(live) else "SUBMITTED"
            return
        if all(s == "FINISHED" for s in states if s != "NOT_USED"):
            job["job_state"] = "FINISHED"
        elif "FINISHED" in states:
            job["job_state"] = "FINISHEDDIRTY"
        elif "FAILED" in states:
            job["job_state"] = "FAILED"
        else:
            job["job_state"] = "CANCELED"
        job["job_finished"] = job["job_finished"] or utcnow()


# -- helpers of the submission ---------------------------------------------------------------


def _params(submitted: dict[str, Any]) -> dict[str, Any]:
    """JobBuilder._get_params: defaults, then the user's, None meaning 'the default'."""
    if not isinstance(submitted, dict):
        raise HttpError(400, "Malformed request: params must be an object")
    params = {**DEFAULT_PARAMS, **submitted}
    for key, value in params.items():
        if value is None and key in DEFAULT_PARAMS:
            params[key] = DEFAULT_PARAMS[key]
    metadata = params["job_metadata"]
    if metadata is not None and not isinstance(metadata, dict):
        metadata = {"label": metadata}
    params["job_metadata"] = {**(metadata or {}), "auth_method": "certificate"}
    return params


def _overwrite_flag(params: dict[str, Any]) -> str | None:
    flags = [
        safe_flag(params.get(k))
        for k in ("overwrite", "overwrite_on_retry", "overwrite_when_only_on_disk", "overwrite_hop")
    ]
    if sum(flags) > 1 and not (sum(flags) == 2 and flags[2] and flags[3]):
        raise HttpError(400, "Incompatible overwrite flags used at the same time")
    for flag, letter in zip(flags, "YRDM", strict=True):
        if flag:
            return letter
    return None


def _job_record(job_id: str, user: User, params: dict[str, Any]) -> dict[str, Any]:
    queue = seconds_from_value(params.get("max_time_in_queue"))
    return {
        "job_id": job_id,
        "job_state": "SUBMITTED",
        "job_type": "H" if params["multihop"] else ("Y" if safe_flag(params["reuse"]) else "N"),
        "cancel_job": None,
        "submit_host": SUBMIT_HOST,
        "user_dn": user.dn,
        "cred_id": user.delegation_id,
        "vo_name": user.vos[0],
        "voms_cred": " ".join(user.fqans),
        "reason": None,
        "submit_time": utcnow(),
        "priority": max(min(int(params["priority"]), 5), 1),
        "max_time_in_queue": int(time.time() + queue) if queue is not None else None,
        "overwrite_flag": _overwrite_flag(params),
        "verify_checksum": params["verify_checksum"],
        "job_metadata": params["job_metadata"],
        "retry": int(params["retry"]),
        "retry_delay": int(params["retry_delay"]),
        "job_finished": None,
        "source_se": None,
        "dest_se": None,
        "source_space_token": params["source_spacetoken"],
        "space_token": params.get("destination_spacetoken") or params["spacetoken"],
        "bring_online": int(params["bring_online"]),
        "copy_pin_lifetime": int(params["copy_pin_lifetime"]),
    }


def _check_checksum(job: dict[str, Any], files: list[dict[str, Any]]) -> None:
    """JobBuilder._check_checksum: a bool verify_checksum becomes both/target/none; FTS keeps
    the first letter (t_job.checksum_method)."""
    has_checksum = False
    for f in files:
        if f["checksum"] is not None:
            has_checksum = len(f["checksum"]) > 0
        else:
            f["checksum"] = "ADLER32"
    method = job["verify_checksum"]
    if isinstance(method, bool):
        if not method and has_checksum:
            method = "target"
        elif not method:
            method = "none"
        else:
            method = "both"
    if method not in ("source", "target", "both", "none"):
        raise ValueError(f"verify_checksum does not contain a valid value ({method})")
    job["verify_checksum"] = method[0]


def _validate_url(raw: Any):
    """JobBuilder_utils.validate_url; its messages."""
    url = urlsplit(raw.strip())
    if not url.scheme:
        raise ValueError(f"Missing scheme ({url.geturl()})")
    if url.scheme == "file":
        raise ValueError(f"Can not transfer local files ({url.geturl()})")
    if not url.path or (url.path == "/" and not url.query):
        raise ValueError(f"Missing path ({url.geturl()})")
    if not url.hostname:
        raise ValueError(f"Missing host ({url.geturl()})")
    return url


def _common(values: Iterable[str]) -> str | None:
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def _authorized(user: User, job: dict[str, Any]) -> bool:
    if user.level == "all":
        return True
    if user.level == "vo":
        return job["vo_name"] in user.vos
    if user.level == "private":
        return job["user_dn"] == user.dn
    return False


def _multistatus_error(job_id: str, exc: HttpError) -> dict[str, Any]:
    return {"job_id": job_id, "http_status": status_line(exc.status), "http_message": exc.message}


def _is_error_entry(entry: Mapping[str, Any]) -> bool:
    # FTS tells a job (which may carry "304 Not Modified") from an error entry (a plain dict).
    return "job_state" not in entry and not entry["http_status"].startswith("2")


def _validate_proxy(pem: bytes, key: rsa.RSAPrivateKey) -> str:
    """delegation._validate_proxy: the chain's first certificate holds the key of the pending
    request, is signed by the second, and is named after it plus one CN. Returns its end."""
    try:
        chain = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise ValueError("Malformed proxy") from exc
    if len(chain) < 2:
        raise ValueError("Malformed proxy")
    proxy, issuer = chain[0], chain[1]
    if proxy.public_key().public_numbers() != key.public_key().public_numbers():
        raise ValueError("The proxy does not match the stored associated private key")
    try:
        proxy.verify_directly_issued_by(issuer)
    except Exception as exc:  # InvalidSignature, ValueError, TypeError: all mean "not signed"
        raise ValueError(
            "Failed to verify the proxy, maybe signed with the wrong private key?"
        ) from exc
    rdns = proxy.subject.rdns
    if rdns[:-1] != issuer.subject.rdns or next(iter(rdns[-1])).oid != NameOID.COMMON_NAME:
        raise ValueError("The subject and the issuer of the proxy do not match")
    return fts_time(proxy.not_valid_after_utc) or ""


def _parse_body(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


def _send(handler: _Handler, answer: Answer) -> None:
    if answer.content_type == "application/json":
        data = json.dumps(answer.body).encode()
    else:
        data = str(answer.body).encode()
    if answer.status == 204:
        data = b""
    handler.send_response(answer.status, status_line(answer.status).split(" ", 1)[1])
    handler.send_header("Content-Type", answer.content_type)
    handler.send_header("Content-Length", str(len(data)))
    for name, value in answer.headers.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data)
