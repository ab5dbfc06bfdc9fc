"""Notifier: tells operators when files are held and when a hold is released, cancelled or
expired, through a maintained notification library (apprise: e-mail, webhooks, Mattermost and
many more), to the URLs of `notify.urls`.

Every `notify.interval` seconds the first live instance reads the holds and sends, for each hold
with new entries in its history (aso/core/notices.py), one notice of them to every URL, at most
one per hold every `notify.min_interval` seconds (events meanwhile are told together in the
next); once sent, the hold records the last entry's time (`notified`), read-decide-write. A
notice that could not be sent is tried again next cycle; one sent whose record could not be
written may be sent again (at least once, never a storm: a hold's user cannot reset `notified`,
and entries older than `notify.max_age` are passed over). Without URLs the agent does nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aso.config import Config
from aso.core import notices
from aso.monitoring.queries import all_holds
from aso.runtime import Cycle, PeriodicAgent
from aso.store import Server, StoreError

log = logging.getLogger("aso.agent.notifier")


class Notifier(PeriodicAgent):
    name = "notifier"
    kinds = ()

    def __init__(
        self, config: Config, instance: str | None = None, *, server: Server | None = None
    ):
        super().__init__(config, instance, server=server)
        self.targets: Any = None  # the apprise.Apprise of notify.urls, made at the first notice
        self.last_sent: dict[str, float] = {}  # hold id → monotonic time of its last notice

    @property
    def interval(self) -> float:
        return self.config.notify.interval

    def cycle(self, ctx: Cycle) -> None:
        report = ctx.counts("notices", "notice_failures")
        if not self.config.notify.urls or not self.take_turn(ctx.partition):
            return
        try:
            found = all_holds(self.db)
        except StoreError as exc:
            log.warning("holds not read (%s): no notices this cycle", exc)
            return
        told: dict[str, float] = {}
        settings, now = self.config.notify, time.monotonic()
        for doc in found:
            if now - self.last_sent.get(doc["_id"], -settings.min_interval) < settings.min_interval:
                continue  # its events wait for the next notice, together
            notice = notices.pending(doc, ctx.now, settings.max_age)
            if notice is None:
                continue
            if not self.send(notice):
                report["notice_failures"] += 1
                continue
            report["notices"] += 1
            told[notice.hold_id] = notice.at
            self.last_sent[notice.hold_id] = now
            ctx.alive()
        if told:
            self.record([d for d in found if d["_id"] in told], told)

    def send(self, notice: notices.Notice) -> bool:
        """Send one notice to every URL; True when each took it."""
        if self.targets is None:
            import apprise

            self.targets = apprise.Apprise()
            for url in self.config.notify.urls:
                if not self.targets.add(url):
                    log.error("notify.urls: apprise does not take %s", notices.plain(url)[:60])
        sent = bool(self.targets.notify(title=notice.title, body=notice.body))
        if sent:
            log.info("told: %s", notice.title)
        else:
            log.warning("not told (tried again next cycle): %s", notice.title)
        return sent

    def record(self, docs: list[dict[str, Any]], told: dict[str, float]) -> None:
        """Record in each hold the last event told (read again and decided again when the
        hold checker or its user wrote it meanwhile)."""

        def decide(current: dict[str, Any]) -> dict[str, Any] | None:
            return notices.told(current, told[current["_id"]])

        try:
            outcome = self.db.write_decided(docs, decide)
        except StoreError as exc:
            log.warning("notices sent but not recorded (%s): they may be sent again", exc)
            return
        for refused in outcome.refused:
            log.warning("hold %s: notice not recorded: %s", refused.id, refused.reason)
