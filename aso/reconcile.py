"""The reconciler: compares ASO's three truths (the request documents, the storage and the
catalog) and reports, and on request repairs, where they disagree: requests stuck in a state,
temporary files no request names or that the cleaner left, destinations missing or not the
requested file, catalog entries missing or extra, and a cluster's conflicting revisions
(docs/design.md, "Reconciler", says what each is and how it is repaired).

Each check is a plain function over data (`find_*`); `reconcile` gathers the data and runs the
checks; `apply_repairs` makes the repairs the findings propose, through the model's transitions
with the least role that may make them, after checking again that the document and the storage
still show what was found.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import posixpath
import stat
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aso import gfal2client, model, sites
from aso.catalog.base import Catalog, CatalogError
from aso.config import Config
from aso.core import request as core
from aso.files import FileError, Files
from aso.model import ADMIN, AGENT, CLEANUP, FINAL, PUBLICATION, STATE
from aso.store import Database, StoreError

log = logging.getLogger("aso.reconcile")

STUCK = "stuck"
ORPHAN_TEMP = "orphan_temp"
LEFTOVER_TEMP = "leftover_temp"
DESTINATION_MISSING = "destination_missing"
DESTINATION_MISMATCH = "destination_mismatch"
CATALOG_MISSING = "catalog_missing"
CATALOG_EXTRA = "catalog_extra"
CONFLICT = "conflict"
KINDS = (
    CONFLICT,
    STUCK,
    ORPHAN_TEMP,
    LEFTOVER_TEMP,
    DESTINATION_MISSING,
    DESTINATION_MISMATCH,
    CATALOG_MISSING,
    CATALOG_EXTRA,
)
STORAGE_KINDS = (ORPHAN_TEMP, LEFTOVER_TEMP, DESTINATION_MISSING, DESTINATION_MISMATCH)
CATALOG_KINDS = (CATALOG_MISSING, CATALOG_EXTRA)

# Repair actions.
TRANSITION = "transition"  # a document change (transitions and/or fields)
JOB_LOST = "job_lost"  # cancel at the transfer service, then a transition
DELETE_TEMP = "delete_temp"  # delete a file inside a site's temp area
RECOPY = "recopy"  # (delete a damaged destination copy,) then done → new
KEEP_WINNER = "keep_winner"  # withdraw every conflicting branch but the winner

PAGE = 1000  # documents per `_all_docs` page
WORKERS = 8  # storage operations at once (listings, stats, checksums)
NO_SUCH_FILE = "no such file"  # aso.files.mismatch's word for a missing file

# Who acts on a request stuck in a value: (agent to look at, what it should have done).
RESPONSIBLE = {
    (STATE, "new"): "the submitter (is one running? are the link or site limits full?)",
    (STATE, "failed_attempt"): "the retry manager (is one running?)",
    (STATE, "retry"): "the submitter, once the cool-off is over (is one running? are the link or "
    "site limits full?)",
    (CLEANUP, "pending"): "the cleaner, or the publisher while the file waits for its block "
    "(is one running?)",
    (CLEANUP, "cleanup_error"): "the cleaner, which keeps failing",
    (PUBLICATION, "pending"): "the publisher (is one running? is the block still open?)",
    (PUBLICATION, "publication_error"): "the publisher, which keeps failing",
}


# --- findings ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Repair:
    """What the reconciler would do about a finding (`--fix` does it)."""

    action: str  # TRANSITION, JOB_LOST, DELETE_TEMP or RECOPY
    text: str  # for people: what the repair does
    role: str | None = None  # AGENT or ADMIN: the least role the document change needs
    changes: tuple[tuple[str, str, str], ...] = ()  # (axis, from, to)
    # The change made to the document: an operation of aso.core.request (core.REPAIRS), called
    # with `args` besides the document, the reconciler's name, the time and the reason.
    operation: str | None = None
    args: Mapping[str, Any] = field(default_factory=dict)
    cancel_job: str | None = None  # JOB_LOST: the job to cancel at the transfer service
    delete_destination: bool = False  # RECOPY: the damaged destination copy goes first

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["changes"] = [list(c) for c in self.changes]
        out["args"] = dict(self.args)
        return out


@dataclass(frozen=True)
class Finding:
    """One disagreement between the documents, the storage and the catalog."""

    kind: str
    detail: str
    request_id: str | None = None
    path: str | None = None  # the LFN concerned
    block: str | None = None
    site: str | None = None
    repair: Repair | None = None  # None: reported only
    lost: bool = False  # a file is gone for good: a person must act (the job runs again)
    rev: str | None = None  # the document's revision when checked: a repair applies to it only
    user: str | None = None  # whose file (an orphan temporary file: from its path)
    size: int | None = None  # bytes of the file concerned, where known
    age: float | None = None  # seconds since the file was last modified, where known

    @property
    def subject(self) -> str:
        """What the finding is about, in one word: request id, else block, else path."""
        return self.request_id or self.block or self.path or ""

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "repair"}
        out["repair"] = self.repair.as_dict() if self.repair else None
        return out


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # what could not be checked, and why
    checked: dict[str, int] = field(default_factory=dict)  # what was looked at, by kind
    kinds: tuple[str, ...] = KINDS
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.findings and not self.errors

    def by_kind(self) -> dict[str, list[Finding]]:
        """{kind: its findings}, kinds in the order of KINDS, findings by subject."""
        out: dict[str, list[Finding]] = {}
        for finding in sorted(self.findings, key=lambda f: (KINDS.index(f.kind), f.subject)):
            out.setdefault(finding.kind, []).append(finding)
        return out

    def counts(self) -> dict[str, int]:
        return {kind: len(found) for kind, found in self.by_kind().items()}


# --- what the checks read ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Request:
    """The part of a request document the checks read (a whole store fits in memory)."""

    id: str
    rev: str
    user: str
    task: str
    state: str
    cleanup: str
    publication: str
    source: str
    destination: str
    source_lfn: str
    destination_lfn: str
    size: int
    adler32: str
    dataset: str
    publication_block: str | None
    entered: tuple[float, float, float]  # when each axis took its present value (AXES order)
    retry_after: float | None = None
    job_id: str | None = None
    last_error: str | None = None  # cleanup_error / publication_error, for the details
    conflicts: tuple[str, ...] = ()  # revisions of conflicting branches (a cluster's)
    last_update: float = 0.0

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Request:
        return cls(
            id=doc["_id"],
            rev=doc.get("_rev", ""),
            user=doc["user"],
            task=doc["task"],
            state=doc[STATE],
            cleanup=doc[CLEANUP],
            publication=doc[PUBLICATION],
            source=doc["source"],
            destination=doc["destination"],
            source_lfn=doc["source_lfn"],
            destination_lfn=doc["destination_lfn"],
            size=doc["size"],
            adler32=doc["checksum"]["adler32"],
            dataset=(doc.get("publish_info") or {}).get("dataset", "") if doc["publish"] else "",
            publication_block=doc.get("publication_block"),
            entered=entered_times(doc),
            retry_after=doc.get("retry_after"),
            job_id=(doc.get("transfer") or {}).get("job_id"),
            last_error=doc.get("cleanup_error") or doc.get("publication_error"),
            conflicts=tuple(doc.get("_conflicts") or ()),
            last_update=float(doc.get("last_update") or 0.0),
        )

    def since(self, axis: str) -> float:
        return self.entered[model.AXES.index(axis)]


def entered_times(doc: Mapping[str, Any]) -> tuple[float, float, float]:
    """When each axis took its present value, from the history: its last change on that axis;
    for cleanup and publication, which only move once the copy is done, not before the file
    became done."""
    created = doc.get("created", 0.0)
    last = dict.fromkeys(model.AXES, created)
    done_at = 0.0
    for entry in doc.get("history", []):
        last[entry["axis"]] = entry["at"]
        if entry["axis"] == STATE and entry["to"] == "done":
            done_at = entry["at"]
    return (
        last[STATE],
        max(last[CLEANUP], done_at),
        max(last[PUBLICATION], done_at),
    )


@dataclass(frozen=True)
class TempFile:
    site: str
    lfn: str
    size: int
    mtime: float


@dataclass(frozen=True)
class FileCheck:
    """A destination as found: `problem` None if it is there with the request's size and
    adler32; for a bad one, `temp_problem` says whether the temporary copy can replace it
    (None: it is at the source, whole)."""

    problem: str | None
    temp_problem: str | None = None

    @property
    def missing(self) -> bool:
        return self.problem == NO_SUCH_FILE


@dataclass
class CatalogState:
    """What the catalog holds for the datasets of the requests."""

    blocks: dict[str, list[str] | None] = field(default_factory=dict)  # block → LFNs (None: absent)
    lfn_block: dict[str, str] = field(default_factory=dict)  # LFN → the block holding it

    def holds(self, block: str | None, lfn: str) -> bool:
        return bool(block) and lfn in (self.blocks.get(block or "") or [])


# --- the checks: plain functions over data ---------------------------------------------------
def age_text(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min"


def stuck_axes(request: Request) -> list[str]:
    """The axes of a request that still wait for an agent (cleanup and publication move once
    the copy is done; a failed or killed request's cleanup, its temporary copy discarded
    after `cleaner.failed_grace`)."""
    if request.state not in FINAL[STATE]:
        return [STATE]
    if request.state != "done":
        return [CLEANUP] if request.cleanup not in FINAL[CLEANUP] else []
    return [axis for axis in (CLEANUP, PUBLICATION) if getattr(request, axis) not in FINAL[axis]]


def find_stuck(
    requests: Iterable[Request], now: float, stuck_after: float, failed_grace: float = 0.0
) -> list[Finding]:
    """Requests whose last transition on a non-final axis is older than `stuck_after` (the
    cleanup of a file never copied: than its grace and `stuck_after`, from its failure)."""
    findings = []
    for request in requests:
        for axis in stuck_axes(request):
            if request.state in model.NEVER_COPIED:
                since = max(request.since(STATE) + failed_grace, request.since(CLEANUP))
            else:
                since = request.since(axis)
            age = now - since
            if age >= stuck_after:
                findings.append(_stuck(request, axis, age, now))
    return findings


def _stuck(request: Request, axis: str, age: float, now: float) -> Finding:
    value = getattr(request, axis)
    detail = f"{axis} {value} for {age_text(age)}"
    repair = None
    if axis == STATE and value in model.AT_THE_SERVICE:
        to = "failed_attempt" if value == "submitted" else "killed"
        job = request.job_id
        detail += f" (job {job})" if job else " (no job recorded)"
        repair = Repair(
            JOB_LOST,
            (f"cancel job {job} at the transfer service, then " if job else "")
            + f"state {value} → {to} (error class job_lost)",
            AGENT,
            ((STATE, value, to),),
            "job_lost",
            cancel_job=job,
        )
    else:
        if axis == STATE and value == "retry" and (request.retry_after or 0) <= now:
            detail += f", its cool-off ended {age_text(now - (request.retry_after or 0))} ago"
        if request.last_error and value in model.AFTER_AN_ERROR:
            detail += f"; last error: {request.last_error[:300]}"
        who = RESPONSIBLE.get((axis, value))
        if axis == CLEANUP and request.state in model.NEVER_COPIED:
            who = f"the cleaner, which discards the copies of {request.state} files (running?)"
        if who:
            detail += f"; up to {who}"
    return Finding(
        STUCK,
        detail,
        request_id=request.id,
        path=request.source_lfn,
        site=request.source,
        repair=repair,
        rev=request.rev,
    )


def by_temp_copy(requests: Iterable[Request]) -> dict[tuple[str, str], Request]:
    """{(source site, source LFN): request}: the temporary copies the documents name."""
    return {(r.source, r.source_lfn): r for r in requests}


def find_orphan_temp(
    temp_files: Iterable[TempFile],
    named: Mapping[tuple[str, str], Request],
    now: float,
    grace: float,
    config: Config | None = None,
) -> list[Finding]:
    """Temp files that no request names at their site, older than `grace` (a job writes its
    output before it records the request). With `config`, a repair only for paths that
    `sites.temp_pfn` accepts."""
    findings = []
    for f in temp_files:
        if (f.site, f.lfn) in named or now - f.mtime < grace:
            continue
        deletable = config is None or sites.in_temp_area(config, f.site, f.lfn)
        findings.append(
            Finding(
                ORPHAN_TEMP,
                f"no request names this temporary file ({f.size} bytes, "
                f"last modified {age_text(now - f.mtime)} ago)"
                + ("" if deletable else "; not a valid LFN of the temp area: delete it by hand"),
                path=f.lfn,
                site=f.site,
                repair=Repair(DELETE_TEMP, "delete the temporary file") if deletable else None,
                user=temp_owner(f.lfn),
                size=f.size,
                age=round(now - f.mtime, 3),
            )
        )
    return findings


def temp_owner(lfn: str) -> str:
    """The user whose temporary area holds `lfn` (/store/temp/user/<name>.<hash>/...; the
    hash has no dot), or "?" outside the users' temporary areas."""
    if not lfn.startswith(model.TEMP_USER_AREA):
        return "?"
    area = lfn[len(model.TEMP_USER_AREA) :].split("/", 1)[0]
    return area.rsplit(".", 1)[0] if "." in area else area


@dataclass(frozen=True)
class UserOrphans:
    """One user's orphan temporary files: how many, their bytes, the oldest's age."""

    user: str
    files: int
    bytes: int
    oldest: float


def orphans_by_user(findings: Iterable[Finding]) -> list[UserOrphans]:
    """The orphan temporary files of the findings per user, most bytes first."""
    files: dict[str, list[Finding]] = {}
    for f in findings:
        if f.kind == ORPHAN_TEMP:
            files.setdefault(f.user or "?", []).append(f)
    summary = [
        UserOrphans(
            user,
            len(found),
            sum(f.size or 0 for f in found),
            max((f.age or 0.0) for f in found),
        )
        for user, found in files.items()
    ]
    return sorted(summary, key=lambda u: (-u.bytes, u.user))


def leftover_candidates(
    temp_files: Iterable[TempFile], named: Mapping[tuple[str, str], Request]
) -> list[tuple[TempFile, Request]]:
    """Temp files whose request is done and says its temporary copy is gone (or never was)."""
    out = []
    for f in temp_files:
        request = named.get((f.site, f.lfn))
        if request and request.state == "done" and request.cleanup in FINAL[CLEANUP]:
            out.append((f, request))
    return out


def find_leftover_temp(
    candidates: Iterable[tuple[TempFile, Request]], destinations: Mapping[str, FileCheck]
) -> list[Finding]:
    """Temp files left behind by a done and cleaned request whose destination copy is confirmed
    (a temp file whose destination is bad is the copy to recover from, never garbage)."""
    findings = []
    for f, request in candidates:
        check = destinations.get(request.id)
        if check is None or check.problem is not None:
            continue
        findings.append(
            Finding(
                LEFTOVER_TEMP,
                f"temporary copy still there ({f.size} bytes) although the request is done and "
                f"cleanup {request.cleanup}; the destination copy is confirmed",
                request_id=request.id,
                path=f.lfn,
                site=f.site,
                repair=Repair(DELETE_TEMP, "delete the temporary copy"),
                rev=request.rev,
            )
        )
    return findings


def find_bad_destinations(
    requests: Iterable[Request], destinations: Mapping[str, FileCheck]
) -> list[Finding]:
    """Done requests whose destination file is missing or has another size or adler32."""
    findings = []
    for request in requests:
        check = destinations.get(request.id)
        if request.state != "done" or check is None or check.problem is None:
            continue
        kind = DESTINATION_MISSING if check.missing else DESTINATION_MISMATCH
        detail = f"destination copy at {request.destination}: {check.problem}"
        base: dict[str, Any] = dict(
            request_id=request.id,
            path=request.destination_lfn,
            site=request.destination,
            rev=request.rev,
        )
        if check.temp_problem is not None:
            findings.append(
                Finding(
                    kind,
                    f"{detail}; temporary copy at {request.source}: {check.temp_problem}: "
                    "the file is LOST (the job must run again)",
                    lost=True,
                    **base,
                )
            )
            continue
        changes = [(STATE, "done", "new")]
        if request.cleanup != "pending":
            changes.append((CLEANUP, request.cleanup, "pending"))
        moves = ", ".join(f"{axis} {a} → {b}" for axis, a, b in changes)
        text = f"copy again from the temporary copy: {moves}"
        if not check.missing:
            text = "delete the damaged destination copy, then " + text
        findings.append(
            Finding(
                kind,
                f"{detail}; the temporary copy at {request.source} is whole",
                repair=Repair(
                    RECOPY,
                    text,
                    ADMIN,
                    tuple(changes),
                    "recopy",
                    delete_destination=not check.missing,
                ),
                **base,
            )
        )
    return findings


def find_catalog_missing(requests: Iterable[Request], catalog: CatalogState) -> list[Finding]:
    """Published requests whose recorded block is not in the catalog or does not hold them."""
    findings = []
    for request in requests:
        if request.publication != "published":
            continue
        block, lfn = request.publication_block, request.destination_lfn
        if catalog.holds(block, lfn):
            continue
        if not block:
            detail = "published, but no block is recorded"
        elif catalog.blocks.get(block) is None:
            detail = f"block {block} is not in the catalog"
        else:
            detail = f"block {block} does not hold {lfn}"
        elsewhere = catalog.lfn_block.get(lfn)
        if elsewhere:
            repair = Repair(
                TRANSITION,
                f"record block {elsewhere}, which holds the file",
                AGENT,
                operation="block_corrected",
                args={"block": elsewhere},
            )
            detail += f"; block {elsewhere} holds it"
        else:
            repair = Repair(
                TRANSITION,
                "publication published → pending (the publisher publishes it again)",
                ADMIN,
                ((PUBLICATION, "published", "pending"),),
                "republished",
            )
        findings.append(
            Finding(
                CATALOG_MISSING,
                detail,
                request_id=request.id,
                path=lfn,
                block=block,
                site=request.destination,
                repair=repair,
                rev=request.rev,
            )
        )
    return findings


def find_catalog_extra(
    by_destination: Mapping[str, Request], catalog: CatalogState
) -> list[Finding]:
    """Catalog files whose request is not published in that block (nor being published in it).
    A file without a request is not reported: finished requests are purged."""
    findings = []
    for lfn, block in sorted(catalog.lfn_block.items()):
        request = by_destination.get(lfn)
        if request is None:
            continue
        if request.publication_block == block and request.publication in model.IN_A_BLOCK:
            continue
        if request.publication == "published":
            continue  # recorded in another block: find_catalog_missing reports it
        findings.append(
            Finding(
                CATALOG_EXTRA,
                f"block {block} holds the file, but its request is state {request.state}, "
                f"publication {request.publication}; catalog entries are not rewritten: an "
                "operator decides (mark the request published, or invalidate the file)",
                request_id=request.id,
                path=lfn,
                block=block,
                site=request.destination,
                rev=request.rev,
            )
        )
    return findings


def find_conflicts(requests: Iterable[Request], now: float, grace: float) -> list[Finding]:
    """Requests with conflicting branches that nothing moved for `grace` seconds."""
    findings = []
    for request in requests:
        if not request.conflicts or now - request.last_update < grace:
            continue
        findings.append(
            Finding(
                CONFLICT,
                f"{len(request.conflicts)} conflicting revision(s) beside {request.rev} (state "
                f"{request.state}): two writers of a cluster both edited one revision",
                request_id=request.id,
                rev=request.rev,
                repair=Repair(
                    KEEP_WINNER,
                    f"keep {request.rev}, withdraw {', '.join(request.conflicts)}",
                    role=AGENT,
                ),
            )
        )
    return findings


# --- reading the three truths --------------------------------------------------------------
def scan_requests(
    db: Database, page: int = PAGE, alive: Callable[[], None] = lambda: None
) -> Iterator[Request]:
    """Every transfer request, read with `_all_docs` in pages (cut by key: the last id of a
    page starts the next one and is dropped)."""
    start: str | None = None
    while True:
        # CLUSTER_CONFLICTING_BRANCHES: with each request's conflicting revisions
        docs = db.all_docs(start, limit=page if start is None else page + 1, conflicts=True)
        alive()
        if start is not None and docs and docs[0]["_id"] == start:
            docs = docs[1:]
        for doc in docs:
            if doc.get("type") == model.REQUEST_TYPE:
                yield Request.from_doc(doc)
        if len(docs) < page:
            return
        start = docs[-1]["_id"]


def temp_area_lfn(config: Config, site: str) -> str:
    return posixpath.normpath("/" + sites.site_of(config, site).temp_area.strip("/"))


def list_temp_area(config: Config, site: str, ctx: Any = None) -> list[TempFile]:
    """Every file under the site's temp area, recursively, with gfal2 (a directory listing with
    the entries' stat, one request per directory). A temp area that does not exist is empty."""
    gfal2 = gfal2client.import_gfal2(config)
    ctx = ctx or gfal2client.new_context(config)
    files: list[TempFile] = []
    todo = deque([temp_area_lfn(config, site)])
    while todo:
        directory = todo.popleft()
        url = sites.pfn(config, site, directory)
        try:
            handle = ctx.opendir(url)
            while True:
                entry = handle.readpp()
                if entry is None or entry[0] is None:
                    break
                dirent, info = entry
                if dirent.d_name in (".", ".."):
                    continue
                lfn = f"{directory}/{dirent.d_name}"
                if stat.S_ISDIR(info.st_mode):
                    todo.append(lfn)
                else:
                    files.append(TempFile(site, lfn, info.st_size, float(info.st_mtime)))
        except gfal2.GError as exc:
            if exc.code == errno.ENOENT and directory == temp_area_lfn(config, site):
                return []  # no temp area yet
            if exc.code == errno.ENOENT:
                continue  # removed while we listed
            raise FileError(
                f"listing {url}: [{exc.code}] {exc.message}", "unknown", exc.code
            ) from None
    return files


def read_catalog(catalog: Catalog, requests: Sequence[Request]) -> CatalogState:
    """The blocks of every dataset the requests publish to, and the blocks they record that
    the dataset listing lacks."""
    state = CatalogState()
    for dataset in sorted({r.dataset for r in requests if r.dataset}):
        for block, lfns in catalog.dataset_files(dataset).items():
            state.blocks[block] = list(lfns)
            for lfn in lfns:
                state.lfn_block[lfn] = block
    for request in requests:
        recorded = request.publication_block
        if recorded and request.publication in model.IN_A_BLOCK and (recorded not in state.blocks):
            state.blocks[recorded] = catalog.block_files(recorded)
    return state


def check_destinations(
    config: Config,
    files: Files,
    requests: Sequence[Request],
    workers: int = WORKERS,
    alive: Callable[[], None] = lambda: None,
) -> tuple[dict[str, FileCheck], list[str]]:
    """({request id: FileCheck}, errors): each destination stat-ed and checksummed, and for a
    bad one, the temporary copy too; `alive` called as each one is answered."""

    def one(request: Request) -> FileCheck:
        dest = sites.pfn(config, request.destination, request.destination_lfn)
        problem = files.confirm(dest, request.size, request.adler32)
        if problem is None:
            return FileCheck(None)
        if not sites.in_temp_area(config, request.source, request.source_lfn):
            return FileCheck(problem, f"{request.source_lfn} is not in the temp area")
        temp = sites.temp_pfn(config, request.source, request.source_lfn)
        return FileCheck(problem, files.confirm(temp, request.size, request.adler32))

    checks: dict[str, FileCheck] = {}
    errors: list[str] = []
    if not requests:
        return checks, errors
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile") as pool:
        futures = {r.id: (r, pool.submit(one, r)) for r in requests}
        for request_id, (request, future) in futures.items():
            try:
                checks[request_id] = future.result()
            except (FileError, sites.SiteError) as exc:
                errors.append(f"request {request_id} at {request.destination}: {exc}")
            alive()
    return checks, errors


def storage_sites(config: Config) -> list[str]:
    """The sites whose temp areas can be listed: all but the simulated ones (no storage)."""
    return sites.with_storage(config)


def _list_sites(
    config: Config, site_names: Sequence[str], alive: Callable[[], None]
) -> tuple[list[TempFile], list[str]]:
    files: list[TempFile] = []
    errors: list[str] = []
    if not site_names:
        return files, errors
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(site_names))) as pool:
        futures = {site: pool.submit(list_temp_area, config, site) for site in site_names}
        for site, future in futures.items():
            try:
                files.extend(future.result())
            except (FileError, sites.SiteError) as exc:
                errors.append(f"temp area of {site} not listed: {exc}")
            alive()
    return files, errors


def reconcile(
    config: Config,
    db: Database,
    *,
    catalog: Catalog | None = None,
    files: Files | None = None,
    kinds: Iterable[str] | None = None,
    now: float | None = None,
    alive: Callable[[], None] = lambda: None,
) -> Report:
    """Read the documents, then the storage and the catalog, and run the checks of `kinds`.

    Documents are read first: a file that appears at a site after the read is younger than the
    orphan grace, and a request that moves on after it is judged on what was read (a repair
    applies only to the revision that was read). Storage checks need `files` and a transfer
    back end with real storage (not `sim`); catalog checks need `catalog`. `alive` is called as
    the pass makes progress (a page of documents read, a site listed, a file checked): a pass
    over 100,000 files outlasts any fixed time an agent's turn is given."""
    started = time.monotonic()
    wanted = tuple(k for k in KINDS if kinds is None or k in set(kinds))
    report = Report(kinds=wanted)
    requests = list(scan_requests(db, alive=alive))
    now = time.time() if now is None else now
    settings = config.reconciler
    report.checked["requests"] = len(requests)

    state = _catalog_state(catalog, requests, wanted, report)
    if CONFLICT in wanted:
        report.findings += find_conflicts(requests, now, 2 * config.transfer.lease)
    if STUCK in wanted:
        report.findings += find_stuck(
            requests, now, settings.stuck_after, config.cleaner.failed_grace
        )
    if files is not None and any(k in wanted for k in STORAGE_KINDS):
        _check_storage(config, files, requests, wanted, now, report, alive)
    elif any(k in wanted for k in STORAGE_KINDS):
        report.errors.append("no storage access given: storage checks skipped")
    if state is not None:
        if CATALOG_MISSING in wanted:
            report.findings += find_catalog_missing(requests, state)
        if CATALOG_EXTRA in wanted:
            by_destination = {r.destination_lfn: r for r in requests}
            report.findings += find_catalog_extra(by_destination, state)

    report.seconds = round(time.monotonic() - started, 3)
    return report


def _catalog_state(
    catalog: Catalog | None, requests: list[Request], wanted: tuple[str, ...], report: Report
) -> CatalogState | None:
    """The catalog's blocks, read when a check of `wanted` needs them; None otherwise or when
    it cannot be read (an error of the report)."""
    catalog_wanted = catalog is not None and any(k in wanted for k in CATALOG_KINDS)
    if not catalog_wanted:
        if any(k in wanted for k in CATALOG_KINDS):
            report.errors.append("no catalog given: catalog checks skipped")
        return None
    assert catalog is not None
    try:
        state = read_catalog(catalog, requests)
    except CatalogError as exc:
        report.errors.append(f"catalog not read: {exc}")
        return None
    report.checked["blocks"] = len(state.blocks)
    return state


def _check_storage(
    config: Config,
    files: Files,
    requests: list[Request],
    wanted: tuple[str, ...],
    now: float,
    report: Report,
    alive: Callable[[], None],
) -> None:
    """The storage's checks of `wanted`: temporary copies nobody names or left behind, and
    destinations missing or not the requested file."""
    named = by_temp_copy(requests)
    temp_files: list[TempFile] = []
    if ORPHAN_TEMP in wanted or LEFTOVER_TEMP in wanted:
        temp_files, errors = _list_sites(config, storage_sites(config), alive)
        report.errors += errors
        report.checked["temp_files"] = len(temp_files)
    candidates = leftover_candidates(temp_files, named) if LEFTOVER_TEMP in wanted else []
    to_check = {r.id: r for _, r in candidates}
    if DESTINATION_MISSING in wanted or DESTINATION_MISMATCH in wanted:
        to_check.update((r.id, r) for r in requests if r.state == "done")
    destinations, errors = check_destinations(config, files, list(to_check.values()), alive=alive)
    report.errors += errors
    report.checked["destinations"] = len(destinations)
    if ORPHAN_TEMP in wanted:
        settings = config.reconciler
        report.findings += find_orphan_temp(temp_files, named, now, settings.orphan_grace, config)
    if LEFTOVER_TEMP in wanted:
        report.findings += find_leftover_temp(candidates, destinations)
    bad = find_bad_destinations(requests, destinations)
    report.findings += [f for f in bad if f.kind in wanted]


# --- repairs -------------------------------------------------------------------------------
@dataclass(frozen=True)
class FixOutcome:
    finding: Finding
    repaired: bool
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {"finding": self.finding.as_dict(), "repaired": self.repaired, "text": self.text}


class Skip(Exception):
    """A repair not made; the message says why."""


@dataclass
class Fixer:
    """Makes the repairs of findings. Documents are written with `agent_db` (the agent
    account) for changes an agent may make, so that the store checks them against the agents'
    transitions, and with `admin_db` (an operator account) for the others; `admin_db` also
    makes the agents' changes when there is no agent account. `service` (a callable returning
    the transfer service) is opened only when a job must be cancelled."""

    config: Config
    files: Files | None
    agent_db: Database | None
    admin_db: Database | None
    service: Callable[[], Any] | None = None
    by: str = "reconciler"
    _service: Any = None

    @property
    def read_db(self) -> Database:
        db = self.agent_db or self.admin_db
        if db is None:
            raise ValueError("a Fixer needs an agent or an admin database")
        return db

    def apply(self, findings: Iterable[Finding]) -> list[FixOutcome]:
        outcomes = []
        for finding in findings:
            if finding.repair is None:
                continue
            try:
                text = self._apply(finding, finding.repair)
                outcomes.append(FixOutcome(finding, True, text))
                log.info("repaired %s %s: %s", finding.kind, finding.subject, text)
            except Skip as exc:
                outcomes.append(FixOutcome(finding, False, str(exc)))
                log.warning("not repaired: %s %s: %s", finding.kind, finding.subject, exc)
        return outcomes

    def close(self) -> None:
        if self._service is not None:
            self._service.close()

    # -- one repair ---------------------------------------------------------------------------
    def _apply(self, finding: Finding, repair: Repair) -> str:
        if repair.action == DELETE_TEMP:
            return self._delete_temp(finding)
        doc = self._current(finding)
        if repair.action == KEEP_WINNER:
            return self._keep_winner(doc)
        if repair.action == JOB_LOST:
            fenced = self._fence(repair.cancel_job, doc)
            return self._write(finding, repair, doc, fenced=fenced)
        if repair.action == RECOPY:
            self._prepare_recopy(finding, repair, doc)
        elif repair.action != TRANSITION:
            raise Skip(f"unknown repair {repair.action}")
        return self._write(finding, repair, doc)

    def _current(self, finding: Finding) -> dict[str, Any]:
        doc = self.read_db.get(finding.request_id or "")
        if doc is None:
            raise Skip("the request is gone")
        if finding.rev and doc.get("_rev") != finding.rev:
            raise Skip("the request changed since the check: left to the agents")
        return doc

    def _keep_winner(self, doc: Mapping[str, Any]) -> str:
        db = self.agent_db or self.admin_db
        assert db is not None
        try:
            leaves = db.leaves(doc["_id"])
            withdrawn = db.keep_leaf(doc["_id"], doc["_rev"], leaves)
        except StoreError as exc:
            raise Skip(f"branches not withdrawn: {exc}") from None
        return f"kept {doc['_rev']}, withdrew {withdrawn} conflicting revision(s)"

    def _storage(self) -> Files:
        if self.files is None:
            raise Skip("no storage access")
        return self.files

    def _delete_temp(self, finding: Finding) -> str:
        site, lfn = finding.site or "", finding.path or ""
        try:
            url = sites.temp_pfn(self.config, site, lfn)  # refuses all but the temp area
        except sites.SiteError as exc:
            raise Skip(str(exc)) from None
        files = self._storage()
        if finding.kind == ORPHAN_TEMP:
            doc = self.read_db.get(model.request_id(lfn))
            if doc is not None and doc.get("source") == site:
                raise Skip(f"request {doc['_id']} names it now")
        else:
            doc = self._current(finding)
            if doc[STATE] != "done" or doc[CLEANUP] not in FINAL[CLEANUP]:
                raise Skip("the request is no longer done and cleaned")
            dest = sites.pfn(self.config, doc["destination"], doc["destination_lfn"])
            wrong = self._confirm(files, dest, doc)
            if wrong:
                raise Skip(f"destination not confirmed ({wrong}): temporary copy kept")
        try:
            deleted = files.delete(url)
        except FileError as exc:
            raise Skip(str(exc)) from None
        return f"deleted {url}" if deleted else f"{url} was already gone"

    @staticmethod
    def _confirm(files: Files, url: str, doc: Mapping[str, Any]) -> str | None:
        try:
            return files.confirm(url, doc["size"], doc["checksum"]["adler32"])
        except FileError as exc:
            raise Skip(str(exc)) from None

    def _fence(self, job_id: str | None, doc: Mapping[str, Any]) -> str | None:
        """The fence of the file's job (TransferService.fence): its verdict, once the job is
        known absent or the file ended there (cancelled if it had not); Skip while not."""
        if not job_id:
            return None
        from aso.transfer.base import TransferError

        try:
            if self._service is None:
                if self.service is None:
                    raise Skip(f"job {job_id} must be cancelled first: no transfer service")
                self._service = self.service()
            fence = self._service.fence(job_id, [doc["_id"]])
        except TransferError as exc:
            raise Skip(f"job {job_id} not fenced ({exc}): the file is left as it is") from None
        if fence is None:
            raise Skip(f"job {job_id}: cancel asked, not confirmed yet: the file is left as it is")
        return str(fence.verdict)

    def _prepare_recopy(self, finding: Finding, repair: Repair, doc: Mapping[str, Any]) -> None:
        """The temporary copy must still be whole; a damaged destination copy goes first."""
        files = self._storage()
        temp = sites.temp_pfn(self.config, doc["source"], doc["source_lfn"])
        wrong = self._confirm(files, temp, doc)
        if wrong:
            raise Skip(f"the temporary copy is not whole any more ({wrong})")
        if not repair.delete_destination:
            return
        dest = sites.pfn(self.config, doc["destination"], doc["destination_lfn"])
        wrong = self._confirm(files, dest, doc)
        if wrong is None:
            raise Skip("the destination copy is whole now")
        if wrong != NO_SUCH_FILE:
            try:
                files.delete(dest)
            except FileError as exc:
                raise Skip(f"damaged destination copy not deleted: {exc}") from None
            log.warning(
                "request %s: deleted the damaged destination copy %s (%s)",
                doc["_id"],
                dest,
                wrong,
            )

    def _write(self, finding: Finding, repair: Repair, doc: dict[str, Any], **extra: Any) -> str:
        role = repair.role or AGENT
        db = self.agent_db if role == AGENT and self.agent_db is not None else self.admin_db
        if db is None:
            raise Skip("needs an operator account (role aso-admin)")
        reason = f"reconciler: {finding.kind}: {finding.detail}"[:4096]
        for axis, old, _ in repair.changes:
            if doc.get(axis) != old:
                raise Skip(f"{axis} is {doc.get(axis)} now, not {old}")
        if repair.operation not in core.REPAIRS:
            raise Skip(f"unknown operation {repair.operation}")
        try:
            args = {**repair.args, **extra}
            new = core.REPAIRS[repair.operation](doc, self.by, model.now(), reason, **args)
        except model.ModelError as exc:
            raise Skip(str(exc)) from None
        try:
            [result] = db.bulk_write([new])
        except StoreError as exc:
            raise Skip(f"not written: {exc}") from None
        if not result.ok:
            raise Skip(f"the store refused it ({result.error}: {result.reason})")
        return repair.text
