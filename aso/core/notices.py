"""What the notifier tells, to whom, as plain functions over documents.

Holds: each entry of a hold's history (started, released, cancelled, expired) is one event,
told once to the operators (notify.urls) and to the hold's user where they subscribed to it;
the events of a hold since its last notice are told together; `notified` in the hold records
the `at` of the last entry told. Entries older than `notify.max_age` when the notifier first
sees them are not told (a notifier started on a store full of old holds would send them all).

Users' subscriptions (`aso notify`, model.SUBSCRIPTION_SCHEMA): a target is told only where the
operator allows it (`allowed`: mail through notify.user_mail to a domain of notify.mail_domains,
a webhook under an address of notify.webhooks), through an apprise URL made here from its parts
(`apprise_url`: no redirects followed, short timeouts), never from the user's text as given.
A task is told once when its transfers are all over (`finished_tasks`, `new_finished`)."""

from __future__ import annotations

import re
import time
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from aso import model
from aso.config import NotifyConfig
from aso.core import holds

# How each state of a hold's entry reads in a notice's title.
EVENT_WORDS = {
    model.HOLD_ACTIVE: "held",
    model.HOLD_RELEASED: "released",
    model.HOLD_CANCELLED: "cancelled",
    model.HOLD_EXPIRED: "expired",
}
MAX_FIELD = 300  # characters of a user-given text in a notice
# A dot between two characters (the text taken in NFKC first, so that look-alike letters are
# plain ones): one of an address, whatever its letters (`eviⅼ.com`, `grid-ssо.ch`).
ADDRESS_DOT = re.compile(r"(?<=\S)\.(?=\S)")
# A colon that opens an emoji shortcode (`:warning:`, `:x:`), which chats show as a picture
# (lower case, as chats write them: a hold's id `hold:T2_DE_DESY:alice` stays as it is).
SHORTCODE = re.compile(r":(?=[a-z0-9_+-]+:)")
# Characters that show as blank but are no space, which a text does not collapse: a run of them
# puts what follows on a line of its own in a narrow window (round 37: a fake "ASO:" line).
BLANKS = frozenset("\u115f\u1160\u2800\u3164\uffa0")
SPACES = re.compile(r"\s{2,}")
UNSHOWN = ("Cc", "Cf", "Zl", "Zp")  # controls, formats (bidi, zero-width), line breaks
# An underscore that may open or close emphasis (`__x__`): not one inside a word, which never
# does and which names keep (`261207_101500:alice_task`).
EDGE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# What a chat or a mail reader takes as markup in a user's text, turned into look-alikes that
# are text everywhere: mentions (`@channel`, `<!here>`, `<@U1>`), links (`[x](url)`,
# `<url|x>`), code spans that would close the quote around the text, emphasis and strikethrough
# (`**x**`, `~~x~~`, and `__x__` by EDGE_UNDERSCORE: a spoofed warning in bold); and what chats
# and mail readers make a link of: a scheme's `://`, the dots of a bare address
# (`www.x.org/login`), shown as a one-dot leader, and the full stops IDNA reads as dots.
INERT = str.maketrans({"@": "\uff20", "<": "\u2039", ">": "\u203a", "[": "\uff3b",
                       "]": "\uff3d", "`": "\uff40", "&": "\uff06", "*": "\u2217",
                       "~": "\u223c", "\u3002": "\u2024", "\uff0e": "\u2024",
                       "\uff61": "\u2024"})  # fmt: skip


@dataclass(frozen=True)
class Notice:
    """One event to tell: its hold, the entry's time, a title and a body."""

    hold_id: str
    at: float
    title: str
    body: str


def plain(text: Any) -> str:
    """A user-given text as a notice shows it: in NFKC, control and format characters (a
    terminal's or a mail reader's escapes, bidi overrides) and blanks that are no space
    replaced, spaces collapsed, combining marks on Latin letters dropped (`R̶E̶L̶E̶A̶S̶E̶D̶`
    struck through without markup), markup made inert (INERT, ADDRESS_DOT, SHORTCODE,
    EDGE_UNDERSCORE, and `//`: a link's start with a scheme or without), cut to MAX_FIELD
    characters."""
    normal = unicodedata.normalize("NFKC", str(text))
    cleaned = (
        "".join("?" if c in BLANKS or unicodedata.category(c) in UNSHOWN else c for c in normal)
        .translate(INERT)
        .replace("//", "\u2044\u2044")
    )
    cleaned = SPACES.sub(" ", _undecorated(cleaned))
    cleaned = ADDRESS_DOT.sub("\u2024", SHORTCODE.sub("\ua789", cleaned))
    cleaned = EDGE_UNDERSCORE.sub("\u02cd", cleaned)
    return cleaned if len(cleaned) <= MAX_FIELD else cleaned[: MAX_FIELD - 1] + "…"


def _undecorated(text: str) -> str:
    """`text` without the combining marks on a Latin letter (or on such a mark): in NFKC an
    accent that a letter takes is composed with it, so what is left there is decoration
    (strikethrough, underline, stacks); the marks of scripts written with them stay."""
    kept: list[str] = []
    dropping = False
    for c in text:
        if unicodedata.category(c) in ("Mn", "Me"):
            if dropping or (kept and kept[-1].isascii()):
                dropping = True
                continue
        else:
            dropping = False
        kept.append(c)
    return "".join(kept)


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
        f"Now: {EVENT_WORDS.get(hold.state, plain(hold.state))}, {plain(hold.figures())}",
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


# --- users' subscriptions ---------------------------------------------------------------------
USER_TIMEOUT = 4  # seconds to connect to, and to wait for, a user's webhook
DEFAULT_PORTS = {"http": 80, "https": 443}
HOOK_TOKEN = re.compile(r"^(?P<prefix>(/[^/]+)*)/hooks/(?P<token>[A-Za-z0-9]{1,128})$")


@dataclass(frozen=True)
class Endpoint:
    """An http(s) address as compared with the operator's allowlist."""

    scheme: str
    host: str
    port: int
    path: str


def endpoint(url: str) -> Endpoint | None:
    """The parts of an address of model.WEBHOOK_PATTERN (None: it is none)."""
    if model.target_problem("webhook", url) is not None:
        return None
    parts = urlsplit(url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError:  # out of range: none (the pattern bounds it; a document may predate it)
        return None
    return Endpoint(scheme, host, port, parts.path or "/")


def under(url: Endpoint, allowed: Endpoint) -> bool:
    """The address is the allowed one or below it (a whole path segment at a time)."""
    if (url.scheme, url.host, url.port) != (allowed.scheme, allowed.host, allowed.port):
        return False
    prefix = allowed.path.rstrip("/")
    return url.path.rstrip("/") == prefix or url.path.startswith(prefix + "/")


def refusal(kind: str, to: str, settings: NotifyConfig) -> str | None:
    """Why the operator's settings (NotifyConfig) do not let this target be told (None: they
    do). Deny by default: no user_mail, no mail; no webhooks listed, no webhook."""
    problem = model.target_problem(kind, to)
    if problem:
        return problem
    if kind == "mail":
        if not settings.user_mail:
            return "this ASO sends users no mail (notify.user_mail is not set)"
        domain = to.rpartition("@")[2].lower()
        domains = [d.lower().lstrip(".") for d in settings.mail_domains]
        if not any(domain == d or domain.endswith("." + d) for d in domains):
            listed = ", ".join(settings.mail_domains) or "none"
            where = f"notify.mail_domains: {listed}"
            return f"mail goes only to the domains the operator lists ({where})"
        return None
    url = endpoint(to)
    if url is None:
        return f"{to[:200]!r} is not an http(s) address"
    if kind == "mattermost" and not HOOK_TOKEN.match(url.path):
        return "a Mattermost incoming webhook's address ends in /hooks/<token>"
    allowed = [e for e in (endpoint(a) for a in settings.webhooks) if e is not None]
    if not any(under(url, a) for a in allowed):
        return "webhooks go only under the addresses the operator lists (notify.webhooks)"
    return None


def apprise_url(kind: str, to: str, settings: NotifyConfig) -> str:
    """The apprise URL that tells an allowed target: made from its checked parts, with no
    redirect followed and USER_TIMEOUT to connect and to read."""
    if kind == "mail":
        base = urlsplit(settings.user_mail)
        query = [(k, v) for k, v in parse_qsl(base.query) if k not in ("to", "cc", "bcc")]
        return urlunsplit(base._replace(query=urlencode([*query, ("to", to)])))
    url = endpoint(to)
    assert url is not None
    secure = "s" if url.scheme == "https" else ""
    options = urlencode({"redirect": "no", "cto": USER_TIMEOUT, "rto": USER_TIMEOUT})
    if kind == "mattermost":
        hook = HOOK_TOKEN.match(url.path)
        assert hook is not None
        path = f"{hook['prefix']}/{hook['token']}"
        return f"mmost{secure}://{url.host}:{url.port}{path}?{options}"
    return f"json{secure}://{url.host}:{url.port}{url.path}?{options}"


def usable(doc: Mapping[str, Any]) -> bool:
    """A subscription of the schema's shape, with a target and an event, named for its user."""
    targets, events, user = doc.get("targets"), doc.get("events"), doc.get("user")
    return (
        doc.get("type") == model.SUBSCRIPTION_TYPE
        and isinstance(user, str)
        and doc.get("_id") == model.subscription_id(user)
        and isinstance(targets, list)
        and bool(targets)
        and all(isinstance(t, dict) and isinstance(t.get("kind"), str)
                and isinstance(t.get("to"), str) for t in targets)
        and isinstance(events, list)
        and bool(events)
    )  # fmt: skip


def wants(subscription: Mapping[str, Any] | None, event: str) -> bool:
    return bool(subscription) and event in (subscription or {}).get("events", [])


def event_of(entry: Mapping[str, Any]) -> str:
    """A hold's history entry as a subscription's event (model.NOTICE_EVENTS)."""
    return EVENT_WORDS.get(entry["state"], str(entry["state"]))


def finished_tasks(rows: Iterable[Mapping[str, Any]]) -> dict[str, Counter[str]]:
    """The tasks whose transfers are all over, with their files per state, from the rows of
    the user's tasks view grouped by [user, task, state]."""
    states: dict[str, Counter[str]] = {}
    for row in rows:
        _, task, state = row["key"]
        states.setdefault(task, Counter())[state] += int(row["value"])
    final = set(model.FINAL[model.STATE])
    return {task: counts for task, counts in states.items() if set(counts) <= final}


def new_finished(
    finished: Mapping[str, Counter[str]], told: Mapping[str, float] | None
) -> list[str]:
    """The finished tasks not told yet; none on the first look at a user (told None): what
    was over before the notifier looked is not news."""
    if told is None:
        return []
    return sorted(task for task in finished if task not in told)


def told_tasks(
    finished: Mapping[str, Counter[str]],
    told: Mapping[str, float] | None,
    now: float,
    seen: Iterable[str],
) -> dict[str, float]:
    """The record of the user's tasks told: every finished task the view still shows (those
    over before the first look as 0), at most model.MAX_TOLD_TASKS, the newest names kept."""
    before = dict(told or {})
    record = {task: before.get(task, now if told is not None else 0.0) for task in finished}
    kept = sorted(set(record) & set(seen), reverse=True)[: model.MAX_TOLD_TASKS]
    return {task: record[task] for task in kept}


def task_notice(user: str, tasks: list[str], finished: Mapping[str, Counter[str]]) -> Notice:
    """One notice of a user's tasks whose transfers are over (all those of one look)."""
    lines = []
    for task in tasks[:20]:
        counts = ", ".join(f"{n} {state}" for state, n in sorted(finished[task].items()))
        lines.append(f"- {plain(task)}: {counts}")
    if len(tasks) > 20:
        lines.append(f"- and {len(tasks) - 20} more")
    lines.append("`aso status TASK` shows each file.")
    word = "task" if len(tasks) == 1 else f"{len(tasks)} tasks"
    title = f"ASO: the transfers of {plain(user)}'s {word} are over"
    return Notice(model.told_id(user), time.time(), title, "\n".join(lines))
