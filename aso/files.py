"""File operations at the sites, behind one small interface: size and checksum of a file, and
deletion. `GfalFiles` does them with gfal2 on real storage; `SimFiles` for the simulator's sites
(`sim://` URLs), where no data exists (every destination is "there", every deletion succeeds and
is recorded). `open_files(config)` gives `SiteFiles`, which picks one by the URL's scheme, as the
site catalogue spells the URL (aso/sites.py).
"""

from __future__ import annotations

import errno
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from aso import gfalctx
from aso.config import Config
from aso.transfer import errors


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


def mismatch(info: FileInfo | None, size: int, adler32: str) -> str | None:
    if info is None:
        return "no such file"
    if info.size != size:
        return f"size {info.size}, expected {size}"
    expected = adler32.lower().rjust(8, "0")
    if info.adler32 != expected:
        return f"adler32 {info.adler32}, expected {expected}"
    return None


class GfalFiles:
    def __init__(self, config: Config):
        self.config = config
        self.gfal2 = gfalctx.import_gfal2(config)
        self.local = threading.local()

    def _ctx(self) -> Any:
        ctx = getattr(self.local, "ctx", None)
        if ctx is None:
            ctx = self.local.ctx = gfalctx.new_context(self.config)
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


@dataclass
class SimFiles:
    """No data: destinations are as the requests say, deletions are recorded."""

    deleted: list[str] = field(default_factory=list)

    def confirm(self, url: str, size: int, adler32: str) -> str | None:
        return None

    def delete(self, url: str) -> bool:
        self.deleted.append(url)
        return True


class SiteFiles:
    """The file operations of any site: `sim://` URLs to SimFiles, the others to gfal2."""

    def __init__(self, config: Config):
        self.sim = SimFiles()
        self.gfal = GfalFiles(config)

    def _for(self, url: str) -> Files:
        return self.sim if url.startswith("sim://") else self.gfal

    def confirm(self, url: str, size: int, adler32: str) -> str | None:
        return self._for(url).confirm(url, size, adler32)

    def delete(self, url: str) -> bool:
        return self._for(url).delete(url)


def open_files(config: Config) -> Files:
    return SiteFiles(config)
