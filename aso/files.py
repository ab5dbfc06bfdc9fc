"""File operations at the sites, behind one small interface: size and checksum of a file,
deletion, free space and a probe write (a hold's check). `GfalFiles` does them with gfal2 on
real storage; `SimFiles` for the simulator's sites (`sim://` URLs), where no data exists (every
destination is "there", every deletion succeeds and is recorded: the simulator moves no data, so
its destinations confirm whatever a request says). `open_files(config)` gives `SiteFiles`, which
picks one by the URL's scheme, as the site catalogue spells the URL (aso/sites.py). `Confirmer`
looks at many destinations at once, a few at a time at each site.
"""

from __future__ import annotations

import errno
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from aso import gfal2client
from aso.config import Config
from aso.core.destination import Finding, found, unanswered, unchecked
from aso.transfer import errors

if TYPE_CHECKING:
    from aso.transfer.sim import SimService

log = logging.getLogger("aso.files")

MISSING = "no such file"  # what `mismatch` says of a missing file
LOOKS_PER_SITE = 8  # looks (stat + checksum) at once at one site, in each process that looks
PROBE_PREFIX = ".aso-probe-"  # name of the small file a hold's check writes and deletes
LATE_FINDING_TTL = 600.0  # seconds a look not waited for stays good for a later call


class FileError(Exception):
    """A storage operation failed; `error_class` as for transfers (aso.transfer.errors)."""

    def __init__(self, message: str, error_class: str, code: int | None = None):
        super().__init__(message)
        self.error_class = error_class
        self.code = code


@dataclass(frozen=True)
class FileInfo:
    size: int
    adler32: str | None


class Files(Protocol):
    def confirm(self, url: str, size: int, adler32: str) -> str | None:
        """None if the file is there with this size and adler32; else what is wrong."""

    def delete(self, url: str) -> bool:
        """Delete a file: True if deleted, False if it was not there."""

    def free_space(self, url: str) -> int | None:
        """Bytes free where `url` is or would be written; None: the storage does not say."""

    def probe(self, directory: str) -> str | None:
        """Write a small file under `directory` (a URL) and delete it again, as a copy there
        would: None if it could, else what the storage said."""

    def reachable(self, url: str) -> str | None:
        """Ask the storage about `url`: None if it answered (whatever it said), else why not."""


def mismatch(info: FileInfo | None, size: int, adler32: str) -> str | None:
    if info is None:
        return MISSING
    if info.size != size:
        return f"size {info.size}, expected {size}"
    expected = adler32.lower().rjust(8, "0")
    if info.adler32 != expected:
        return f"adler32 {info.adler32}, expected {expected}"
    return None


class GfalFiles:
    def __init__(self, config: Config):
        self.config = config
        self.gfal2 = gfal2client.import_gfal2(config)
        self.local = threading.local()

    def _ctx(self) -> Any:
        ctx = getattr(self.local, "ctx", None)
        if ctx is None:
            ctx = self.local.ctx = gfal2client.new_context(self.config)
        return ctx

    def _error(self, action: str, url: str, exc: Any) -> FileError:
        return FileError(
            f"{action} {url}: [{exc.code}] {exc.message}",
            errors.classify(exc.code, exc.message),
            exc.code,
        )

    def info(self, url: str) -> FileInfo | None:
        ctx = self._ctx()
        try:
            size = ctx.stat(url).st_size
        except self.gfal2.GError as exc:
            if exc.code == errno.ENOENT:
                return None
            raise self._error("stat of", url, exc) from None
        try:
            checksum = str(ctx.checksum(url, "ADLER32")).lower().rjust(8, "0")
        except self.gfal2.GError as exc:
            raise self._error("checksum of", url, exc) from None
        return FileInfo(size, checksum)

    def confirm(self, url: str, size: int, adler32: str) -> str | None:
        return mismatch(self.info(url), size, adler32)

    def delete(self, url: str) -> bool:
        try:
            self._ctx().unlink(url)
            return True
        except self.gfal2.GError as exc:
            if exc.code == errno.ENOENT:
                return False
            raise self._error("deletion of", url, exc) from None

    def free_space(self, url: str) -> int | None:
        return gfal2client.free_space(self._ctx(), self.config, url)

    def reachable(self, url: str) -> str | None:
        try:
            self._ctx().stat(url)
        except self.gfal2.GError as exc:
            if errors.classify(exc.code, exc.message) in (errors.CONNECTION, errors.TIMEOUT):
                return f"[{exc.code}] {exc.message}"
        return None

    def probe(self, directory: str) -> str | None:
        # An upload from this host: a streamed copy, which ASO's contexts otherwise refuse
        # (round 30: every probe failed "TRANSFER STREAMED DISABLED"; no hold was released).
        ctx = self.local.probe_ctx = getattr(self.local, "probe_ctx", None) or (
            gfal2client.new_context(self.config, allow_streaming=True)
        )
        target = f"{directory.rstrip('/')}/{PROBE_PREFIX}{uuid.uuid4().hex}"
        with tempfile.NamedTemporaryFile(prefix="aso-probe-") as local:
            local.write(b"aso probe\n")
            local.flush()
            params = gfal2client.transfer_parameters(ctx, overwrite=True)
            params.set_checksum(self.gfal2.checksum_mode.none, "", "")
            try:
                ctx.filecopy(params, f"file://{local.name}", target)
            except self.gfal2.GError as exc:
                return f"[{exc.code}] {exc.message}"
        try:
            ctx.unlink(target)
        except self.gfal2.GError as exc:
            log.warning("probe file %s written but not deleted: %s", target, exc.message)
        return None


@dataclass
class SimFiles:
    """No data: destinations are as the requests say, deletions are recorded. A look at a
    site (a hold's probe, whether it answers) finds what the simulator's faults say there
    (`faults`: site, user, now → the fault's reason; aso.transfer.sim.SimService.fault_at);
    its free space is what a size limit there leaves now (`space`: site → bytes or None;
    SimService.free_space), else the site does not say."""

    deleted: list[str] = field(default_factory=list)
    faults: Callable[[str, str, float], str | None] | None = None
    space: Callable[[str], int | None] | None = None

    def confirm(self, url: str, size: int, adler32: str) -> str | None:
        return None

    def delete(self, url: str) -> bool:
        self.deleted.append(url)
        return True

    def free_space(self, url: str) -> int | None:
        if self.space is None:
            return None
        return self.space(urlsplit(url).netloc)

    def probe(self, directory: str) -> str | None:
        return self._fault(directory, _user_of(directory))

    def reachable(self, url: str) -> str | None:
        return self._fault(url, "")

    def _fault(self, url: str, user: str) -> str | None:
        if self.faults is None:
            return None
        return self.faults(urlsplit(url).netloc, user, time.time())


def _user_of(url: str) -> str:
    """The user whose area a simulated URL is in (/store/user/NAME/...), or ""."""
    parts = urlsplit(url).path.split("/")
    return parts[3] if len(parts) > 3 and parts[1:3] == ["store", "user"] else ""


def simulated(url: str) -> bool:
    """A simulated site's file: no storage behind it, nothing to wait for."""
    return url.startswith("sim://")


class SiteFiles:
    """The file operations of any site: `sim://` URLs to SimFiles, the others to gfal2."""

    def __init__(self, config: Config):
        service = _simulated_service(config)
        self.sim = SimFiles(
            faults=None if service is None else lambda *a: service().fault_at(*a),
            space=None if service is None else lambda site: service().free_space(site),
        )
        self.gfal = GfalFiles(config)

    def _for(self, url: str) -> Files:
        return self.sim if simulated(url) else self.gfal

    def confirm(self, url: str, size: int, adler32: str) -> str | None:
        return self._for(url).confirm(url, size, adler32)

    def delete(self, url: str) -> bool:
        return self._for(url).delete(url)

    def free_space(self, url: str) -> int | None:
        return self._for(url).free_space(url)

    def probe(self, directory: str) -> str | None:
        return self._for(directory).probe(directory)

    def reachable(self, url: str) -> str | None:
        return self._for(url).reachable(url)


def _simulated_service(config: Config) -> Callable[[], SimService] | None:
    """The simulator's service (its faults, sim.outages, and the ledgers of its size limits,
    kept where it keeps its epoch), opened at the first look: most users of Files never look;
    None without the sim back end."""
    if config.transfer.backend != "sim":
        return None
    from aso.store import Server
    from aso.transfer.sim import SimService

    opened: list[SimService] = []

    def service() -> SimService:
        if not opened:
            jobs = Server.from_config(config, account="agent").db(config.store.transfers_db)
            opened.append(SimService(jobs, config.sim))
        return opened[0]

    return service


def open_files(config: Config) -> Files:
    return SiteFiles(config)


@dataclass(frozen=True)
class Look:
    """A destination to confirm: `key` (the request's id) names it in the answer."""

    key: str
    site: str
    url: str
    size: int
    adler32: str


# What a look answered (Files.confirm: None, or what differs) and when (time.monotonic()).
Answer = tuple[str | None, float]


def fresh(future: Future[Answer]) -> bool:
    """A look that ended within LATE_FINDING_TTL (or failed: its error is no confirmation)."""
    if future.exception() is not None:
        return True
    return time.monotonic() - future.result()[1] <= LATE_FINDING_TTL


class Confirmer:
    """Looks at many destinations at once (`Files.confirm`: there, with this size and adler32),
    `per_site` at a time at each site: one lasting thread pool per site, whose threads keep their
    gfal2 contexts. A look at a simulated site needs no thread."""

    def __init__(self, files: Files, per_site: int = LOOKS_PER_SITE):
        self.files = files
        self.per_site = per_site
        self.pools: dict[str, ThreadPoolExecutor] = {}
        # Looks not waited for, by key: the next call that asks for the key takes the finding
        # (while it is fresh: LATE_FINDING_TTL).
        self.late: dict[str, tuple[Look, Future[Answer]]] = {}

    def look_all(self, looks: Sequence[Look], within: float) -> dict[str, Finding]:
        """The finding of each look, by key. A look that has not ended within `within` seconds
        goes on, its finding `unanswered` this time; a later call for the same key gets what it
        found once it has ended (a checksum of a large file reads the whole file), without a
        second look. A site with such a look still under way gets no new ones meanwhile (a
        slow storage is not given a queue)."""
        asked = {look.key: look for look in looks}
        # Ended looks nobody asks for again (their request moved on, or changed), or that
        # ended too long ago, are dropped.
        self.late = {
            key: (look, future)
            for key, (look, future) in self.late.items()
            if not future.done() or (asked.get(key) == look and fresh(future))
        }
        busy = {look.site for look, future in self.late.values() if not future.done()}
        findings: dict[str, Finding] = {}
        futures: dict[str, tuple[Look, Future[Answer]]] = {}
        for look in looks:
            earlier = self.late.get(look.key)
            if earlier is not None and earlier[0] == look:
                future = earlier[1]
                if future.done():
                    del self.late[look.key]
                    findings[look.key] = self._finding(look, future)
                else:
                    findings[look.key] = unanswered(f"{look.site} has not answered yet")
            elif simulated(look.url):
                findings[look.key] = self._finding(look, self._inline(look))
            elif look.site in busy:
                findings[look.key] = unanswered(f"{look.site} has not answered earlier looks yet")
            else:
                futures[look.key] = (look, self._pool(look.site).submit(self._confirm, look))
        wait([future for _, future in futures.values()], timeout=within)
        for key, (look, future) in futures.items():
            if future.done():
                findings[key] = self._finding(look, future)
            else:
                self.late[key] = (look, future)
                findings[key] = unanswered(f"{look.site} did not answer within {within:g} s")
        return findings

    def _pool(self, site: str) -> ThreadPoolExecutor:
        pool = self.pools.get(site)
        if pool is None:
            pool = self.pools[site] = ThreadPoolExecutor(
                max_workers=self.per_site, thread_name_prefix=f"look-{site}"
            )
        return pool

    def _confirm(self, look: Look) -> Answer:
        return self.files.confirm(look.url, look.size, look.adler32), time.monotonic()

    def _inline(self, look: Look) -> Future[Answer]:
        future: Future[Answer] = Future()
        try:
            future.set_result(self._confirm(look))
        except Exception as exc:
            future.set_exception(exc)
        return future

    @staticmethod
    def _finding(look: Look, future: Future[Answer]) -> Finding:
        try:
            return found(future.result()[0])
        except FileError as exc:
            return unchecked(str(exc))
        except Exception as exc:  # an error of ours: never a confirmation
            log.warning("look at %s failed: %r", look.url, exc, exc_info=exc)
            return unchecked(f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        for pool in self.pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
