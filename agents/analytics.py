"""Analytics agent: keeps the monitoring summaries up to date and the files database small.

Every `analytics.summary_interval` seconds it brings the monitoring summaries
(aso.monitoring.summaries: the hour, day and live documents the pages read) up to date from the
`_changes` feed. Every `analytics.interval` seconds it counts the finished requests older than
`analytics.purge_after` into the statistics database and deletes them (aso.monitoring.purge: each
counted exactly once, crash or not); only requests whose every event is already in the closed
hours' summaries.

The statistics of requests still in the files database come from its own views
(couchapp/stats-live), so there is nothing to aggregate ahead of the purge:
`aso stats` and the monitoring add both. With `purge_after = 0` the agent does nothing but its
heartbeat.

The agent has no work kinds. It wakes every min(`analytics.interval`,
`analytics.summary_interval`, `agents.heartbeat_interval`) seconds so that its heartbeat stays
fresh, and purges when the interval has passed (at once when it starts). With several instances
only the first live one sums up and purges, and a lease in the statistics database keeps a
second purger out during a handover.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aso.config import Config
from aso.monitoring import purge, summaries
from aso.provision import storejs
from aso.runtime import Cycle, PeriodicAgent
from aso.store import Server

log = logging.getLogger("aso.agent.analytics")


class Analytics(PeriodicAgent):
    name = "analytics"
    kinds = ()

    def __init__(
        self, config: Config, instance: str | None = None, *, server: Server | None = None
    ):
        super().__init__(config, instance, server=server)
        self.stats_db = self.server.db(config.store.stats_db)
        settings = config.analytics
        self.summaries = summaries.Aggregator(
            self.db, self.stats_db, close_after=settings.close_after, batch=settings.batch
        )
        self.last_summary: float | None = None  # monotonic time of the last summary update

    @property
    def interval(self) -> float:
        return self.config.analytics.interval

    @property
    def idle(self) -> float:
        return min(super().idle, self.config.analytics.summary_interval)

    @property
    def lease(self) -> float:
        # Long enough for a purge cycle, short enough for a successor to take over soon.
        return max(2 * self.config.analytics.interval, self.config.agents.heartbeat_expiry)

    def cycle(self, ctx: Cycle) -> None:
        if ctx.partition.index != 0:
            self.summaries.loaded = False  # another instance sums up: read its state on return
            return
        report = ctx.report
        now = time.monotonic()
        interval = self.config.analytics.summary_interval
        if self.last_summary is None or now - self.last_summary >= interval:
            self.last_summary = now
            step = self.summaries.step()
            if step.closed:
                log.info("monitoring summaries: hours %s closed", ", ".join(step.closed))
            report.update(step.to_json())
        if self.take_turn(ctx.partition):
            report.update(self.purge(ctx.now))

    def purge(self, now: float) -> dict[str, Any]:
        settings = self.config.analytics
        bound = self.summaries.purge_bound()
        if settings.purge_after <= 0 or bound is None:
            return {}
        older_than = min(now - settings.purge_after, bound)
        report = purge.purge(
            self.db,
            self.stats_db,
            older_than=older_than,
            batch_size=settings.batch,
            by=self.instance,
            lease=self.lease,
            counts=storejs.contribution,
        )
        if report.batches:
            log.info(
                "purged %d finished requests older than %.0f s in %d batches (%d kept: changed)",
                report.purged,
                settings.purge_after,
                report.batches,
                report.kept,
            )
        return {
            "purged": report.purged,
            "kept": report.kept,
            "batches": report.batches,
            "recovered": report.recovered,
        }

    def close(self) -> None:
        purge.release_lease(self.stats_db, self.instance)
