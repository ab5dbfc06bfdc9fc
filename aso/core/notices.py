"""What the notifier tells operators, as plain functions over hold documents: each entry of a
hold's history (started, released, cancelled, expired) is one event, told once; the events of
a hold since its last notice are told together, in one notice; `notified` in the hold records
the `at` of the last entry told. Entries older than `notify.max_age` when the
notifier first sees them are not told (a notifier started on a store full of old holds would
send them all at once)."""

from __future__ import annotations

import time
import unicodedata
from collections import Counter
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
# What a chat or a mail reader takes as markup in a user's text, turned into look-alikes that
# are text everywhere: mentions (`@channel`, `<!here>`, `<@U1>`), links (`[x](url)`,
# `<url|x>`) and code spans that would close the quote around the text.
INERT = str.maketrans({"@": "\uff20", "<": "\u2039", ">": "\u203a", "[": "\uff3b",
                       "]": "\uff3d", "`": "\uff40", "&": "\uff06"})  # fmt: skip


@dataclass(frozen=True)
class Notice:
    """One event to tell: its hold, the entry's time, a title and a body."""

    hold_id: str
    at: float
    title: str
    body: str


def plain(text: Any) -> str:
    """A user-given text as a notice shows it: control and format characters (a terminal's or
    a mail reader's escapes, bidi overrides) replaced, markup made inert (INERT), cut to
    MAX_FIELD characters."""
    cleaned = "".join(
        "?" if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in str(text)
    ).translate(INERT)
    return cleaned if len(cleaned) <= MAX_FIELD else cleaned[: MAX_FIELD - 1] + "…"


def when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def pending(doc: Mapping[str, Any], now: float, max_age: float) -> Notice | None:
    """The hold's events not told yet (`untold`), told in one notice: its latest, and how
    many came before it since the last notice (round 32: a user releasing her hold in a loop,
    held again at once, had every event sent, and other users' notices waited minutes behind
    them)."""
    entries = untold(doc, now, max_age)
    if not entries:
        return None
    hold, last = holds.hold_of(doc), entries[-1]
    who = f"{plain(hold.user)}'s files" if hold.user else "every user's files"
    word = EVENT_WORDS.get(last["state"], plain(last["state"]))
    title = f"ASO: {who} {word} at {plain(hold.site)}"
    lines = [
        f"{title} ({plain(hold.error_class)}), {when(float(last['at']))}, by {plain(last['by'])}.",
        f'Reason given: "{plain(last["reason"])}"',
    ]
    if len(entries) > 1:
        counts = Counter(EVENT_WORDS.get(e["state"], plain(e["state"])) for e in entries[:-1])
        earlier = ", ".join(f"{word} {n}x" for word, n in sorted(counts.items()))
        lines.append(f"Before it since the last notice: {earlier}.")
    lines += [
        f"Now: {plain(hold.says())}",
        f"`aso hold list` shows the holds; this one is {plain(doc['_id'])}.",
    ]
    return Notice(doc["_id"], float(last["at"]), title, "\n".join(lines))


def untold(doc: Mapping[str, Any], now: float, max_age: float) -> list[Mapping[str, Any]]:
    """The entries of a hold's history after the last one told (`notified` is its `at`),
    whatever their own times say (round 32: a release its user dated back, as the store
    allows an owner's time up to a day behind, was never told); with none told yet, those of
    the last `max_age` seconds."""
    history = doc.get("history") or []
    told = doc.get("notified")
    if told is None:
        return [e for e in history if float(e["at"]) >= now - max_age]
    marks = [i for i, e in enumerate(history) if float(e["at"]) == float(told)]
    if marks:
        return list(history[marks[-1] + 1 :])
    return [e for e in history if float(e["at"]) > float(told)]  # that entry was trimmed


def told(current: dict[str, Any], at: float) -> dict[str, Any] | None:
    """The hold with its events up to the entry of time `at` recorded as told; None:
    recorded already."""
    if current.get("notified") == at:
        return None
    return {**current, "notified": at}
