"""One checksum-verified third-party copy with gfal2, as the gfal worker makes it.

The gfal2 context (client environment, HTTP and XRootD settings, CA directory) comes from
aso.gfalctx; here: transfer parameters (overwrite, adler32 verification against the request's
value, timeout, parent directories), cancellation, the error class of a failure, and the check
that the copy really was third-party (gfal2 may otherwise stream the data through the client
and still report success).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from aso import gfalctx
from aso.config import Config
from aso.transfer import errors

log = logging.getLogger("aso.transfer.gfal")


class GfalCopier:
    def __init__(self, config: Config):
        self.config = config
        self.gfal2 = gfalctx.import_gfal2(config)
        self.local = threading.local()

    def context(self) -> Any:
        """One gfal2 context per copy thread (a context runs one copy at a time)."""
        ctx = getattr(self.local, "ctx", None)
        if ctx is None:
            ctx = self.local.ctx = gfalctx.new_context(self.config)
        return ctx

    def parameters(
        self,
        ctx: Any,
        entry: Mapping[str, Any],
        params: Mapping[str, Any],
        events: list[str],
        cancelled: Callable[[], bool],
    ) -> Any:
        p = ctx.transfer_parameters()
        p.overwrite = bool(params.get("overwrite"))
        p.timeout = int(self.config.gfal.timeout)
        p.create_parent = True
        p.nbstreams = 1
        p.proxy_delegation = False  # else a missing root:// source reads as ENOTSUP
        if params.get("verify_checksum", True):
            p.checksum_check = True
            p.set_checksum(self.gfal2.checksum_mode.both, "ADLER32", entry["adler32"])

        def on_event(event: Any) -> None:
            events.append(f"{event.stage}:{event.description}")

        def on_progress(*_: Any) -> None:
            if cancelled():
                ctx.cancel()

        p.event_callback = on_event
        p.monitor_callback = on_progress
        return p

    def precheck(self, entry: Mapping[str, Any], params: Mapping[str, Any]) -> Any:
        """EEXIST without copying when the destination exists and may not be overwritten."""
        from agents.gfal_worker import CopyResult

        if params.get("overwrite"):
            return None
        try:
            self.context().stat(entry["destination"])
        except self.gfal2.GError:
            return None
        return CopyResult(
            "failed", f"destination {entry['destination']} exists", errors.DESTINATION_EXISTS
        )

    def copy(
        self, entry: Mapping[str, Any], params: Mapping[str, Any], cancelled: Callable[[], bool]
    ) -> Any:
        from agents.gfal_worker import CopyResult

        ctx = self.context()
        events: list[str] = []
        p = self.parameters(ctx, entry, params, events, cancelled)
        try:
            ctx.filecopy(p, entry["source"], entry["destination"])
        except self.gfal2.GError as exc:
            if cancelled():
                return CopyResult("canceled", "canceled by the client", errors.CANCELED)
            error_class = errors.classify(exc.code, exc.message)
            return CopyResult("failed", f"[{exc.code}] {exc.message}", error_class)
        streamed = [e for e in events if "TRANSFER:TYPE" in e.upper() and "stream" in e.lower()]
        if streamed:
            log.warning(
                "copy of %s was streamed through the worker, not third-party: %s",
                entry["destination"],
                streamed[-1],
            )
        checksum = self.destination_checksum(ctx, entry["destination"])
        return CopyResult("done", checksum=checksum)

    def destination_checksum(self, ctx: Any, url: str) -> str | None:
        try:
            return str(ctx.checksum(url, "ADLER32")).lower().rjust(8, "0")
        except self.gfal2.GError as exc:
            log.warning("no checksum of %s after the copy: %s", url, exc.message)
            return None

    def resume(self, entry: Mapping[str, Any], params: Mapping[str, Any]) -> Any:
        """Settle a copy a dead worker left active: done if the destination is complete and
        verified; otherwise remove what it left and return None (copy again)."""
        from agents.gfal_worker import CopyResult

        ctx = self.context()
        url = entry["destination"]
        try:
            stat = ctx.stat(url)
        except self.gfal2.GError:
            return None  # nothing there: copy again
        checksum = self.destination_checksum(ctx, url)
        if stat.st_size == entry["size"] and checksum == entry["adler32"].lower().rjust(8, "0"):
            return CopyResult("done", checksum=checksum)
        try:
            ctx.unlink(url)  # a partial copy of ours (the worker checked it was absent first)
        except self.gfal2.GError as exc:
            log.warning("could not remove the partial copy %s: %s", url, exc.message)
        return None
