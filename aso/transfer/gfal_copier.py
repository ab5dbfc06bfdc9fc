"""One checksum-verified third-party copy with gfal2, as the gfal worker makes it.

The gfal2 context and the parameters ASO always wants (client environment, HTTP and XRootD
settings, CA directory, adler32 at both ends, no delegation) come from aso.gfal2client; here: the
job's overwrite and checksum choices, the timeout, cancellation, the error class of a failure,
and the check that the copy really was third-party.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aso import gfal2client
from aso.config import Config
from aso.transfer import errors
from aso.transfer.base import CANCELED, DONE, FAILED

log = logging.getLogger("aso.transfer.gfal")

CHECKSUM_TRIES = 3  # asks for a destination's checksum after a copy
CHECKSUM_RETRY_DELAY = 0.5  # seconds between two asks
# Failures after which the destination is not touched: the file there is not this copy's, or
# the storage does not answer (another call would wait out its timeout again).
UNTOUCHED_AFTER = (errors.DESTINATION_EXISTS, errors.TIMEOUT)


@dataclass(frozen=True)
class CopyResult:
    state: str  # DONE, FAILED or CANCELED
    reason: str | None = None
    error_class: str | None = None
    checksum: str | None = None


class Copier(Protocol):
    """What the worker needs from gfal2 (aso.transfer.gfal_copier.GfalCopier)."""

    def precheck(self, entry: Mapping[str, Any], params: Mapping[str, Any]) -> CopyResult | None:
        """A result without copying (the destination exists and may not be overwritten)."""

    def copy(
        self, entry: Mapping[str, Any], params: Mapping[str, Any], cancelled: Callable[[], bool]
    ) -> CopyResult:
        """Make the copy; `cancelled()` tells it to stop."""

    def resume(self, entry: Mapping[str, Any], params: Mapping[str, Any]) -> CopyResult | None:
        """Settle a copy a dead worker left active (None: copy it again)."""


def normal_adler32(value: Any) -> str:
    return str(value).lower().removeprefix("adler32:").rjust(8, "0")


class GfalCopier:
    def __init__(self, config: Config):
        self.config = config
        self.gfal2 = gfal2client.import_gfal2(config)
        self.local = threading.local()

    def context(self) -> Any:
        """One gfal2 context per copy thread (a context runs one operation at a time)."""
        ctx = getattr(self.local, "ctx", None)
        if ctx is None:
            ctx = self.local.ctx = gfal2client.new_context(self.config)
        return ctx

    def precheck(self, entry: Mapping[str, Any], params: Mapping[str, Any]) -> CopyResult | None:
        """EEXIST without copying when the destination exists and may not be overwritten."""
        if params.get("overwrite"):
            return None
        try:
            self.context().stat(entry["destination"])
        except self.gfal2.GError:
            return None
        return CopyResult(
            FAILED, f"destination {entry['destination']} exists", errors.DESTINATION_EXISTS
        )

    def copy(
        self, entry: Mapping[str, Any], params: Mapping[str, Any], cancelled: Callable[[], bool]
    ) -> CopyResult:
        ctx = self.context()
        verify = params.get("verify_checksum", True)
        p = gfal2client.transfer_parameters(
            ctx,
            overwrite=bool(params.get("overwrite")),
            adler32=entry["adler32"] if verify else None,
        )
        p.timeout = int(self.config.gfal.timeout)
        events = gfal2client.TransferEvents()
        p.event_callback = events

        def on_progress(*_: Any) -> None:
            if cancelled():
                ctx.cancel()

        p.monitor_callback = on_progress
        try:
            ctx.filecopy(p, entry["source"], entry["destination"])
        except self.gfal2.GError as exc:
            error_class = errors.classify(exc.code, exc.message)
            if error_class not in UNTOUCHED_AFTER:
                self.remove_leftover(entry["destination"])
            if cancelled():
                return CopyResult(CANCELED, "canceled by the client", errors.CANCELED)
            return self.diagnosed(entry, f"[{exc.code}] {exc.message}", error_class)
        if not events.third_party:
            log.warning(
                "copy of %s was not third-party (%s)",
                entry["destination"],
                ", ".join(events.types) or "no transfer type reported",
            )
        checksum = self.destination_checksum(entry["destination"])
        expected = normal_adler32(entry["adler32"])
        if verify and checksum is not None and checksum != expected:
            # gfal2 fell back to another copy mode that reported no error: a full destination
            # left a truncated file (seen after another mode had failed on it).
            self.remove_leftover(entry["destination"])
            said = f"destination adler32 {checksum}, expected {expected}"
            return self.diagnosed(entry, said, errors.CHECKSUM)
        return CopyResult(DONE, checksum=checksum)

    def remove_leftover(self, url: str) -> None:
        """Remove what a failed copy left at its destination (an XRootD third-party copy into a
        full destination leaves the part that fitted and reports a checksum mismatch): the
        next attempt would find it there and fail as `destination_exists`. The destination
        is this copy's own: the worker refused an existing one unless overwriting."""
        try:
            self.context().unlink(url)
        except self.gfal2.GError as exc:
            log.debug("nothing removed at %s after a failed copy: %s", url, exc.message)

    def diagnosed(self, entry: Mapping[str, Any], reason: str, error_class: str) -> CopyResult:
        """A failed copy's result, told `quota` when its destination has less room than the
        file: a full destination makes XRootD's third-party copies end as a checksum mismatch
        or a cut connection, never as ENOSPC, and a full destination is held, not retried."""
        if error_class in UNTOUCHED_AFTER or error_class in (errors.QUOTA, errors.SOURCE_MISSING):
            return CopyResult(FAILED, reason, error_class)
        free = gfal2client.free_space(self.context(), self.config, entry["destination"])
        size = int(entry.get("size") or 0)
        if free is not None and free < size:
            return CopyResult(
                FAILED,
                f"no space left at the destination: {free} bytes free, the file needs {size} "
                f"(the copy: {reason})",
                errors.QUOTA,
            )
        return CopyResult(FAILED, reason, error_class)

    def destination_checksum(self, url: str, tries: int = CHECKSUM_TRIES) -> str | None:
        """The destination's adler32, asked up to `tries` times: XRootD has answered a
        checksum request with "HTTP 500 Unexpected server error" now and then under load
        (a copy gfal2 had verified then kept no checksum in its record)."""
        for attempt in range(1, tries + 1):
            try:
                return normal_adler32(self.context().checksum(url, "ADLER32"))
            except self.gfal2.GError as exc:
                log.warning(
                    "no checksum of %s after the copy (try %d of %d): %s",
                    url,
                    attempt,
                    tries,
                    exc.message,
                )
                if attempt < tries:
                    time.sleep(CHECKSUM_RETRY_DELAY)
        return None

    def resume(self, entry: Mapping[str, Any], params: Mapping[str, Any]) -> CopyResult | None:
        """Settle a copy a dead worker left active: done if the destination is complete and
        verified; otherwise remove what it left and return None (copy again). The destination
        is ours: the worker refused existing destinations before marking the copy active."""
        ctx = self.context()
        url = entry["destination"]
        try:
            stat = ctx.stat(url)
        except self.gfal2.GError:
            return None  # nothing there: copy again
        checksum = self.destination_checksum(url)
        if stat.st_size == entry["size"] and checksum == normal_adler32(entry["adler32"]):
            return CopyResult(DONE, checksum=checksum)
        try:
            ctx.unlink(url)
        except self.gfal2.GError as exc:
            log.warning("could not remove the partial copy %s: %s", url, exc.message)
        return None
