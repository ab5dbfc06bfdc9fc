"""Reconciler agent: compares the documents, the storage and the catalog every
`reconciler.interval` seconds and reports what disagrees (aso.reconcile). It never repairs:
`aso reconcile --fix` does, when an operator decides to.

Each finding is logged with its kind and its request id (or path, or block); a lost file at
ERROR level, the others at WARNING, the first TOLD_PER_KIND of a kind (the rest at DEBUG, and
how many there were); the counts per kind go into the heartbeat's last cycle.

The agent has no work kinds: it reads all requests itself. It wakes every
min(`reconciler.interval`, `agents.heartbeat_interval`) seconds so that its heartbeat stays
fresh, and reconciles when `reconciler.interval` has passed since its last reconciliation (at
once when it starts). With several instances, only the first live one reconciles.
"""

from __future__ import annotations

import collections
import logging

from aso import reconcile
from aso.catalog import open_catalog
from aso.catalog.base import Catalog
from aso.config import Config
from aso.files import Files, open_files
from aso.runtime import Cycle, PeriodicAgent
from aso.store import Server

log = logging.getLogger("aso.agent.reconciler")
# Findings of one kind logged at their level in a cycle: a user's 30,000 requests recorded `done`
# with no file written had made 30,000 ERROR lines an hour.
TOLD_PER_KIND = 20


class Reconciler(PeriodicAgent):
    name = "reconciler"
    kinds = ()

    def __init__(
        self,
        config: Config,
        instance: str | None = None,
        files: Files | None = None,
        catalog: Catalog | None = None,
        *,
        server: Server | None = None,
    ):
        super().__init__(config, instance, server=server)
        self.files = files or open_files(config)
        self.catalog = catalog or open_catalog(config, self.server)
        self.last_report: reconcile.Report | None = None

    @property
    def interval(self) -> float:
        return self.config.reconciler.interval

    def cycle(self, ctx: Cycle) -> None:
        if not self.take_turn(ctx.partition):
            return
        report = reconcile.reconcile(
            self.config, self.db, catalog=self.catalog, files=self.files, alive=ctx.alive
        )
        self.last_report = report
        told: collections.Counter[str] = collections.Counter()
        for finding in report.findings:
            level = logging.ERROR if finding.lost else logging.WARNING
            told[finding.kind] += 1
            log.log(
                level if told[finding.kind] <= TOLD_PER_KIND else logging.DEBUG,
                "%s %s%s: %s%s",
                finding.kind,
                finding.subject,
                f" at {finding.site}" if finding.site else "",
                finding.detail,
                f" (repair: {finding.repair.text})" if finding.repair else "",
            )
        for kind, count in told.items():
            if count > TOLD_PER_KIND:
                log.warning("%d more %s findings (at DEBUG; `aso reconcile` lists them all)",
                            count - TOLD_PER_KIND, kind)  # fmt: skip
        for error in report.errors:
            log.error("not checked: %s", error)
        counts = report.counts()
        log.info(
            "reconciled %d requests in %.1f s: %s",
            report.checked.get("requests", 0),
            report.seconds,
            ", ".join(f"{k} {n}" for k, n in counts.items()) or "all agree",
        )
        ctx.report.update(
            {kind: counts.get(kind, 0) for kind in reconcile.KINDS},
            lost=sum(1 for f in report.findings if f.lost),
            check_errors=len(report.errors),
            requests=report.checked.get("requests", 0),
        )

    def close(self) -> None:
        self.catalog.close()
