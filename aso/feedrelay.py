"""One changes feed per host: the feed relay that `aso run` runs for its agents.

Every agent keeps its work from the files database's `_changes` feed with the documents
(aso/workqueue.py). Six agents on a host each reading every change made the store read and
send every written document six times over: on CouchDB ~30 document reads per file at 16x
design, on the embedded store a fifth of its time in LevelDB gets (docs/performance.md). The
relay reads the feed once, with the documents, keeps the latest `agents.feed_relay_changes`
changes in memory (each serialised once; at most `agents.feed_relay_bytes` of them) and serves
them to the host's agents:

    GET /{db}/_relay_position                  → {"seq": the relay's latest position}
    GET /{db}/_changes?since=S&limit=N&timeout=MS
        → {"results": [...], "last_seq": ...}, as the store's `_changes` with include_docs,
          waiting up to MS for a change when there is none (a long poll);
          410 when S is no position the relay still holds (older than its memory, or a
          sequence the store gave someone else: CouchDB's are opaque and not comparable).

An agent takes its start position from the relay before it reads the queue view (as it takes
the store's sequence today: a change racing the view read is read again, harmlessly), then
follows the relay; a 410 makes it start again (view read, new position), and a relay that does
not answer makes it follow the store itself until the relay answers again. The relay listens on
loopback only and answers only the agent account of the config (basic authentication).
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, quote, urlsplit

import requests

from aso import limits
from aso.config import Config
from aso.store import ChangesBatch, Database, Server, StoreError

log = logging.getLogger("aso.feedrelay")

RELAY_ENV = "ASO_FEED_RELAY"  # `aso run` tells its agents where the relay is
FOLLOW_BATCH = limits.MAX_DOCS
FOLLOW_WAIT = 30.0  # seconds the relay's own long poll on the store waits
RETRY_RELAY = 10.0  # seconds an agent follows the store itself after the relay failed it


class FeedGap(Exception):
    """The relay no longer holds the position asked from: start again from its position."""


class Feed(Protocol):
    """Where an agent's work set reads the files database's changes."""

    def position(self) -> str: ...

    def changes(self, since: str, *, limit: int, wait: float | None = None) -> ChangesBatch: ...


@dataclass
class StoreFeed:
    """The store's own feed (what agents read without a relay)."""

    db: Database

    def position(self) -> str:
        return str(self.db.info().get("update_seq", "0"))

    def changes(self, since: str, *, limit: int, wait: float | None = None) -> ChangesBatch:
        return self.db.changes(since, limit=limit, include_docs=True, wait=wait)


# -- the relay -------------------------------------------------------------------------------------
class ChangeLog:
    """The latest changes, each kept as its JSON text, and where each position lies: at most
    `capacity` changes and `capacity_chars` characters of them (a user's large requests, each
    written ~4 times by the agents, had grown `aso run` by 900 MB within the count alone)."""

    def __init__(self, capacity: int, start: str, capacity_chars: int = 1 << 62):
        self.capacity = capacity
        self.capacity_chars = capacity_chars
        self.chars = 0  # of the changes kept
        self.entries: deque[tuple[str, str]] = deque()  # (seq, the change as JSON)
        self.first = 0  # absolute index of entries[0]
        self.positions: dict[str, int] = {start: -1}  # seq → absolute index of its change
        self.latest = start
        self.cond = threading.Condition()

    def append(self, results: list[dict[str, Any]], last_seq: str) -> None:
        with self.cond:
            for change in results:
                seq = str(change["seq"])
                index = self.first + len(self.entries)
                text = json.dumps(change, separators=(",", ":"))
                self.entries.append((seq, text))
                self.chars += len(text)
                self.positions[seq] = index
            if results:
                self.positions.setdefault(last_seq, self.first + len(self.entries) - 1)
                self.latest = last_seq
            # The latest change stays, whatever its size: the relay's position is after it.
            while len(self.entries) > 1 and (
                len(self.entries) > self.capacity or self.chars > self.capacity_chars
            ):
                seq, text = self.entries.popleft()
                self.chars -= len(text)
                self.positions.pop(seq, None)
                self.first += 1
            # Positions before the first change kept are gone (a start that saw no change too).
            if len(self.positions) > 2 * self.capacity + 16:
                self.positions = {s: i for s, i in self.positions.items() if i >= self.first - 1}
            self.cond.notify_all()

    def after(self, since: str, limit: int, wait: float) -> tuple[list[str], str]:
        """(changes as JSON after `since`, at most `limit`; the last one's seq), waiting up to
        `wait` seconds for one when there is none. FeedGap: `since` is not held."""
        deadline = time.monotonic() + wait
        with self.cond:
            while True:
                index = self.positions.get(since)
                if index is None or index < self.first - 1:
                    raise FeedGap(since)
                start = index + 1 - self.first
                if start < len(self.entries):
                    chosen = [
                        self.entries[i] for i in range(start, min(len(self.entries), start + limit))
                    ]
                    return [text for _, text in chosen], chosen[-1][0]
                left = deadline - time.monotonic()
                if left <= 0:
                    return [], since
                self.cond.wait(left)


class FeedRelay:
    """Follows the files database's feed (as the agent account) and serves it on loopback."""

    def __init__(self, config: Config, port: int = 0):
        self.config = config
        self.db = Server.from_config(config, account="agent").db(config.store.files_db)
        self.log: ChangeLog | None = None
        self.stop_event = threading.Event()
        agent = config.store
        token = base64.b64encode(f"{agent.agent_user}:{agent.agent_password}".encode()).decode()
        self.expected_auth = f"Basic {token}"
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.server.daemon_threads = True
        self.threads: list[threading.Thread] = []
        self.served = 0  # answers given (for the tests and the log)
        self.last_poll = time.monotonic()  # the follower's last answer from the store

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> None:
        """Serve at once (answering 503 until the follower has its start position: `aso run`
        must not wait on a store that does not answer) and follow."""
        for name, target in (("relay-follow", self._follow), ("relay-serve", self._serve)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self.threads.append(thread)
        log.info("feed relay at %s follows %s", self.url, self.db.name)

    def wait_ready(self, timeout: float = 30.0) -> bool:
        """Whether the relay follows the store within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self.following() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.following()

    def stop(self) -> None:
        self.stop_event.set()
        self.server.shutdown()
        self.server.server_close()

    def _position(self) -> str:
        while not self.stop_event.is_set():
            try:
                return str(self.db.info().get("update_seq", "0"))
            except StoreError as exc:
                log.warning("feed relay: the store does not answer (%s); trying again", exc)
                self.stop_event.wait(2.0)
        return "0"

    def _follow(self) -> None:
        agents = self.config.agents
        self.log = ChangeLog(agents.feed_relay_changes, self._position(), agents.feed_relay_bytes)
        self.last_poll = time.monotonic()
        since = self.log.latest
        while not self.stop_event.is_set():
            try:
                batch = self.db.changes(
                    since, limit=FOLLOW_BATCH, include_docs=True, wait=FOLLOW_WAIT
                )
            except StoreError as exc:
                log.warning("feed relay: the store's feed failed (%s); trying again", exc)
                self.stop_event.wait(2.0)
                continue
            except Exception:
                # A bug of ours must not end the host's feed: agents would read behind a
                # relay that no longer follows (they fall back only when it fails to answer).
                log.exception("feed relay: following the feed failed; trying again")
                self.stop_event.wait(2.0)
                continue
            self.log.append(batch.results, batch.last_seq)
            self.last_poll = time.monotonic()
            since = batch.last_seq

    def following(self) -> bool:
        """The follower had an answer from the store lately: what the relay holds is current."""
        started = self.log is not None
        return started and time.monotonic() - self.last_poll < 2 * FOLLOW_WAIT + 15.0

    def _serve(self) -> None:
        self.server.serve_forever(poll_interval=0.5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per agent request would swamp the log

            def do_GET(self) -> None:
                if not hmac.compare_digest(
                    self.headers.get("Authorization", ""), relay.expected_auth
                ):
                    self._answer(401, {"error": "unauthorized", "reason": "the agent account only"})
                    return
                parts = urlsplit(self.path)
                path = parts.path.strip("/").split("/")
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                if len(path) != 2 or path[0] != relay.db.name:
                    self._answer(404, {"error": "not_found", "reason": f"only {relay.db.name}"})
                    return
                if relay.log is None or not relay.following():
                    # Not started, or behind the store: agents read the store itself meanwhile.
                    self._answer(503, {"error": "behind", "reason": "not following the store"})
                    return
                if path[1] == "_relay_position":
                    self._answer(200, {"seq": relay.log.latest})
                    return
                if path[1] != "_changes":
                    self._answer(404, {"error": "not_found", "reason": "_changes only"})
                    return
                try:
                    limit = max(1, int(query.get("limit", FOLLOW_BATCH)))
                    wait = max(0.0, int(query.get("timeout", 0)) / 1000)
                    texts, last = relay.log.after(query["since"], limit, min(wait, 300.0))
                except (KeyError, ValueError):
                    self._answer(400, {"error": "bad_request", "reason": "since, limit, timeout"})
                    return
                except FeedGap:
                    self._answer(410, {"error": "gone", "reason": "position not held"})
                    return
                relay.served += 1
                body = '{"results":[' + ",".join(texts) + '],"last_seq":' + json.dumps(last) + "}"
                self._send(200, body.encode())

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                self._send(status, json.dumps(body).encode())

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


# -- an agent's side -------------------------------------------------------------------------------
class RelayFeed:
    """The relay's feed, with the store's as the fallback while the relay does not answer."""

    def __init__(self, url: str, db: Database, user: str, password: str, timeout: float = 60.0):
        self.base = f"{url.rstrip('/')}/{quote(db.name, safe='')}"
        self.store = StoreFeed(db)
        self.session = requests.Session()
        self.session.auth = (user, password)
        self.timeout = timeout
        self.relayed = True  # False: following the store until `retry_at`
        self.retry_at = 0.0

    def _get(self, path: str, **params: Any) -> Any:
        answer = self.session.get(
            f"{self.base}/{path}", params=params, timeout=(5.0, self.timeout + 10.0)
        )
        if answer.status_code == 410:
            raise FeedGap(params.get("since", ""))
        answer.raise_for_status()
        return answer.json()

    def _use_relay(self) -> bool:
        if not self.relayed and time.monotonic() >= self.retry_at:
            self.relayed = True
        return self.relayed

    def _relay_failed(self, exc: Exception) -> None:
        log.warning("feed relay %s failed (%s): following the store for a while", self.base, exc)
        self.relayed = False
        self.retry_at = time.monotonic() + RETRY_RELAY

    def position(self) -> str:
        if self._use_relay():
            try:
                return f"relay:{self._get('_relay_position')['seq']}"
            except (requests.RequestException, ValueError, KeyError) as exc:
                self._relay_failed(exc)
        return self.store.position()

    def changes(self, since: str, *, limit: int, wait: float | None = None) -> ChangesBatch:
        """A position taken from the relay is marked `relay:`; the store's is bare. Following
        one source's positions at the other is a FeedGap: the work set starts again."""
        relayed = since.startswith("relay:")
        if relayed != self._use_relay():
            # The relay failed (start again from the store), or the time to try it again has
            # come (start again from its position).
            raise FeedGap(since)
        if not relayed:
            return self.store.changes(since, limit=limit, wait=wait)
        timeout = min(wait or 0.0, self.timeout)
        try:
            answer = self._get(
                "_changes", since=since[len("relay:") :], limit=limit, timeout=int(timeout * 1000)
            )
        except (requests.RequestException, ValueError) as exc:
            self._relay_failed(exc)
            raise FeedGap(since) from None
        return ChangesBatch(
            answer.get("results", []),
            f"relay:{answer.get('last_seq', since[len('relay:') :])}",
            timed_out=not answer.get("results") and bool(wait),
        )


def feed_for(db: Database, config: Config, relay_url: str | None) -> Feed:
    """The relay's feed when `aso run` gave one (ASO_FEED_RELAY) and the agent talks to the
    store with a password; else the store's."""
    store = config.store
    if relay_url and store.auth == "password" and db.name == store.files_db:
        return RelayFeed(relay_url, db, store.agent_user, store.agent_password)
    return StoreFeed(db)


def start_relay(config: Config) -> FeedRelay | None:
    """The host's relay (`agents.feed_relay`), for `aso run`."""
    if not config.agents.feed_relay or config.store.auth != "password":
        return None
    relay = FeedRelay(config)
    relay.start()
    return relay
