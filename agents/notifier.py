"""Notifier: tells operators, and users who subscribed (`aso notify`), when files are held and
when a hold is released, cancelled or expired, and tells users when the transfers of a task of
theirs are over, through a maintained notification library (apprise: e-mail, webhooks,
Mattermost and many more).

Every `notify.interval` seconds the first live instance reads the holds and sends, for each hold
with new entries in its history (aso/core/notices.py), one notice of them to every URL of
`notify.urls`, at most one per hold every `notify.min_interval` seconds (events meanwhile are
told together in the next); once sent, the hold records the last entry's time (`notified`),
read-decide-write. A notice that could not be sent is tried again next cycle; one sent whose
record could not be written may be sent again (at least once, never a storm: a hold's user
cannot reset `notified`, and entries older than `notify.max_age` are passed over).

The same notice goes to the hold's user's subscribed targets that want its events, and at most
every `notify.min_interval` a user's newly finished tasks are told in one notice (their record,
`told:USER` in the notify database, is the agents'). A user's targets are told only where the
operator allows (notices.refusal), at most once (no retry), from a few threads of their own, one
user at a time each: a user's slow or failing webhook delays only that user's notices.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aso import model, notify_send
from aso.config import Config
from aso.core import notices
from aso.monitoring.queries import all_holds
from aso.runtime import Cycle, PeriodicAgent
from aso.store import Server, StoreError

log = logging.getLogger("aso.agent.notifier")

USER_THREADS = 4  # users' targets told at once
USER_DEADLINE = 10.0  # seconds a user's notice may take to be told, its process ended past it
STARTUP_DEADLINE = 60.0  # seconds a notice's process may take to start (a busy host's)
SENDER = [sys.executable, "-m", "aso.notify_send"]
USER_BACKOFF = 900.0  # seconds a user whose notice was ended so waits for the next
MAX_USER_QUEUE = 20  # notices waiting for one user's targets; older ones are dropped
TASK_ROWS = 3 * model.MAX_TOLD_TASKS  # rows of a user's tasks view read per look
MAX_SITE_LOOKS = 500  # subscribed users looked at for a site's hold's event


class Notifier(PeriodicAgent):
    name = "notifier"
    kinds = ()

    def __init__(
        self, config: Config, instance: str | None = None, *, server: Server | None = None
    ):
        super().__init__(config, instance, server=server)
        self.notify_db = self.server.db(config.store.notify_db)
        self.targets: Any = None  # the apprise.Apprise of notify.urls, made at the first notice
        self.last_sent: dict[str, float] = {}  # hold id → monotonic time of its last notice
        # (hold id, user) → `at` of the last entry the user was told
        self.user_told: dict[tuple[str, str], float] = {}
        self.tasks_looked: dict[str, float] = {}  # user → monotonic time of the last task look
        self.pool = ThreadPoolExecutor(USER_THREADS, thread_name_prefix="notify-user")
        self.lock = threading.Lock()
        self.user_queues: dict[str, list[notices.Notice]] = {}  # waiting for a user's thread
        self.user_counts = {"sent": 0, "failed": 0, "dropped": 0}  # since the last cycle
        self.backoff_until: dict[str, float] = {}  # user → monotonic time of their next notice
        self.senders: set[Any] = set()  # the processes telling users' notices now
        self.stopping = False

    @property
    def interval(self) -> float:
        return self.config.notify.interval

    def cycle(self, ctx: Cycle) -> None:
        report = ctx.counts("notices", "notice_failures", "user_notices", "user_notice_failures")
        settings = self.config.notify
        users_may = bool(settings.user_mail or settings.webhooks)
        if not (settings.urls or users_may) or not self.take_turn(ctx.partition):
            return
        self.count_user_notices(report)
        try:
            found = all_holds(self.db)
            subscriptions = self.subscriptions() if users_may else {}
        except StoreError as exc:
            log.warning("holds or subscriptions not read (%s): no notices this cycle", exc)
            return
        self.tell_holds(ctx, found, subscriptions, report)
        for user, subscription in sorted(subscriptions.items()):
            if notices.wants(subscription, model.TASK_DONE):
                with self.isolated(report, f"{user}'s tasks"):
                    self.tell_tasks(ctx, user, subscription)

    @contextlib.contextmanager
    def isolated(self, report: dict[str, Any], what: str) -> Iterator[None]:
        """One hold's or one user's notices: whatever a document makes of them, the others
        of the cycle are told (a user's odd subscription had failed every cycle)."""
        try:
            yield
        except Exception:
            log.exception("%s: not told this cycle", notices.plain(what))
            report["notice_errors"] = report.get("notice_errors", 0) + 1

    # -- holds ------------------------------------------------------------------------------
    def tell_holds(
        self,
        ctx: Cycle,
        found: list[dict[str, Any]],
        subscriptions: Mapping[str, dict[str, Any]],
        report: dict[str, Any],
    ) -> None:
        told: dict[str, float] = {}
        settings, now = self.config.notify, time.monotonic()
        for doc in found:
            if now - self.last_sent.get(doc["_id"], -settings.min_interval) < settings.min_interval:
                continue  # its events wait for the next notice, together
            notice = notices.pending(doc, ctx.now, settings.max_age)
            if notice is None:
                continue
            with self.isolated(report, f"{doc['_id']} to its users"):
                self.tell_holders(doc, notice, subscriptions, ctx.now)
            if settings.urls and not self.send(notice):
                report["notice_failures"] += 1
                continue
            report["notices"] += int(bool(settings.urls))
            told[notice.hold_id] = notice.at
            self.last_sent[notice.hold_id] = now
            ctx.alive()
        if told:
            self.record([d for d in found if d["_id"] in told], told)

    def tell_holders(
        self,
        doc: Mapping[str, Any],
        notice: notices.Notice,
        subscriptions: Mapping[str, dict[str, Any]],
        now: float,
    ) -> None:
        """The targets of the users whose files the hold holds, for the events they subscribed
        to, once per entry (the operators' notice may be tried again; a user's is not sent
        twice): a user's hold's user; for a site's hold, each subscribed user with files
        waiting to start from or to the site."""
        entries = notices.untold(doc, now, self.config.notify.max_age)
        wanting = [
            s for s in subscriptions.values()
            if any(notices.wants(s, notices.event_of(e)) for e in entries)
            and self.user_told.get((notice.hold_id, s["user"]), -1.0) < notice.at
        ]  # fmt: skip
        if doc.get("user"):
            wanting = [s for s in wanting if s["user"] == doc["user"]]
        else:
            wanting = [s for s in wanting[:MAX_SITE_LOOKS] if self.waits_at(s["user"], doc["site"])]
        for subscription in wanting:
            self.user_told[(notice.hold_id, subscription["user"])] = notice.at
            self.queue_for(subscription, notice)

    def waits_at(self, user: str, site: str) -> bool:
        """Whether the user has files waiting to start from or to the site (the queue view's
        submit rows, counted per link)."""
        rows = self.db.view("queue", "work", start_key=["submit", user],
                            end_key=["submit", user, {}], group_level=4).rows  # fmt: skip
        return any(site in row["key"][2:4] and row["value"] for row in rows)

    def send(self, notice: notices.Notice) -> bool:
        """Send one notice to every URL of notify.urls; True when each took it."""
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

    # -- users' tasks -------------------------------------------------------------------------
    def tell_tasks(self, ctx: Cycle, user: str, subscription: Mapping[str, Any]) -> None:
        """At most every notify.min_interval: the user's tasks whose transfers ended since the
        last look, told in one notice, and recorded (`told:USER`)."""
        now = time.monotonic()
        if now - self.tasks_looked.get(user, -1e18) < self.config.notify.min_interval:
            return
        self.tasks_looked[user] = now
        try:
            rows = self.db.view("users", "tasks", start_key=[user, {}], end_key=[user],
                                descending=True, group_level=3, limit=TASK_ROWS).rows  # fmt: skip
            record = self.notify_db.get(model.told_id(user))
        except StoreError as exc:
            log.warning("%s's tasks not read (%s): looked at again next time", user, exc)
            self.tasks_looked.pop(user, None)
            return
        finished = notices.finished_tasks(rows)
        told = None if record is None else record.get("tasks")
        if not isinstance(told, dict):
            told = None  # none yet, or of another shape (the store's admin's): a first look
        new = notices.new_finished(finished, told)
        seen = {row["key"][1] for row in rows}
        kept = notices.told_tasks(finished, told, ctx.now, seen)
        if new:
            self.queue_for(subscription, notices.task_notice(user, new, finished))
        if record is not None and kept == told:
            return
        doc = {**(record or {"_id": model.told_id(user)}), "type": model.TOLD_TYPE,
               "user": user, "tasks": kept, "updated": round(ctx.now, 3)}  # fmt: skip
        try:
            self.notify_db.put(doc)
        except StoreError as exc:
            log.warning("%s's tasks told not recorded (%s): they may be told again", user, exc)
        ctx.alive()

    # -- a user's targets ---------------------------------------------------------------------
    def subscriptions(self) -> dict[str, dict[str, Any]]:
        """Every user's subscription with a target and an event, by user (one the store's
        admin wrote past the validation, of another shape, is passed over)."""
        docs = self.notify_db.all_docs("notify:", "notify:\ufff0")
        return {d["user"]: d for d in docs if notices.usable(d)}

    def queue_for(self, subscription: Mapping[str, Any], notice: notices.Notice) -> None:
        """The notice queued for the user's targets; a thread tells them, one user's notices
        one after the other. A user whose last notice could not be told in USER_DEADLINE waits
        USER_BACKOFF before the next is tried (those meanwhile are dropped, counted)."""
        user = subscription["user"]
        urls = self.user_urls(subscription)
        if not urls:
            return
        with self.lock:
            if time.monotonic() < self.backoff_until.get(user, 0.0):
                self.user_counts["dropped"] += 1
                return
            queue = self.user_queues.get(user)
            if queue is not None:  # a thread is at this user's targets: it takes this one too
                queue.append(notice)
                if len(queue) > MAX_USER_QUEUE:
                    del queue[0]
                    self.user_counts["dropped"] += 1
                return
            self.user_queues[user] = [notice]
        self.pool.submit(self.tell_user, user, urls)

    def user_urls(self, subscription: Mapping[str, Any]) -> list[str]:
        """The apprise URLs of the subscription's targets the operator allows."""
        urls, settings = [], self.config.notify
        for target in subscription.get("targets", []):
            kind, to = target.get("kind", ""), target.get("to", "")
            why = notices.refusal(kind, to, settings)
            if why:
                log.debug("%s's %s target not told: %s", subscription["user"], kind, why)
                continue
            urls.append(notices.apprise_url(kind, to, settings))
        return urls

    def tell_user(self, user: str, urls: list[str]) -> None:
        """(In a thread.) The user's queued notices, to each of the user's targets, once, each
        in a process of its own that is ended past USER_DEADLINE: a target that answers a byte
        at a time would hold a thread (and apprise's own) for as long as it likes."""
        while not self.stopping:
            with self.lock:
                queue = self.user_queues.get(user) or []
                if not queue:
                    self.user_queues.pop(user, None)
                    return
                notice = queue.pop(0)
            sent, late = self.run_sender(urls, notice)
            with self.lock:
                self.user_counts["sent" if sent else "failed"] += 1
                if late:
                    self.backoff_until[user] = time.monotonic() + USER_BACKOFF
                    self.user_counts["dropped"] += len(self.user_queues.pop(user, []))
            log.info("%s %s%s: %s", "told" if sent else "not told", user,
                     " (past its deadline: its next notices wait)" if late else "",
                     notice.title)  # fmt: skip
            if late:
                return

    def run_sender(self, urls: list[str], notice: notices.Notice) -> tuple[bool, bool]:
        """(sent, past the deadline) of one notice told by a process of its own
        (aso/notify_send.py): USER_DEADLINE from when it is ready to its answer (its start,
        STARTUP_DEADLINE at most, and its exit are this host's time, not the target's)."""
        told = json.dumps({"urls": urls, "title": notice.title, "body": notice.body})
        with self.lock:
            if self.stopping:
                return False, False
            # Unbuffered bytes: a line read takes that line alone from the pipe, so `ready`
            # and `sent` written together are two answers, not one (round 36).
            process = subprocess.Popen(
                SENDER, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
            )  # fmt: skip
            self.senders.add(process)
        try:
            assert process.stdin is not None
            # A notice is a few KB (20 tasks, user text cut to MAX_FIELD), within a pipe's
            # buffer: written before the sender reads it, the write never waits on it.
            with contextlib.suppress(BrokenPipeError):  # a sender that died is not ready
                process.stdin.write(told.encode())
                process.stdin.close()
            if _said(process, STARTUP_DEADLINE) != notify_send.READY:
                log.warning("a notice's sender did not start in %g s: not told", STARTUP_DEADLINE)
                return False, False
            answer = _said(process, USER_DEADLINE)
            return answer == notify_send.SENT, answer is None
        finally:
            process.kill()  # it has answered, or it is ended: its exit is not waited on
            process.wait()
            with self.lock:
                self.senders.discard(process)

    def count_user_notices(self, report: dict[str, Any]) -> None:
        with self.lock:
            report["user_notices"] += self.user_counts["sent"]
            report["user_notice_failures"] += self.user_counts["failed"]
            if self.user_counts["dropped"]:
                report["user_notices_dropped"] = self.user_counts["dropped"]
            self.user_counts = {"sent": 0, "failed": 0, "dropped": 0}

    def close(self) -> None:
        """Users' notices still queued are dropped, those being told ended."""
        with self.lock:
            self.stopping = True
            for process in self.senders:
                process.kill()
        self.pool.shutdown(wait=True, cancel_futures=True)
        super().close()


def _said(process: subprocess.Popen[bytes], seconds: float) -> str | None:
    """The sender's next line within `seconds` ("" when it ended without one), or None."""
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], seconds)
    return process.stdout.readline().decode(errors="replace").strip() if readable else None
