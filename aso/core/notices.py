"""What the notifier tells operators, as plain functions over hold documents: each entry of a
hold's history (started, released, cancelled, expired) is one event, told once; `notified` in
the hold records the `at` of the last entry told. Entries older than `notify.max_age` when the
notifier first sees them are not told (a notifier started on a store full of old holds would
send them all at once)."""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aso import model
from aso.core import holds

# How each state of a hold's entry reads in a notice's title.
EVENT_WORDS = {
    model.HOLD_ACTIVE: "held",
    model.HOLD_RELEASED: "released",
    model.HOLD_CANCELLED: "cancelled",
    model.HOLD_EXPIRED: "expired",
}
MAX_FIELD = 300  # characters of a user-given text in a notice


@dataclass(frozen=True)
class Notice:
    """One event to tell: its hold, the entry's time, a title and a body."""

    hold_id: str
    at: float
    title: str
    body: str


def plain(text: Any) -> str:
    """A user-given text as a notice shows it: control and format characters (a terminal's or
    a mail reader's escapes, bidi overrides) replaced, cut to MAX_FIELD characters."""
    cleaned = "".join(
        "?" if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in str(text)
    )
    return cleaned if len(cleaned) <= MAX_FIELD else cleaned[: MAX_FIELD - 1] + "…"


def when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def pending(doc: Mapping[str, Any], now: float, max_age: float) -> list[Notice]:
    """The events of a hold not told yet (after `notified`), oldest first; entries older than
    `max_age` are passed over."""
    told = float(doc.get("notified") or 0.0)
    hold = holds.hold_of(doc)
    who = f"{plain(hold.user)}'s files" if hold.user else "every user's files"
    notices = []
    for entry in doc.get("history") or []:
        at = float(entry["at"])
        if at <= told or at < now - max_age:
            continue
        word = EVENT_WORDS.get(entry["state"], plain(entry["state"]))
        title = f"ASO: {who} {word} at {plain(hold.site)}"
        body = "\n".join(
            [
                f"{title} ({plain(hold.error_class)}), {when(at)}, by {plain(entry['by'])}:",
                plain(entry["reason"]),
                f"now: {plain(hold.says())}",
                f"`aso hold list` shows the holds; this one is {plain(doc['_id'])}.",
            ]
        )
        notices.append(Notice(doc["_id"], at, title, body))
    return notices


def told(current: dict[str, Any], at: float) -> dict[str, Any] | None:
    """The hold with its events up to `at` recorded as told; None: recorded already."""
    if float(current.get("notified") or 0.0) >= at:
        return None
    return {**current, "notified": at}
