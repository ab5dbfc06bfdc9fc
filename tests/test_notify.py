"""The notifier against real local servers: an SMTP server (aiosmtpd) and a webhook receiver
(an HTTP server) on free loopback ports, reached through apprise. Each event of a hold (held,
released, ...) is told once to every URL; one that could not be sent is told once it can be;
old events are passed over; a hold's user cannot make the notifier tell again; what a user
wrote reaches a notice without control characters."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time
from collections.abc import Iterator
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from aso import model
from aso.actions import end_hold
from aso.agents.notifier import Notifier
from aso.config import Config
from aso.core import holds, notices
from aso.runtime import Runner
from aso.store import Forbidden
from tests.conftest import db_as, sample_request

SITE = "T2_DE_DESY"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mailbox:
    """The SMTP server's handler: every message it was given."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(message_from_bytes(envelope.content))
        return "250 OK"


@pytest.fixture()
def smtp() -> Iterator[tuple[Mailbox, int]]:
    box, port = Mailbox(), free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()


class Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[HTTPServer]:
    """An HTTP server of `handler` on a free loopback port, stopped afterwards."""
    server = HTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def receiving(posted: list[dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    """A webhook receiver's handler: each JSON body posted, with its path, into `posted`."""

    class Receiver(Quiet):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            posted.append({"path": self.path, **json.loads(body)})
            self.send_response(200)
            self.end_headers()

    return Receiver


@pytest.fixture()
def webhook() -> Iterator[tuple[list[dict[str, Any]], HTTPServer]]:
    posted: list[dict[str, Any]] = []
    with serving(receiving(posted)) as server:
        yield posted, server


def notify_config(config: Config, smtp_port: int, hook_port: int) -> Config:
    mail = (
        f"mailto://127.0.0.1:{smtp_port}?smtp=127.0.0.1&mode=insecure"
        "&from=aso@localhost&to=operators@localhost"
    )
    return dataclasses.replace(
        config,
        notify=dataclasses.replace(
            config.notify,
            urls=[mail, f"json://127.0.0.1:{hook_port}/hooks/aso"],
            interval=0.01,
            min_interval=0.01,
        ),
    )


def step(config: Config) -> dict[str, Any]:
    notifier = Notifier(config, "n1")
    runner = Runner(notifier)
    report = runner.step(wait=False)
    notifier.close()
    return report


def start_hold(config: Config, accounts: Any, reason: str, user: str = "alice") -> dict[str, Any]:
    doc = holds.started(
        None, site=SITE, user=user, error_class="quota", reason=reason,
        path=f"/store/user/{user}/t", needs=1000, by="r-1", now=time.time(), config=config.holds,
    )  # fmt: skip
    assert doc is not None
    doc["_rev"] = db_as(accounts, "agent", config.store.files_db).put(doc)
    return doc


def test_each_event_of_a_hold_is_told_once_by_mail_and_webhook(sim_config, accounts, smtp, webhook):
    (box, smtp_port), (posted, hook) = smtp, webhook
    config = notify_config(sim_config, smtp_port, hook.server_address[1])
    # A reason the user's storage gave, with a terminal escape and a bidi override in it.
    start_hold(config, accounts, "quota exceeded \x1b[31m\u202eevil")
    assert step(config)["notices"] == 1
    [mail] = box.messages
    [hook_post] = posted
    title = f"ASO: alice's files held at {SITE}"
    assert mail["Subject"] == title == hook_post["title"]
    assert hook_post["path"] == "/hooks/aso" and mail["To"] == "operators@localhost"
    assert "quota exceeded ?\uff3b31m?evil" in hook_post["message"]
    assert "\x1b" not in hook_post["message"] and "\u202e" not in hook_post["message"]
    assert f"this one is {model.hold_id(SITE, 'alice')}" in hook_post["message"]
    # Told once: nothing new, nothing sent again.
    assert step(config)["notices"] == 0 and len(box.messages) == len(posted) == 1
    # Its user releases it: that is the next event.
    end_hold(db_as(accounts, "alice", config.store.files_db), SITE, "alice",
             model.HOLD_RELEASED, "space freed", "alice", time.time())  # fmt: skip
    assert step(config)["notices"] == 1
    assert posted[-1]["title"] == f"ASO: alice's files released at {SITE}"
    assert "space freed" in posted[-1]["message"] and len(box.messages) == 2


def test_a_user_s_mentions_and_links_reach_a_chat_as_plain_text(sim_config, accounts, webhook):
    """Red team round 32: `@channel` in a hold's reason paged every member of the operators'
    chat. A user's text reaches a chat (Mattermost's incoming webhook, as apprise posts it)
    with its mentions, links and code spans inert (rounds 33-37: emphasis, look-alikes, emoji
    shortcodes, a link with no scheme, blanks that are no space, combining marks)."""
    posted, hook = webhook
    port = hook.server_address[1]
    config = notify_config(sim_config, 0, port)
    config = dataclasses.replace(
        config, notify=dataclasses.replace(config.notify, urls=[f"mmost://127.0.0.1:{port}/tok"])
    )
    reason = ("@channel @here <!everyone> <@U42> [login](https://evil.example) `x "
              "http://evil.example/y www.evil.example/login **LEAKED** __now__ ~~ASO~~ "
              "www\u3002bad\uff0eexample\uff61org task_name evi\u217c.com/login "
              "grid-ss\u043e.ch/renew \uff45\uff56.org :warning: :x: "
              "//localhost:8080/x \u2800\u3164\u2800 R\u0336E\u0336L\u0336 "
              "hold:T2_DE_DESY:alice")  # fmt: skip
    start_hold(config, accounts, reason)
    assert step(config)["notices"] == 1
    [chat] = posted
    text = chat["text"]
    assert "Reason given:" in text and "channel" in text and "evil\u2024example" in text
    assert "evil.example" not in text  # no address a chat or a mail reader makes a link of
    assert text.count("channel") == 1  # the user's words once, labelled (round 34)
    for markup in ("@channel", "@here", "<!everyone>", "<@U42>", "[login](", "`x", "://",
                   "**", "__", "~~", "\u3002", "\uff0e", "\uff61", ".com", ".ch", ".org",
                   ":warning:", ":x:", "//", "\u2800", "\u3164", "\u1160",
                   "\u0336"):  # fmt: skip
        assert markup not in text, (markup, text)
    assert "REL" in text  # round 37: struck through by combining marks, shown plain
    # Look-alike letters taken as what they look like (NFKC): no dot of an address is left.
    assert "evil\u2024com" in text and "ev\u2024org" in text and "warning" in text
    assert "bad\u2024example\u2024org" in text and "task_name" in text  # a name keeps its _
    assert "\uff20channel" in text  # still readable: a look-alike of the character


def test_a_notice_not_sent_is_sent_once_it_can_be(sim_config, accounts, smtp):
    box, smtp_port = smtp
    down = free_port()  # nothing listens there
    config = notify_config(sim_config, down, free_port())
    config = dataclasses.replace(config, notify=dataclasses.replace(
        config.notify, urls=config.notify.urls[:1]))  # fmt: skip
    stored = start_hold(config, accounts, "quota exceeded")
    failed = step(config)
    assert (failed["notices"], failed["notice_failures"]) == (0, 1)
    db = db_as(accounts, "admin", config.store.files_db)
    assert "notified" not in db.get(stored["_id"])  # not recorded: tried again
    config = notify_config(sim_config, smtp_port, free_port())
    config = dataclasses.replace(config, notify=dataclasses.replace(
        config.notify, urls=config.notify.urls[:1]))  # fmt: skip
    assert step(config)["notices"] == 1 and len(box.messages) == 1
    assert db.get(stored["_id"])["notified"] == stored["at"]


def test_old_events_are_passed_over_and_a_user_cannot_have_them_told_again(
    sim_config, accounts, smtp, webhook
):
    (box, smtp_port), (posted, hook) = smtp, webhook
    config = notify_config(sim_config, smtp_port, hook.server_address[1])
    stored = start_hold(config, accounts, "quota exceeded")
    old = dataclasses.replace(config, notify=dataclasses.replace(config.notify, max_age=0.0))
    time.sleep(0.05)
    assert step(old)["notices"] == 0 and box.messages == posted == []
    assert step(config)["notices"] == 1  # within the hour: told
    alice = db_as(accounts, "alice", config.store.files_db)
    current = alice.get(stored["_id"])
    reset = holds.ended(current, model.HOLD_RELEASED, "again", "alice", time.time(), by_owner=True)
    reset["notified"] = 0
    with pytest.raises(Forbidden, match=r"\[hold\] notified is the agents' to change"):
        alice.put(reset)
    without = {k: v for k, v in reset.items() if k != "notified"}
    with pytest.raises(Forbidden, match=r"\[hold\] notified is the agents' to change"):
        alice.put(without)


def test_a_hold_released_and_held_again_in_a_loop_is_one_notice_and_keeps_nobody_waiting(
    sim_config, accounts, smtp, webhook
):
    """Round 32: alice released her own hold in a loop and admission held her file again at
    once: every event was a notice (87 in 89 s), and bob's release was told 169 s late behind
    them. A hold's events since its last notice are told in one, at most one per hold every
    `notify.min_interval` seconds; each hold has its turn in every cycle."""
    (box, smtp_port), (posted, hook) = smtp, webhook
    config = notify_config(sim_config, smtp_port, hook.server_address[1])
    config = dataclasses.replace(
        config, notify=dataclasses.replace(config.notify, min_interval=3600.0)
    )
    agent = db_as(accounts, "agent", config.store.files_db)
    alice = db_as(accounts, "alice", config.store.files_db)
    stored = start_hold(config, accounts, "no room")
    notifier = Notifier(config, "n1")
    runner = Runner(notifier)
    try:
        assert runner.step(wait=False)["notices"] == 1  # held: told
        for i in range(10):  # released by alice, held again by the agents, ten times
            end_hold(alice, SITE, "alice", model.HOLD_RELEASED, f"mine {i}", "alice", time.time())
            again = holds.started(
                agent.get(stored["_id"]), site=SITE, user="alice", error_class="quota",
                reason="no room", path="/store/user/alice/t", needs=1000, by="s-1",
                now=time.time(), config=config.holds,
            )  # fmt: skip
            assert again is not None
            agent.put(again)
        start_hold(config, accounts, "no room either", user="bob")
        report = runner.step(wait=False)
        # bob's hold is told at once; alice's twenty events wait for the hour, together.
        assert report["notices"] == 1 and posted[-1]["title"] == f"ASO: bob's files held at {SITE}"
        notifier.last_sent.clear()  # the hour has passed
        assert runner.step(wait=False)["notices"] == 1
        body = posted[-1]["message"]
        assert posted[-1]["title"] == f"ASO: alice's files held at {SITE}"
        assert "Before it since the last notice: held 9x, released 10x." in body, body
        assert runner.step(wait=False)["notices"] == 0
        assert len(posted) == len(box.messages) == 3
    finally:
        notifier.close()


def test_a_release_its_user_dated_back_is_told(sim_config, accounts, smtp, webhook):
    """Round 32: the store takes an owner's time up to a day behind its clock; a release dated
    half an hour back came before the last event told, and was never told. What comes after
    the last entry told is new, whatever its time."""
    (box, smtp_port), (posted, hook) = smtp, webhook
    config = notify_config(sim_config, smtp_port, hook.server_address[1])
    start_hold(config, accounts, "no room")
    assert step(config)["notices"] == 1
    alice = db_as(accounts, "alice", config.store.files_db)
    end_hold(alice, SITE, "alice", model.HOLD_RELEASED, "an hour ago", "alice", time.time() - 1800)
    assert step(config)["notices"] == 1
    assert posted[-1]["title"] == f"ASO: alice's files released at {SITE}"
    assert step(config)["notices"] == 0 and len(box.messages) == 2


# --- users' subscriptions ----------------------------------------------------------------------
def subscription(user: str, targets: list[tuple[str, str]], events: Any = None,
                 by: str | None = None) -> dict[str, Any]:  # fmt: skip
    return {"_id": model.subscription_id(user), "type": model.SUBSCRIPTION_TYPE, "user": user,
            "targets": [{"kind": k, "to": t} for k, t in targets],
            "events": list(model.NOTICE_EVENTS if events is None else events),
            "updated": round(time.time(), 3), "by": by or user}  # fmt: skip


def users_config(config: Config, smtp_port: int, hook_port: int) -> Config:
    """Users may be mailed at example.org through the local SMTP server and have their
    webhooks under http://127.0.0.1:<hook_port>/hooks/; no operator URL."""
    return dataclasses.replace(
        config,
        notify=dataclasses.replace(
            config.notify,
            urls=[],
            user_mail=f"mailto://127.0.0.1:{smtp_port}?smtp=127.0.0.1&mode=insecure"
            "&from=aso@localhost&to=operators@localhost",
            mail_domains=["example.org"],
            webhooks=[f"http://127.0.0.1:{hook_port}/hooks/"],
            interval=0.01,
            min_interval=0.01,
        ),
    )


def test_a_user_writes_their_own_subscription_and_no_one_else_s(sim_config, accounts):
    """The notify database's validation: a user writes notify:<self> only, recorded in their
    name, of the schema (one address per target, http(s) without user info, query or dot
    segments, at most MAX_TARGETS); the notifier's record is the agents'."""
    name = sim_config.store.notify_db
    alice, bob = db_as(accounts, "alice", name), db_as(accounts, "bob", name)
    hook = "https://hooks.example.org/hooks/abc"
    rev = alice.put(subscription("alice", [("mail", "alice@example.org"), ("webhook", hook)]))
    assert rev.startswith("1-")
    refused = {
        "another's": (bob, {**subscription("alice", [("mail", "b@example.org")], by="bob"),
                            "_rev": rev}),
        "in another's name": (bob, {**subscription("bob", []), "user": "alice"}),
        "recorded by another": (bob, subscription("bob", [], by="alice")),
        "the agents' record": (alice, {"_id": model.told_id("alice"), "type": model.TOLD_TYPE,
                                       "user": "alice", "tasks": {}, "updated": 1.0}),
        "another kind of document": (alice, {"_id": "x", "type": "subscription"}),
        "mail with a header": (bob, subscription("bob", [("mail", "b@example.org\r\nBcc: x@y.z")])),
        "two addresses": (bob, subscription("bob", [("mail", "b@example.org,c@example.org")])),
        "user info": (bob, subscription("bob", [("webhook", "https://hooks.example.org@evil.org/x")])),
        "a query": (bob, subscription("bob", [("webhook", "https://evil.org/x?u=http://in")])),
        "dot segments": (bob, subscription("bob", [("webhook", "https://h.example.org/hooks/../a")])),
        "escapes": (bob, subscription("bob", [("webhook", "https://h.example.org/%2e%2e/a")])),
        "another scheme": (bob, subscription("bob", [("webhook", "file:///etc/passwd")])),
        "a port out of range": (bob, subscription("bob", [("webhook", "http://h.example.org:99999/a")])),
        "too many": (bob, subscription("bob", [("mail", f"b{i}@example.org") for i in range(6)])),
        "twice": (bob, subscription("bob", [("mail", "b@example.org")] * 2)),
        "an unknown event": (bob, subscription("bob", [], events=["everything"])),
        "an unknown member": (bob, {**subscription("bob", []), "extra": 1}),
        "from the future": (bob, {**subscription("bob", []), "updated": time.time() + 86400}),
    }  # fmt: skip
    for case, (db, doc) in refused.items():
        with pytest.raises(Forbidden):
            db.put(doc)
            pytest.fail(f"{case}: stored")
    operator = db_as(accounts, "operator", name)
    current = alice.get(model.subscription_id("alice"))
    operator.put({**current, "targets": [], "by": "operator"})  # an operator's change for her
    agent = db_as(accounts, "agent", name)
    with pytest.raises(Forbidden):
        agent.put({**alice.get(model.subscription_id("alice")), "targets": [], "by": "agent"})
    agent.put({"_id": model.told_id("alice"), "type": model.TOLD_TYPE, "user": "alice",
               "tasks": {"t": 1.0}, "updated": 1.0})  # fmt: skip


def drain(notifier: Notifier) -> None:
    notifier.pool.shutdown(wait=True)


def user_step(config: Config) -> dict[str, Any]:
    """One notifier cycle, its users' notices sent before it returns."""
    notifier = Notifier(config, "n1")
    report = Runner(notifier).step(wait=False)
    drain(notifier)
    report["user_notices"] += notifier.user_counts["sent"]
    report["user_notice_failures"] += notifier.user_counts["failed"]
    notifier.close()
    return report


def test_a_user_is_told_of_their_holds_where_the_operator_allows_and_nowhere_else(
    sim_config, accounts, smtp, webhook
):
    """alice's hold is told to her subscribed mail and Mattermost hook; not to an address the
    operator does not list (another port of this host: no SSRF), nor to a domain not listed;
    bob's hold is not told to alice; an event she did not subscribe to is not told."""
    (box, smtp_port), (posted, hook) = smtp, webhook
    port = hook.server_address[1]
    stray: list[dict[str, Any]] = []
    with serving(receiving(stray)) as other:
        stray_port = other.server_address[1]
        config = users_config(sim_config, smtp_port, port)
        notify = db_as(accounts, "alice", config.store.notify_db)
        notify.put(subscription("alice", [
            ("mail", "alice@example.org"),
            ("mattermost", f"http://127.0.0.1:{port}/hooks/alicetoken"),
            ("webhook", f"http://127.0.0.1:{stray_port}/hooks/x"),  # not under notify.webhooks
            ("mail", "alice@evil.org"),  # not of notify.mail_domains
        ], events=["held", "expired"]))  # fmt: skip
        start_hold(config, accounts, "quota exceeded")
        start_hold(config, accounts, "bob's quota", user="bob")
        report = user_step(config)
        assert report["user_notices"] == 1 and report["user_notice_failures"] == 0
        [mail] = box.messages
        assert mail["To"] == "alice@example.org"
        assert mail["Subject"] == f"ASO: alice's files held at {SITE}"
        [chat] = posted
        assert chat["path"] == "/hooks/alicetoken" and "quota exceeded" in chat["text"]
        assert "bob" not in chat["text"]
        # Released: not an event she subscribed to.
        end_hold(db_as(accounts, "alice", config.store.files_db), SITE, "alice",
                 model.HOLD_RELEASED, "space freed", "alice", time.time())  # fmt: skip
        assert user_step(config)["user_notices"] == 0
        assert len(box.messages) == len(posted) == 1
    assert stray == []


def put_files(config: Config, accounts: Any, task: str, states: list[str]) -> list[dict[str, Any]]:
    """Requests of alice's task in these states, written as the store's admin writes them."""
    docs = [{**sample_request("alice", task=task), "state": state} for state in states]
    admin = db_as(accounts, "admin", config.store.files_db)
    for doc in docs:
        doc["_rev"] = admin.put(doc)
    return docs


def test_a_user_is_told_once_when_the_transfers_of_a_task_are_over(sim_config, accounts, webhook):
    """A task whose files are all done, failed or killed is told once to its user's
    subscription; tasks over before the notifier first looked are not news."""
    posted, hook = webhook
    port = hook.server_address[1]
    config = users_config(sim_config, free_port(), port)
    db_as(accounts, "alice", config.store.notify_db).put(subscription(
        "alice", [("mattermost", f"http://127.0.0.1:{port}/hooks/t0ken")], events=["task_done"]
    ))  # fmt: skip
    put_files(config, accounts, "261201_000000:alice_crab_old", ["done", "done"])
    assert user_step(config)["user_notices"] == 0  # the first look: what is over is old news
    record = db_as(accounts, "agent", config.store.notify_db).get(model.told_id("alice"))
    assert record["tasks"] == {"261201_000000:alice_crab_old": 0.0}
    task = "261207_000000:alice_crab_new"
    docs = put_files(config, accounts, task, ["done", "submitted", "failed"])
    assert user_step(config)["user_notices"] == 0 and posted == []  # one still on its way
    admin = db_as(accounts, "admin", config.store.files_db)
    admin.put({**docs[1], "state": "killed"})
    assert user_step(config)["user_notices"] == 1
    [chat] = posted
    assert "are over" in chat["text"] and "1 done, 1 failed, 1 killed" in chat["text"]
    assert task in chat["text"] and "crab_old" not in chat["text"]
    assert user_step(config)["user_notices"] == 0 and len(posted) == 1  # told once


def test_a_user_s_hanging_webhook_keeps_no_other_notice_waiting(sim_config, accounts, webhook):
    """alice's allowed webhook accepts and never answers: the operators' notices of the same
    cycle are sent while her request hangs (a user's targets are told from threads of their
    own), and the notifier gives it up after its timeout."""
    posted, operators = webhook
    entered, release = threading.Event(), threading.Event()
    told_meanwhile: list[int] = []

    class Hanging(Quiet):
        def do_POST(self) -> None:
            entered.set()
            # What the operators got while this request is open (the notifier's 4 s).
            deadline = time.monotonic() + 3
            while len(posted) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            told_meanwhile.append(len(posted))
            release.wait(30)

    with serving(Hanging) as hanging:
        hook = f"http://127.0.0.1:{hanging.server_address[1]}/hooks/"
        config = dataclasses.replace(sim_config, notify=dataclasses.replace(
            sim_config.notify, urls=[f"json://127.0.0.1:{operators.server_address[1]}/ops"],
            webhooks=[hook], interval=0.01, min_interval=0.01,
        ))  # fmt: skip
        db_as(accounts, "alice", config.store.notify_db).put(
            subscription("alice", [("webhook", hook + "a")])
        )
        start_hold(config, accounts, "alice's quota")
        start_hold(config, accounts, "bob's quota", user="bob")
        notifier = Notifier(config, "n1")
        try:
            report = Runner(notifier).step(wait=False)
            assert report["notices"] == 2 and len(posted) == 2
            assert entered.wait(10)
            deadline = time.monotonic() + 5
            while not told_meanwhile and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            release.set()
            notifier.close()
    assert told_meanwhile == [2]  # both operators' notices, while alice's request hung
    assert notifier.user_counts["failed"] == 1  # given up after its timeout


def test_documents_of_other_shapes_in_the_notify_database_stop_no_notice(
    sim_config, accounts, webhook
):
    """The store's admin writes past the validation: subscriptions and a record of other
    shapes are passed over, and a user's good subscription is told as ever."""
    posted, hook = webhook
    port = hook.server_address[1]
    config = users_config(sim_config, free_port(), port)
    admin = db_as(accounts, "admin", config.store.notify_db)
    for doc in ({"_id": "notify:carol", "type": model.SUBSCRIPTION_TYPE, "user": "carol",
                 "targets": "x", "events": ["held"]},
                {"_id": "notify:dave", "type": model.SUBSCRIPTION_TYPE, "targets": [{}]},
                {**subscription("erin", [("webhook", f"http://127.0.0.1:{port}/hooks/e")]),
                 "_id": "notify:alice"},
                {"_id": model.told_id("bob"), "type": model.TOLD_TYPE, "tasks": [1]}):  # fmt: skip
        admin.put(doc)
    db_as(accounts, "bob", config.store.notify_db).put(
        subscription("bob", [("webhook", f"http://127.0.0.1:{port}/hooks/b")])
    )
    start_hold(config, accounts, "bob's quota", user="bob")
    start_hold(config, accounts, "alice's quota")
    report = user_step(config)
    assert report["user_notices"] == 1
    assert [p["path"] for p in posted] == ["/hooks/b"]


def test_one_user_s_subscription_that_fails_the_notifier_keeps_no_one_else_untold(
    sim_config, accounts, webhook, monkeypatch
):
    """Red team round 33: a subscription the store took (a port past 65535) made every cycle
    fail before the others' notices. Each hold and each user's tasks are told on their own:
    whatever one of them raises, the others of the cycle are told, and the port is refused."""
    posted, hook = webhook
    port = hook.server_address[1]
    config = users_config(sim_config, free_port(), port)
    admin = db_as(accounts, "admin", config.store.notify_db)
    admin.put(subscription("alice", [("webhook", "http://127.0.0.1:99999/hooks/a")]))  # pre-fix
    db_as(accounts, "bob", config.store.notify_db).put(
        subscription("bob", [("webhook", f"http://127.0.0.1:{port}/hooks/b")])
    )
    start_hold(config, accounts, "alice's quota")
    start_hold(config, accounts, "bob's quota", user="bob")
    real = notices.apprise_url

    def failing(kind: str, to: str, settings: Any) -> str:
        if "/hooks/b" not in to:
            raise RuntimeError("a document no one foresaw")
        return real(kind, to, settings)

    monkeypatch.setattr(notices, "apprise_url", failing)
    report = user_step(config)
    assert report["user_notices"] == 1 and [p["path"] for p in posted] == ["/hooks/b"]
    assert notices.refusal("webhook", "http://127.0.0.1:99999/hooks/a", config.notify)


def test_a_user_s_trickling_webhook_is_cut_at_its_deadline_and_waits(
    sim_config, accounts, webhook, monkeypatch
):
    """Red team round 33: a webhook answering a byte every few seconds never tripped the
    socket timeouts and held a thread (and apprise's) 60 s a notice. A user's notice is told
    by a process of its own, ended at USER_DEADLINE; that user's next notices wait
    USER_BACKOFF (dropped, counted) and nobody else's do."""
    from aso.agents import notifier as notifier_module

    monkeypatch.setattr(notifier_module, "USER_DEADLINE", 5.0)
    posted, hook = webhook
    stop = threading.Event()

    class Trickle(Quiet):
        def do_POST(self) -> None:
            self.wfile.write(b"H")
            while not stop.wait(0.5):
                self.wfile.write(b"T")

    with serving(Trickle) as trickle:
        trickling = f"http://127.0.0.1:{trickle.server_address[1]}/hooks/"
        good = f"http://127.0.0.1:{hook.server_address[1]}/hooks/"
        config = dataclasses.replace(sim_config, notify=dataclasses.replace(
            sim_config.notify, webhooks=[trickling, good], interval=0.01, min_interval=0.01,
        ))  # fmt: skip
        for user, hook_url in (("alice", trickling + "a"), ("bob", good + "b")):
            db_as(accounts, user, config.store.notify_db).put(
                subscription(user, [("webhook", hook_url)])
            )
            start_hold(config, accounts, f"{user}'s quota", user=user)
        notifier = Notifier(config, "n1")
        try:
            Runner(notifier).step(wait=False)
            drain_sends(notifier)
            assert notifier.user_counts == {"sent": 1, "failed": 1, "dropped": 0}
            assert [p["path"] for p in posted] == ["/hooks/b"]
            end_hold(db_as(accounts, "alice", config.store.files_db), SITE, "alice",
                     model.HOLD_RELEASED, "again", "alice", time.time())  # fmt: skip
            Runner(notifier).step(wait=False)  # her next notice, within her backoff
            assert notifier.user_counts["dropped"] == 1 and not notifier.senders
        finally:
            stop.set()
            notifier.close()
    assert not notifier.senders


def drain_sends(notifier: Notifier, seconds: float = 30) -> None:
    """Wait until the users' queued notices are told (or given up)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with notifier.lock:
            if not notifier.user_queues and not notifier.senders:
                return
        time.sleep(0.05)


def test_a_site_s_hold_is_told_to_the_subscribed_users_whose_files_wait_there(
    sim_config, accounts, webhook
):
    """A site that stopped answering holds every user's files there: each subscribed user
    with files waiting to start from or to it is told; a subscribed user with none is not."""
    posted, hook = webhook
    port = hook.server_address[1]
    config = users_config(sim_config, free_port(), port)
    for user in ("alice", "bob"):
        db_as(accounts, user, config.store.notify_db).put(
            subscription(user, [("webhook", f"http://127.0.0.1:{port}/hooks/{user}")])
        )
    db_as(accounts, "alice", config.store.files_db).create(
        sample_request("alice", destination=SITE)
    )
    db_as(accounts, "bob", config.store.files_db).create(
        sample_request("bob", source="T2_IT_Pisa", destination="T2_UK_ICL")
    )
    doc = holds.started(
        None, site=SITE, user="", error_class="timeout", reason="no answer",
        path="/store/user", needs=0, by="r-1", now=time.time(), config=config.holds,
    )  # fmt: skip
    assert doc is not None
    db_as(accounts, "agent", config.store.files_db).put(doc)
    assert user_step(config)["user_notices"] == 1
    [told] = posted
    assert told["path"] == "/hooks/alice" and f"every user's files held at {SITE}" in told["title"]


def test_a_busy_host_s_slow_start_of_a_notice_is_not_held_against_its_user(
    sim_config, accounts, webhook, monkeypatch
):
    """Red team round 34: on a loaded host a notice's process took 6-15 s to start (an
    interpreter, apprise), counted against its user's 10 s: ordinary users were cut and made to
    wait 15 minutes. The deadline runs from the sender's `ready`."""
    import sys

    from aso.agents import notifier as notifier_module

    slow_start = ("import time, runpy; time.sleep(3); "
                  "runpy.run_module('aso.notify_send', run_name='__main__')")  # fmt: skip
    monkeypatch.setattr(notifier_module, "SENDER", [sys.executable, "-c", slow_start])
    monkeypatch.setattr(notifier_module, "USER_DEADLINE", 2.0)
    posted, hook = webhook
    port = hook.server_address[1]
    config = users_config(sim_config, free_port(), port)
    db_as(accounts, "alice", config.store.notify_db).put(
        subscription("alice", [("webhook", f"http://127.0.0.1:{port}/hooks/a")])
    )
    start_hold(config, accounts, "alice's quota")
    notifier = Notifier(config, "n1")
    Runner(notifier).step(wait=False)
    drain_sends(notifier)
    assert notifier.user_counts == {"sent": 1, "failed": 0, "dropped": 0}
    assert not notifier.backoff_until and [p["path"] for p in posted] == ["/hooks/a"]
    notifier.close()


def test_a_sender_s_two_answers_written_together_are_read_as_two() -> None:
    """Round 36: `ready` and `sent` reaching the pipe together were read by one buffered
    readline, and the second wait saw nothing until the sender's exit (past the deadline: a
    notice told was counted late and its user muted). Each line is read alone."""
    import subprocess
    import sys

    from aso.agents.notifier import _said

    both = (
        "import sys, time; sys.stdout.write('ready\\nsent\\n'); sys.stdout.flush(); time.sleep(30)"
    )
    process = subprocess.Popen([sys.executable, "-c", both], stdout=subprocess.PIPE, bufsize=0)
    try:
        assert _said(process, 30) == "ready"
        started = time.monotonic()
        assert _said(process, 10) == "sent"
        assert time.monotonic() - started < 5  # not at the sender's exit, 30 s on
    finally:
        process.kill()
        process.wait()
