"""The `fts3` transfer service: FTS3's REST API through the official client (PyPI `fts3`,
`fts3.rest.client`), for production.

* Credentials: a job is submitted with its user's X.509 proxy (`JobRequest.credentials`, else
  `fts3.proxy`, else $X509_USER_PROXY), delegated to FTS by the client when the server has no
  delegation of it with two hours left. Status, look-ups and cancels use the configured proxy,
  which FTS must allow to read and cancel the VO's jobs (FTS authorization level "vo").
* Idempotence: jobs are submitted with `id_generator="deterministic"` and a `sid` made from the
  job key, so FTS names the job uuid5(uuid5(BASE_ID, vo), sid) (fts-rest-flask,
  lib/JobBuilder.py). A second submission of a key gets 409 from FTS and the id of the first;
  `lookup(key)` computes the id and asks FTS for it. The VO is the first one FTS sees in the
  credentials (`/whoami`): lookups try the VOs of every credential this process has used,
  the configured proxy's first.
* Status: one request for many jobs (`GET /jobs/<id>,<id>?files=...`); FTS's file states are
  mapped to ASO's five by FILE_STATES below; unknown jobs (404) are None. A file FINISHED in
  a job whose checksum method is "both" or "target" is `verified` (FTS compared the
  destination's adler32 with the request's); otherwise the monitor looks at the destination.
* Errors: what says "not now" (connection failures, timeouts, 401/403, 419, 5xx, an unusable
  proxy) raises TransferError (class "service"); a job FTS refuses as malformed (400) raises
  JobRefused.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from fts3.rest.client import easy
from fts3.rest.client.exceptions import (
    ClientError,
    FTS3ClientException,
    NeedDelegation,
    NotFound,
)
from fts3.rest.client.submitter import Submitter

from aso.config import Config, ConfigError
from aso.grid import gridenv
from aso.transfer import errors
from aso.transfer.base import (
    ACTIVE,
    CANCELED,
    DONE,
    FAILED,
    PENDING,
    FileStatus,
    JobRefused,
    JobRequest,
    JobStatus,
    TransferError,
    TransferService,
    job_id_for,
)

log = logging.getLogger("aso.transfer.fts3")

T = TypeVar("T")

# FTS's namespace of deterministic job ids (fts-rest-flask, lib/JobBuilder_utils.py BASE_ID).
BASE_ID = uuid.UUID("01874efb-4735-4595-bc9c-591aef8240c9")
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"  # FTS's datetimes: naive UTC (lib/helpers/jsonify.py)

# Every FTS file state (t_file.file_state, fts3 schema 9, and fts-rest-flask model/file.py),
# mapped to ASO's five. DONE only when the copy is complete and verified, because the cleaner
# then deletes the source; FAILED/CANCELED only for FTS's own terminal states, because the
# retry manager may then submit the file again; everything else keeps the file followed.
FILE_STATES: dict[str, str] = {
    # Queued at FTS, nothing happening to the file yet.
    "SUBMITTED": PENDING,  # accepted, waiting for a slot on its link
    "READY": PENDING,  # picked by the scheduler, about to start (no data moves yet)
    "TOKEN_PREP": PENDING,  # token transfers: FTS is fetching a refresh token first
    "ON_HOLD": PENDING,  # a storage of the link is banned with "wait": held, not failed
    "ON_HOLD_STAGING": PENDING,  # same, for a file that must be staged first
    "STAGING": PENDING,  # waiting for a tape recall to be requested (never asked by ASO)
    "NOT_USED": PENDING,  # an alternative replica or a later hop, not (yet) chosen
    "FORCE_START": PENDING,  # an operator forced it past the scheduler: it will start
    "DELETE": PENDING,  # a deletion task still to run (ASO submits none; not terminal)
    # FTS is working on the file.
    "ACTIVE": ACTIVE,  # the copy is running
    "STARTED": ACTIVE,  # the tape recall of the source is under way
    "ARCHIVING": ACTIVE,  # copied, waiting for the destination's tape migration: not safe yet
    "QOS_TRANSITION": ACTIVE,  # storage QoS change under way
    "QOS_REQUEST_SUBMITTED": ACTIVE,  # QoS change requested from the storage
    # Terminal at FTS.
    "FINISHED": DONE,  # copied and, with verify_checksum, checksums compared
    "FAILED": FAILED,  # failed after FTS's own retries; the reason says why
    "CANCELED": CANCELED,  # by a cancel, or by FTS when max_time_in_queue ran out
}

# The files' fields asked with the bulk status: the client's own list (Inquirer
# .get_jobs_statuses) plus file_id (to cancel single files) and checksum.
STATUS_FILE_FIELDS = (
    "file_id,file_state,source_surl,dest_surl,start_time,finish_time,reason,checksum,file_metadata"
)
DELEGATION_LIFETIME = dt.timedelta(hours=12)  # capped by the proxy's own lifetime
RENEW_DELEGATION_BELOW = dt.timedelta(hours=2)  # FTS refuses submissions under one hour

# What the client raises: its own exceptions, and requests' for connection failures.
CLIENT_ERRORS = (FTS3ClientException, requests.RequestException, ValueError)


def fts_job_id(vo: str, sid: str) -> str:
    """The id FTS gives a job submitted with id_generator=deterministic (JobBuilder.py)."""
    return str(uuid.uuid5(uuid.uuid5(BASE_ID, vo), sid))


def sid_for(key: str) -> str:
    """The sid of a job key: ASO's own uuid5 of it, stable, short and URL-safe."""
    return job_id_for(key)


def fts_time(value: Any) -> float | None:
    """Epoch seconds of an FTS datetime ("%Y-%m-%dT%H:%M:%S", UTC), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = dt.datetime.strptime(value[:19], TIME_FORMAT)
    except ValueError:
        return None
    return moment.replace(tzinfo=dt.UTC).timestamp()


def aso_state(fts_state: str) -> str:
    state = FILE_STATES.get(fts_state)
    if state is None:
        # A state this code does not know (a newer FTS): keep following the file rather than
        # end it wrongly; FTS's max_time_in_queue still ends a job that never moves.
        log.warning("unknown FTS file state %r: taken as pending", fts_state)
        return PENDING
    return state


def adler32_of(checksum: Any) -> str | None:
    """The hex value of an "ADLER32:<hex>" checksum (FTS's format), else None."""
    if not isinstance(checksum, str) or ":" not in checksum:
        return None
    algorithm, value = checksum.split(":", 1)
    return value.lower() if algorithm.lower() == "adler32" and value else None


def file_status(entry: Mapping[str, Any], verified: bool = False) -> FileStatus | None:
    """ASO's status of one FTS file, or None for a file that is not an ASO request; `verified`:
    its job had FTS compare the destination's checksum with the request's."""
    metadata = entry.get("file_metadata")
    file_id = metadata.get("request_id") if isinstance(metadata, dict) else None
    if not file_id:
        return None
    service_state = str(entry.get("file_state") or "UNKNOWN")
    state = aso_state(service_state)
    reason = entry.get("reason") or None
    error_class = None
    if state in (FAILED, CANCELED):
        error_class = errors.classify(message=reason)
        if state == CANCELED and error_class == errors.UNKNOWN:
            error_class = errors.CANCELED  # e.g. "stayed in the queue for too long"
    return FileStatus(
        file_id=file_id,
        state=state,
        service_state=service_state,
        reason=reason,
        error_class=error_class,
        checksum=adler32_of(entry.get("checksum")) if state == DONE else None,
        started=fts_time(entry.get("start_time")),
        ended=fts_time(entry.get("finish_time")),
        verified=verified and state == DONE,
    )


def checks_the_destination(entry: Mapping[str, Any]) -> bool:
    """FTS compared each finished file's destination checksum with the one submitted (the
    request's): the job's checksum method (`verify_checksum`, t_job.checksum_method, its first
    letter) is "both" or "target". "source", "none" or nothing: the monitor looks itself."""
    method = str(entry.get("verify_checksum") or "").lower()
    return method[:1] in ("b", "t")


def job_status(entry: Mapping[str, Any]) -> JobStatus:
    files = {}
    verified = checks_the_destination(entry)
    for file_entry in entry.get("files") or []:
        status = file_status(file_entry, verified)
        if status is not None:
            files[status.file_id] = status
    metadata = entry.get("job_metadata")
    key = metadata.get("aso_key") if isinstance(metadata, dict) else None
    return JobStatus(job_id=entry["job_id"], key=key, files=files)


def unwrap(exc: BaseException) -> BaseException:
    """The error behind the client's delegation errors, which it re-raises as
    ClientError(str(e)), hiding the HTTP error or connection failure."""
    while (
        isinstance(exc, ClientError)
        and exc.__context__ is not None
        and exc.reason == str(exc.__context__)
    ):
        exc = exc.__context__
    return exc


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def http_code(exc: ClientError) -> int | None:
    """The status of a ClientError: 400 says "Bad request...", other 4xx only their code."""
    reason = str(exc.reason or "")
    if reason.startswith("Bad request"):
        return 400
    return int(reason) if reason.isdigit() else None


@dataclass
class _Session:
    """A client Context for one proxy file, as long as the file does not change."""

    context: easy.Context
    stamp: tuple[int, int, int]
    vo: str | None = None


class Fts3Service(TransferService):
    name = "fts3"

    def __init__(self, config: Config):
        settings = config.fts3
        if not settings.endpoint:
            raise ConfigError("fts3.endpoint must be set when transfer.backend is fts3")
        self.endpoint = settings.endpoint.rstrip("/")
        self.proxy = self._default_proxy(config)
        self.capath = str(config.path(settings.capath))
        self.verify = settings.verify
        self.timeout = settings.timeout
        self.retry = settings.retry
        self.monitor_url = settings.monitor_url
        self.max_time_in_queue = config.transfer.max_time_in_queue
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _default_proxy(config: Config) -> str:
        if config.fts3.proxy:
            return str(config.path(config.fts3.proxy))
        return gridenv.default_proxy()

    # -- the interface ----------------------------------------------------------------------

    def submit(self, job: JobRequest) -> str:
        session = self._session(job.credentials)
        self._delegate(session)
        sid = sid_for(job.key)
        expected = fts_job_id(self._vo(session), sid)
        try:
            job_id = self._post(session, self._fts_job(job, sid))
        except NeedDelegation as exc:  # the delegation expired between the check and the POST
            raise self._unavailable("submit (no valid delegation)", exc) from exc
        except ClientError as exc:
            code = http_code(exc)
            if code == 409:
                # FTS already has a job of this sid: the one made by an earlier submission.
                log.info("job key %s: FTS already has job %s", job.key, expected)
                return expected
            if code in (400, 413):
                raise JobRefused(f"FTS3 refused job {job.key}: {exc}") from exc
            raise self._unavailable("submit", exc) from exc
        except CLIENT_ERRORS as exc:
            raise self._unavailable("submit", exc) from exc
        if job_id != expected:
            log.warning("FTS named job %s, not %s: another id scheme?", job_id, expected)
        link = self.monitor_link(job_id) or ""
        log.debug("job key %s submitted as %s (%d files) %s", job.key, job_id, len(job.files), link)
        return job_id

    def job_id_of(self, job: JobRequest) -> str:
        """FTS's deterministic id of the job (id_generator=deterministic: its VO and sid)."""
        return fts_job_id(self._vo(self._session(job.credentials)), sid_for(job.key))

    def lookup(self, key: str) -> str | None:
        session = self._session()
        sid = sid_for(key)
        for vo in self._known_vos(session):
            job_id = fts_job_id(vo, sid)
            try:
                easy.get_job_status(session.context, job_id)
            except NotFound:
                continue
            except CLIENT_ERRORS as exc:
                raise self._unavailable(f"look up job {job_id}", exc) from exc
            return job_id
        return None

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus | None]:
        wanted = list(dict.fromkeys(job_ids))
        if not wanted:
            return {}
        session = self._session()
        entries = self._bulk_status(session, wanted)
        missing = [job_id for job_id in wanted if job_id not in entries]
        if missing:  # only a 404 may say "unknown": ASO would resubmit the files of such a job
            raise TransferError(f"FTS3 at {self.endpoint} did not answer for jobs {missing}")
        return {
            job_id: job_status(entries[job_id]) if entries.get(job_id) else None
            for job_id in job_ids
        }

    def cancel(self, job_id: str, file_ids: Sequence[str] | None = None) -> None:
        session = self._session()
        try:
            if file_ids is None:
                easy.cancel(session.context, job_id)
                return
            fts_ids = self._fts_file_ids(session, job_id, file_ids)
            if fts_ids:
                easy.cancel(session.context, job_id, fts_ids)
        except NotFound:
            # Nothing to cancel: the job ended long ago (purged) or never reached FTS.
            log.warning("cancel of job %s: FTS does not know it, nothing to cancel", job_id)
        except CLIENT_ERRORS as exc:
            raise self._unavailable(f"cancel job {job_id}", exc) from exc

    def close(self) -> None:
        with self._lock:
            self._sessions.clear()  # the client opens a connection per request: nothing else

    def monitor_link(self, job_id: str) -> str | None:
        return self.monitor_url.replace("{job_id}", job_id) if self.monitor_url else None

    # -- the job body -----------------------------------------------------------------------

    def _fts_job(self, job: JobRequest, sid: str) -> dict[str, Any]:
        transfers = [
            easy.new_transfer(
                f.source,
                f.destination,
                checksum=f"ADLER32:{f.adler32.lower().zfill(8)}",
                filesize=f.size,
                metadata={**f.metadata, "request_id": f.file_id},
            )
            for f in job.files
        ]
        # The identity FTS dashboards group by, over anything the caller added.
        metadata = {
            **job.metadata,
            "issuer": "ASO",
            "user": job.user,
            "task": job.task,
            "aso_key": job.key,
        }
        queue = job.max_time_in_queue or self.max_time_in_queue
        retry = job.retry or self.retry
        fts_job: dict[str, Any] = easy.new_job(
            transfers,
            # A bool would do, but FTS turns False into "target" when checksums are given.
            verify_checksum="both" if job.verify_checksum else "none",
            overwrite=job.overwrite,
            # FTS: 0 means "the server's default number of retries", negative means none.
            retry=retry if retry > 0 else -1,
            priority=job.priority,
            # FTS reads a bare integer as hours (JobBuilder_utils.seconds_from_value).
            max_time_in_queue=f"{int(queue)}s" if queue else None,
            metadata=metadata,
            id_generator=easy.JobIdGenerator.deterministic,
            sid=sid,
        )
        return fts_job

    @staticmethod
    def _post(session: _Session, fts_job: Mapping[str, Any]) -> str:
        # easy.submit without its delegation step (done just before, with errors of its own).
        submitter = Submitter(session.context)
        job_id: str = submitter.submit(
            transfers=fts_job["files"], delete=fts_job["delete"], params=fts_job["params"]
        )
        return job_id

    # -- status and cancel helpers ----------------------------------------------------------

    def _bulk_status(self, session: _Session, job_ids: list[str]) -> dict[str, Any]:
        """{job id: FTS's job entry with its files, or None when FTS does not know it}."""
        path = f"/jobs/{','.join(job_ids)}?files={STATUS_FILE_FIELDS}"
        try:
            answer = json.loads(session.context.get(path))
        except NotFound:  # only for a single id: several ids answer 207 instead
            return {job_ids[0]: None}
        except ClientError as exc:
            return self._multistatus(session, job_ids, exc)
        except CLIENT_ERRORS as exc:
            raise self._unavailable(f"get the status of {len(job_ids)} jobs", exc) from exc
        return self._entries(answer if isinstance(answer, list) else [answer])

    def _multistatus(
        self, session: _Session, job_ids: list[str], exc: ClientError
    ) -> dict[str, Any]:
        """FTS answers 207 when some of several jobs fail. The client raises ClientError with
        the body as its reason when some job succeeded, with the messages only when none did."""
        try:
            answer = json.loads(str(exc.reason))
        except ValueError:
            answer = None
        if isinstance(answer, list):
            return self._entries(answer)
        if len(job_ids) == 1:
            raise self._unavailable("get the status of a job", exc) from exc
        # No job succeeded (or another client error): ask for each job alone.
        found: dict[str, Any] = {}
        for job_id in job_ids:
            found.update(self._bulk_status(session, [job_id]))
        return found

    def _entries(self, entries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        return {entry["job_id"]: self._entry(entry) for entry in entries}

    def _entry(self, entry: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """A job's entry of a status answer; None when FTS says 404; an error otherwise."""
        http_status = str(entry.get("http_status") or "200")
        if http_status.startswith("2"):
            return entry
        if http_status.startswith("404"):
            return None
        message = f"{http_status} {entry.get('http_message') or ''}".strip()
        raise TransferError(f"FTS3 at {self.endpoint}: job {entry.get('job_id')}: {message}")

    @staticmethod
    def _fts_file_ids(session: _Session, job_id: str, file_ids: Iterable[str]) -> list[int]:
        """FTS's ids of the job's files that carry these ASO request ids."""
        files = json.loads(session.context.get(f"/jobs/{job_id}/files"))
        by_request = {
            f["file_metadata"].get("request_id"): f["file_id"]
            for f in files
            if isinstance(f.get("file_metadata"), dict)
        }
        wanted = list(file_ids)
        missing = [f for f in wanted if f not in by_request]
        if missing:
            log.warning("cancel: job %s has no file %s", job_id, ", ".join(missing))
        return [by_request[f] for f in wanted if f in by_request]

    # -- credentials ------------------------------------------------------------------------

    def _session(self, proxy: str | None = None) -> _Session:
        """The client Context of a proxy file, made again when the file changes (renewed)."""
        path = proxy or self.proxy
        try:
            info = os.stat(path)
        except OSError as exc:
            raise TransferError(f"X.509 proxy {path} cannot be read: {exc.strerror}") from exc
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        with self._lock:
            session = self._sessions.get(path)
            if session is not None and session.stamp == stamp:
                return session
        context = self._guard(f"connect with proxy {path}", lambda: self._context(path))
        session = _Session(context, stamp)
        with self._lock:
            self._sessions[path] = session
        return session

    def _context(self, path: str) -> easy.Context:
        # The client sends GET / here, and reads and checks the proxy (expiry, key).
        return easy.Context(
            self.endpoint,
            ucert=path,
            ukey=path,
            verify=self.verify,
            capath=self.capath,
            connectTimeout=self.timeout,
            timeout=self.timeout,
        )

    def _delegate(self, session: _Session) -> None:
        """Delegate the session's proxy unless FTS holds a delegation of it with
        RENEW_DELEGATION_BELOW left (the client asks FTS: /whoami, /delegation/<id>)."""
        lifetime = min(DELEGATION_LIFETIME, self._proxy_left(session))
        self._guard(
            "delegate the proxy",
            lambda: easy.delegate(
                session.context,
                lifetime=lifetime,
                delegate_when_lifetime_lt=RENEW_DELEGATION_BELOW,
            ),
        )

    @staticmethod
    def _proxy_left(session: _Session) -> dt.timedelta:
        not_after: dt.datetime = session.context.x509.get_not_after().get_datetime()
        return max(not_after - dt.datetime.now(dt.UTC), dt.timedelta(0))

    def _vo(self, session: _Session) -> str:
        """The VO FTS puts the session's jobs in: the first of /whoami's."""
        if session.vo is None:
            whoami = self._guard("ask who we are", lambda: easy.whoami(session.context))
            vos = whoami.get("vos") or []
            if not vos:
                raise TransferError(f"FTS3 at {self.endpoint} gives these credentials no VO")
            session.vo = str(vos[0])
        return session.vo

    def _known_vos(self, session: _Session) -> list[str]:
        with self._lock:
            others = [s.vo for s in self._sessions.values() if s.vo]
        return list(dict.fromkeys([self._vo(session), *others]))

    # -- errors -----------------------------------------------------------------------------

    def _guard(self, action: str, call: Callable[[], T]) -> T:
        """Run a client call whose every failure means "FTS cannot be used now"."""
        try:
            return call()
        except TransferError:
            raise
        # The client raises bare Exception for an expired proxy or an unreadable key, and
        # wraps everything of the delegation in ClientError: nothing narrower is possible.
        except Exception as exc:
            raise self._unavailable(action, exc) from exc

    def _unavailable(self, action: str, exc: BaseException) -> TransferError:
        cause = unwrap(exc)
        return TransferError(
            f"FTS3 at {self.endpoint}: cannot {action}: {describe(cause)}", errors.SERVICE
        )
