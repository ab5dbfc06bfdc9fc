"""`aso frontend`: the X.509 front end, the only public entrance to the document store.

A Twisted HTTPS server. Every request must come with a client certificate or proxy
(aso.grid.x509auth checks the chain against the grid CA directory, CRLs included); the end-entity DN
is mapped to a store user and roles by a grid-mapfile (`GridMap`); the request then goes to the
store carrying that identity and no other:

* `auth = "proxy"` (a real CouchDB): CouchDB proxy authentication, X-Auth-CouchDB-UserName /
  -Roles / -Token, the token an HMAC of the name with the secret the store shares;
* `auth = "session"` (the embedded store, which ignores proxy-auth headers): each mapped user
  has a store account whose password is an HMAC of its name with the front end's secret, made
  (or its roles brought up to date) by the front end with the admin account the first time the
  user comes; the request carries that account's Basic credentials.

Either way the store sees the real user in `userCtx`, so `validate_doc_update` and `_security`
decide what the user may do. Whatever identity a client sends itself (Authorization, Cookie,
X-Auth-CouchDB-*, X-Forwarded-*) is dropped first, and cookies the store hands out are not passed
back. Responses are streamed as they come (the `_changes` feed).

Refusals are JSON answers in CouchDB's shape: 401 for a missing or bad certificate, 403 for a DN
no one mapped, 413 for a body over `frontend.max_body` however it is framed (`_BoundedRequest`),
400/403/404/405 for what the route table does not hold (aso/frontend/routes.py, matched by
aso/frontend/gate.py), 502 when the store is unreachable. What is forwarded is the gate's
`Forward`: a store request made anew from the typed form of the client's (path, query, body), never
the client's bytes.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import faulthandler
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import re
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from resource import RLIM_INFINITY, RLIMIT_NOFILE, getrlimit, setrlimit
from typing import Any, BinaryIO, Protocol, TypeVar, cast
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.x509.oid import NameOID
from OpenSSL import SSL
from prometheus_client.twisted import MetricsResource
from twisted.internet import defer, protocol, task, threads
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IHandshakeListener, IOpenSSLContextFactory
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool
from twisted.web import client, http, resource, server
from twisted.web.client import FileBodyProducer
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer
from zope.interface import implementer

from aso import limits, metrics, model, upload
from aso.config import Config, FrontendConfig
from aso.frontend import gate, routes, sequences
from aso.frontend import shared as shared_reads
from aso.frontend.bodychecks import Asked, BodyChecks, Stopped, give_back_memory
from aso.grid.x509auth import (
    MAX_CHAIN,
    Identity,
    Refused,
    TrustStore,
    key_fault,
    verify_chain,
)
from aso.provision import storejs
from aso.provision.designdocs import PAGES_DDOC
from aso.store import Server

log = logging.getLogger("aso.frontend")
T = TypeVar("T")

# The client's headers that go on to the store: those that ask for a representation. Every
# other is dropped (Authorization, Cookie, X-Auth-CouchDB-*, X-Forwarded-* would claim an
# identity; the body's type and length are the front end's own).
KEPT_HEADERS = {b"accept", b"if-none-match", b"if-modified-since", b"user-agent"}
KNOWN_ROLES = (model.USER_ROLE, model.AGENT_ROLE, "aso-admin")
# A grid user's name: a CMS user name. No dot (a name `alice.x` would own alice's
# /store/temp/user/alice.x/), no `_` (a name `alice_x` would own alice's tasks, and `_` starts
# the store's own names).
USER_NAME_PATTERN = r"^[A-Za-z0-9-]{1,128}$"
# The store's answer headers a client is given: its framing is each hop's own (RFC 9110
# 7.6.1), and what names the store's software, its cookies and request ids are the store's.
STORE_ANSWER_HEADERS = {b"content-type", b"etag", b"cache-control", b"last-modified",
                        b"location", b"content-security-policy"}  # fmt: skip
BODY = (b"POST", b"PUT", b"PATCH")  # methods whose (even empty) body is sent on
STORE_CONNECTIONS = 64  # idle kept-alive connections to the store
POLL_GRACE = 1.0  # seconds a store has past a long poll's timeout to end it itself
LINGER = 2.0  # seconds a connection is read (and dropped) after a 413 or 503 sent mid-body
BODY_RETRY_AFTER = 5  # seconds a client refused for want of room for its body is told to wait
BODY_BUSY = (
    "the front end holds as many request bodies as it takes, of this client or in all: try "
    "again later"
)
REFUSALS_TOLD_EVERY = 10.0  # seconds between WARNING lines of one kind of refusal (_Refusals)
# A request's reads (TLS records) and a body's chunks: past the first FINE_PIECES_ALLOWED,
# they must average FINEST_PIECES bytes (_too_fine).
FINE_PIECES_ALLOWED = 1024
FINEST_PIECES = 64
POOL_IDLE = 4  # seconds a kept-alive store connection may idle
WRITES = ("write", "create")  # route kinds that write (aso.frontend.routes.Route.kind)
WRITES_PER_USER = 2  # a user's writes sent to the store at once (FrontEnd._write_slot)
READS = ("read", "poll")  # route kinds that read (a poll without poll_ms is a batch)
# A user's light reads sent to the store at once (FrontEnd._read_slot): the embedded store runs
# one view's reads one after another, and 64 of one user's pages at once had kept bob's reads of
# that view waiting 3-10 s behind them.
READS_PER_USER = 4
PACED_USERS = 10_000  # users whose written documents Pace remembers before it forgets some
CHECKS_PER_USER = 4  # a user's requests checked by the gate at once (FrontEnd._check)
CHAIN_CHECKS = 4  # threads that check certificate chains
TRIM_AFTER_CLOSED = 256  # connections closed (and half of the most open) before memory is trimmed
HEAVY_READS = 2  # heavy reads (documents, a reduce, no limit: aso/frontend/gate.py) sent at once
# A user's reads carrying documents wait for each other: two of one user's had held both slots
# and another's waited 90 s. One that waits longer than this for its slot gets a 503.
HEAVY_WAIT = 30.0
STOP_GRACE = 10.0  # seconds the front end may take to stop before it is made to (serve)
HEAVY_HOLD = 60.0  # seconds a read with documents may take to go out before it is cut
# Operators' and agents' heavy reads have slots of their own: two users' grouped reads, 29 s
# each on the embedded store, sent back to back, had kept an operator's waiting 24-28 s.
SERVICE_HEAVY_READS = 2
# Seconds of the store's work a user's heavy read may take before its answer starts: then its
# client is refused (the turn is kept until the store has answered: FrontEnd._bound_work).
USER_HEAVY_WORK = 20.0
HEAVY_STORE_CAP = 300.0  # seconds a user's heavy read holds its turn for a store that never answers
# A user's heavy reads hold the store at most HEAVY_SHARE of the time: the seconds each took at
# the store are spent from an allowance of at most HEAVY_BURST, refilled at HEAVY_SHARE a second
# (FrontEnd._heavy_paced). One user's grouped reads of a whole view, 8-14 s each, one after the
# other in the user's turn, had held that view for everyone on the embedded store (bob's reads
# of it p50 0.05 → 13 s). A read that would wait longer than HEAVY_WAIT is refused, with when.
HEAVY_SHARE = 0.25
HEAVY_BURST = 20.0
# The bytes of a user's reads with documents (batches, reads by keys, long polls: a long poll
# answers at once from an old `since`, as a batch would) are spent from the user's heavy share,
# one second of the store's time per DOC_BYTES, beside the time the store took to start its
# answer (the embedded store answered ~110 MB of large requests a second: four such polls had
# kept it 85 % busy, round 24; reads by keys 57 MB/s, round 26).
DOC_BYTES = 8 << 20
SPENT_REASON = (
    "this user's heavy reads have held the store {share:.0%} of the time, their share: the "
    "next may go in {wait:.0f} s (ask for less at once: a narrower key range, a limit)"
)
# A user's other reads and long polls hold the store at most LIGHT_SHARE of the time too: each
# spends LIGHT_COST (a long poll POLL_COST) of an allowance of at most LIGHT_BURST seconds,
# refilled at LIGHT_SHARE a second, before it goes, and a read what it took at the store beyond
# that once answered (FrontEnd._light_paced). Four at a time and never charged, one user's
# pages of 1,000 rows and polls that end at once had kept the embedded store ~100 % busy (bob's
# page 75 times slower, round 28); a status client's long poll a minute costs nothing of it.
LIGHT_SHARE = 0.25
LIGHT_BURST = 20.0
LIGHT_COST = 0.005
POLL_COST = 0.05
LIGHT_SPENT_REASON = (
    "this user's reads have held the store {share:.0%} of the time, their share: the next may "
    "go in {wait:.0f} s (ask less often: pages with a larger limit, long polls with a longer "
    "timeout)"
)
USER_HEAVY_WORK_REASON = (
    "this read takes the store longer than a user's heavy read may ({:g} s) and was stopped: "
    "ask for less at once (a narrower key range, a limit, a group_level)"
)
# A body over BIG_BODY is parsed (and, for a write, sent and answered) while it holds one of
# BIG_BODIES slots, in its user's turn: 14 bodies of 58 MiB parsed at once had grown the front
# end by 5 GB. Smaller ones never wait.
BIG_BODY = 1 << 20
BIG_BODIES = 2
# A long poll's answer is held whole before it goes out (aso.frontend.gate bounds its rows, not
# bytes).
MAX_POLL_BYTES = 64 << 20
# What the front end reads of the stored requests to explain a write's conflicts (the same
# request, or a different file): past it, the conflicts are told as the store told them.
EXPLAIN_BYTES = 4 << 20
NODES_REFRESH = 10.0  # seconds between two readings of the store's node names (a `since`'s)
REVERIFY = 60.0  # seconds a TLS connection's verified chain is trusted before it is checked again


class MapfileError(Exception):
    pass


class TooManyConnections(Exception):
    """A user holds as many connections as one may: 503 to the requests of one more."""


def chain_refusal(failure: Failure) -> tuple[int, str, str]:
    """How a client whose chain check failed is answered: (status, error, reason)."""
    if isinstance(failure.value, Refused):
        return failure.value.status, "unauthorized", failure.value.reason
    if isinstance(failure.value, TooManyConnections):
        return 503, "busy", str(failure.value)
    return 500, "internal_error", "the client's certificate could not be checked"


class Busy(Exception):
    """The store's share for this kind of request is taken for longer than a client should wait."""


class Spent(Exception):
    """A user's heavy reads (or their other reads: `reason` LIGHT_SPENT_REASON) have had their
    share of the store's time: the next may go in `seconds`."""

    def __init__(self, seconds: float, reason: str = SPENT_REASON, share: float = HEAVY_SHARE):
        super().__init__(seconds)
        self.seconds, self.reason, self.share = seconds, reason, share


class Slots:
    """Few of one kind of costly work at a time: a user's wait for each other (a queue of
    `each` per user: two of one user's had held both slots and another's waited 90 s), then,
    when `shared`, for one of `size` slots. A wait longer than `wait` (HEAVY_WAIT) fails with
    Busy."""

    def __init__(self, reactor: Any, size: int, what: str, each: int = 1, for_services: int = 0):
        """`for_services`: slots of the service's own (agents, operators), beside the `size`
        the users share (0: they share those)."""
        self.reactor, self.what, self.each = reactor, what, each
        self.shared = defer.DeferredSemaphore(size)
        self.services = defer.DeferredSemaphore(for_services) if for_services else self.shared
        self.of: dict[str, defer.DeferredSemaphore] = {}  # a user's own queue, while in use

    def take(
        self, name: str, shared: bool = True, wait: float = HEAVY_WAIT, service: bool = False
    ) -> defer.Deferred[Callable[[], None]]:
        """Fires with the Turn that gives the slot back, or fails with Busy. `service`: the
        caller is an agent or an operator (their own slots, when there are)."""
        mine = self.of.setdefault(name, defer.DeferredSemaphore(self.each))
        pool = self.services if service else self.shared
        turn = Turn(self, name, pool)

        def given_up(failure: Any) -> Any:
            turn()  # the wait was cancelled where it was; what it held is given back
            if failure.check(defer.TimeoutError):
                raise Busy(f"{self.what} are busy; try again in a while (a user's wait their "
                           f"turn, at most {wait:g} s)")  # fmt: skip
            return failure

        waited: defer.Deferred[Any] = mine.acquire()
        waited.addCallback(lambda _: turn.held.append(mine))
        if shared:
            waited.addCallback(lambda _: pool.acquire())
            waited.addCallback(lambda _: turn.held.append(pool))
        waited.addCallback(lambda _: turn)
        waited.addTimeout(wait, self.reactor)
        waited.addErrback(given_up)
        return waited

    def take_for(
        self,
        request: server.Request,
        name: str,
        shared: bool = True,
        wait: float = HEAVY_WAIT,
        service: bool = False,
    ) -> defer.Deferred[Callable[[], None]]:
        """`take`, for a request: its wait ends when its client leaves (it had kept its place
        in the queue, ahead of its user's next requests, until its time was out)."""
        if _client_gone(request):  # notifyFinish would never fire: nothing would give it back
            return defer.fail(defer.CancelledError(f"{self.what}: the client has left"))
        slot = self.take(name, shared, wait, service)
        request.notifyFinish().addErrback(lambda _: slot.cancel())
        return slot


class Turn:
    """A turn of Slots: called, all it holds is given back (once, however often it is called);
    `share_back()` gives back its shared slot alone, its user's queue kept (the store's work is
    done, its answer not yet read by the client)."""

    def __init__(self, slots: Slots, name: str, pool: defer.DeferredSemaphore):
        self.slots, self.name, self.pool = slots, name, pool
        self.held: list[defer.DeferredSemaphore] = []

    def __call__(self) -> None:
        while self.held:
            self.held.pop().release()
        mine = self.slots.of.get(self.name)
        if mine is not None and mine.tokens == mine.limit and not mine.waiting:
            self.slots.of.pop(self.name, None)

    def share_back(self) -> None:
        if self.pool in self.held:
            self.held.remove(self.pool)
            self.pool.release()

    @property
    def shares(self) -> bool:
        """It holds a slot the users share."""
        return self.slots.shared in self.held and self.pool is self.slots.shared


class Pace:
    """A user's costs paced to `rate` a second on average (documents written; seconds of the
    store's time for heavy reads): a cost of n goes once the user's allowance (at most `burst`,
    refilled at `rate` a second) holds min(n, burst), and spends n. The store validates and
    indexes each document (the embedded store in its one thread): a user's 1,000-document bulk
    writes, two at a time, had slowed bob's reads 60 times."""

    def __init__(self, clock: Any, rate: float, burst: float):
        self.clock, self.rate, self.burst = clock, rate, burst
        self.of: dict[str, tuple[float, float]] = {}  # a user's allowance, and when

    def delay(self, name: str, documents: float) -> float:
        """Seconds until a write of `documents` of the user's may go (the allowance is spent
        now: the caller waits that long, then writes)."""
        now = float(self.clock.seconds())
        allowance, at = self.of.get(name, (float(self.burst), now))
        allowance = min(float(self.burst), allowance + (now - at) * self.rate)
        wait = max(0.0, (min(documents, self.burst) - allowance) / self.rate)
        self.of[name] = (allowance + wait * self.rate - documents, now + wait)
        if len(self.of) > PACED_USERS:  # users whose allowance is full again are forgotten
            self.of = {n: (a, t) for n, (a, t) in self.of.items()
                       if a + (now - t) * self.rate < self.burst}  # fmt: skip
        return wait


def _store_busy(_cancelled: Any, timeout: float) -> Any:
    """addTimeout's `onTimeoutCancel` (called only once the time is out, with however the
    cancelled call failed): a store answer that did not come in time is Busy."""
    raise Busy(f"the document store did not answer within {timeout:g} s; try again later")


@dataclass(frozen=True)
class Mapped:
    name: str
    roles: tuple[str, ...]


class GridMap:
    """DN → user and roles, from a grid-mapfile: one line per DN, `"DN" user [role,...]`
    (default role aso-user), `#` comments. Read again when the file changes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._mtime: int | None = None
        self._map: dict[str, Mapped] = {}
        self.lookup("")  # a broken file is an error at start, not at the first request

    @staticmethod
    def parse(text: str, where: str = "mapfile") -> dict[str, Mapped]:
        out: dict[str, Mapped] = {}
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                words = shlex.split(line)
            except ValueError as error:
                raise MapfileError(f"{where}:{number}: {error}") from None
            if len(words) not in (2, 3) or not words[0].startswith("/"):
                raise MapfileError(f'{where}:{number}: expected "DN" user [role,...]')
            roles = tuple(words[2].split(",")) if len(words) == 3 else (model.USER_ROLE,)
            unknown = [r for r in roles if r not in KNOWN_ROLES and not storejs.granted_groups([r])]
            if unknown:
                known = f"{', '.join(KNOWN_ROLES)}, {model.GROUP_ROLE}<group>"
                raise MapfileError(f"{where}:{number}: unknown role {unknown[0]!r} ({known})")
            if not re.match(USER_NAME_PATTERN, words[1]):
                raise MapfileError(
                    f"{where}:{number}: {words[1]!r} is not a user name (letters, digits and -; "
                    "no dot: /store/temp/user/<name>.<hash>/ is the user's temporary area; no _: "
                    "a task <time>:<name>_<...> is the user's)"
                )
            out[words[0]] = Mapped(words[1], roles)
        _no_shared_datasets(out, where)
        return out

    def lookup(self, dn: str) -> Mapped | None:
        with self._lock:
            mtime = self.path.stat().st_mtime_ns
            if mtime != self._mtime:
                self._map = self.parse(self.path.read_text(), str(self.path))
                self._mtime = mtime
            return self._map.get(dn)


def _no_shared_datasets(mapped: dict[str, Mapped], where: str) -> None:
    """A group named as a user would give its members that user's datasets
    (/<primary>/<name>-<processed>/USER are the user's and the group's alike)."""
    users = {m.name for m in mapped.values()}
    for who in mapped.values():
        shared = sorted(set(storejs.granted_groups(list(who.roles))) & users)
        if shared:
            raise MapfileError(
                f"{where}: group {shared[0]!r} of {who.name} has the name of a user: its "
                f"members would publish into that user's datasets /<primary>/{shared[0]}-*/USER"
            )


class ProxyAuth:
    """CouchDB proxy authentication."""

    def __init__(self, secret: str, digest: str):
        if not secret:
            raise ValueError("frontend.secret is empty: the store's proxy-auth secret is needed")
        self.secret, self.digest = secret.encode(), digest

    def ready(self, who: Mapped) -> dict[bytes, bytes]:
        return self.prepare(who)

    def prepare(self, who: Mapped) -> dict[bytes, bytes]:
        token = hmac.new(self.secret, who.name.encode(), self.digest).hexdigest()
        return {
            b"x-auth-couchdb-username": who.name.encode(),
            b"x-auth-couchdb-roles": ",".join(who.roles).encode(),
            b"x-auth-couchdb-token": token.encode(),
        }


class Sessions:
    """Per-user store accounts only the front end can use (the embedded store)."""

    def __init__(self, secret: str, admin: Server, reserved: tuple[str, ...] = ()):
        if not secret:
            raise ValueError("frontend.secret is empty: run `aso config init`")
        self.secret, self.admin = secret.encode(), admin
        # Accounts of the config (admin, agents, everyday): never given a front-end password.
        self.reserved = {name for name in reserved if name}
        self._ready: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def password(self, name: str) -> str:
        digest = hmac.new(self.secret, b"aso-frontend-user:" + name.encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")

    def ready(self, who: Mapped) -> dict[bytes, bytes] | None:
        """The headers at once if the user's account is already set up, else None."""
        if who.name in self.reserved or self._ready.get(who.name) != who.roles:
            return None
        return self._basic(who.name)

    def _basic(self, name: str) -> dict[bytes, bytes]:
        basic = base64.b64encode(f"{name}:{self.password(name)}".encode())
        return {b"authorization": b"Basic " + basic}

    def prepare(self, who: Mapped) -> dict[bytes, bytes]:
        """(In a thread: may write `_users`.)"""
        if who.name in self.reserved:
            raise Refused(
                403, f"{who.name} is a service account of the store, not for the front end"
            )
        password = self.password(who.name)
        with self._lock:
            if self._ready.get(who.name) != who.roles:
                self._set_up(who, password)
                self._ready[who.name] = who.roles
        return self._basic(who.name)

    def _set_up(self, who: Mapped, password: str) -> None:
        """Write the user's account (once per user and start): roles and password. An account
        the front end did not make is never taken over."""
        users = self.admin.db("_users")
        doc_id = f"org.couchdb.user:{who.name}"
        current = users.get(doc_id)
        if current is not None and not current.get("aso_frontend"):
            raise Refused(403, f"store account {who.name} exists and is not the front end's")
        doc = {"_id": doc_id, "name": who.name, "type": "user", "roles": sorted(who.roles),
               "password": password, "aso_frontend": True}  # fmt: skip
        if current is not None:
            doc["_rev"] = current["_rev"]
        users.put(doc)
        log.info("store account %s set up with roles %s", who.name, ",".join(who.roles))


# Twisted declares transports and the reactor as zope interfaces, whose methods (no `self`) mypy
# cannot call: these protocols are the typed face of what the front end calls on them.
class _ServerTransport(Protocol):
    """A client's TLS connection (Twisted's TLS transport over TCP)."""

    disconnecting: bool  # closing: loseConnection was called

    def write(self, data: bytes) -> None: ...

    def abortConnection(self) -> None: ...

    def getHandle(self) -> SSL.Connection: ...


class _Producer(Protocol):
    """The store connection under a store answer being relayed."""

    def pauseProducing(self) -> None: ...

    def resumeProducing(self) -> None: ...

    def stopProducing(self) -> None: ...


class _Reactor(Protocol):
    def listenTCP(self, port: int, factory: Any, interface: str = ...) -> object: ...

    def suggestThreadPoolSize(self, size: int) -> None: ...

    def addSystemEventTrigger(self, phase: str, event: str, call: Any, *args: Any) -> object: ...

    def run(self) -> None: ...


def _transport(channel: http.HTTPChannel) -> _ServerTransport:
    return cast(_ServerTransport, channel.transport)


class _Relay(protocol.Protocol):
    """Streams a store answer's body to the client as it comes (a `_changes` feed never
    ends), and ends the store's side when the client goes away: the embedded store never
    ends a feed itself (EMBEDDED_FEED_NEVER_TIMES_OUT)."""

    def __init__(
        self,
        request: server.Request,
        paused: Callable[[], None] | None = None,
        counted: Callable[[int], None] | None = None,
    ):
        self.request, self.paused, self.counted = request, paused, counted
        self.gone = False
        self.received = 0  # bytes of the store's answer (`counted` gets them at its end)

    def connectionMade(self) -> None:
        self.request.notifyFinish().addErrback(self._client_gone)
        if not _client_gone(self.request):
            # Back-pressure: the store's side is paused while the client's side is full, so that
            # an answer a client does not read waits at the store, not in the front end's memory
            # (one unread answer had held 1 GB).
            producer = cast(_Producer, self.transport)
            if self.paused is not None:
                producer = _TellsPause(producer, self.paused)
            self.request.registerProducer(producer, True)

    def _client_gone(self, _failure: Any) -> None:
        self.gone = True
        # drops the store connection (not back in the pool)
        cast(_Producer, self.transport).stopProducing()

    def dataReceived(self, data: bytes) -> None:
        self.received += len(data)
        if not self.gone:
            self.request.write(data)

    def connectionLost(self, reason: Any = None) -> None:
        if self.counted is not None:
            self.counted(self.received)
        if self.request.producer is not None and self.request.channel is not None:
            self.request.unregisterProducer()
        if self.gone or self.request.finished:
            return
        if reason is None or reason.check(client.ResponseDone, http.PotentialDataLoss):
            self.request.finish()
        else:  # cut short: the client must not take a truncated answer for a whole one
            log.error("store answer to %s cut: %s", _path(self.request), reason.getErrorMessage())
            self.request.loseConnection()


class _KeptRelay(_Relay):
    """A relay that also keeps a copy of the answer (up to shared.MAX_ANSWER_BYTES) for the
    read's Lead: the answer and how long the store took, from the lead's sending to the
    answer's end."""

    def __init__(
        self,
        request: server.Request,
        paused: Callable[[], None] | None,
        response: Any,
        lead: shared_reads.Lead,
        clock: Callable[[], float],
    ):
        super().__init__(request, paused)
        self.response, self.lead, self.clock = response, lead, clock
        self.parts: list[bytes] | None = []  # None once past what may be kept
        self.size = 0

    def dataReceived(self, data: bytes) -> None:
        super().dataReceived(data)
        if self.parts is not None:
            self.size += len(data)
            self.parts.append(data)
            if self.size > shared_reads.MAX_ANSWER_BYTES:
                self.parts = None

    def connectionLost(self, reason: Any = None) -> None:
        whole = reason is None or reason.check(client.ResponseDone)
        if whole and self.parts is not None and not self.gone:
            at = self.clock()
            got, body = self.response, b"".join(self.parts)
            answer = shared_reads.Answer(got.code, got.phrase, got.headers, body, at)
            self.lead.done(answer, at - self.lead.sent_at)
        else:
            self.lead.done(None)
        super().connectionLost(reason)


class _Dropped(protocol.Protocol):
    """A store answer nobody is left to read: its connection is closed at once (not back in
    the pool)."""

    def connectionMade(self) -> None:
        cast(_Producer, self.transport).stopProducing()


class _TellsPause:
    """A push producer (the store's side of a relay) that calls `paused()` when the client's
    side first pauses it."""

    def __init__(self, producer: _Producer, paused: Callable[[], None]):
        self.producer, self.paused = producer, _Once(paused)

    def pauseProducing(self) -> None:
        self.paused()
        self.producer.pauseProducing()

    def resumeProducing(self) -> None:
        self.producer.resumeProducing()

    def stopProducing(self) -> None:
        self.producer.stopProducing()


class _Collect(protocol.Protocol):
    """Reads a store answer's body whole, then hands it on; `drop` ends the store's side before
    that (the connection is not put back in a pool)."""

    def __init__(
        self,
        whole: Any,
        too_large: Any = None,
        limit: int = MAX_POLL_BYTES,
        counted: Callable[[int], None] | None = None,
    ):
        self.whole, self.parts, self.dropped = whole, [b""], False
        self.too_large, self.size, self.limit = too_large, 0, limit
        self.counted = counted  # gets the bytes read, whole or cut (the store's work either way)

    def dataReceived(self, data: bytes) -> None:
        if self.dropped:
            return
        self.size += len(data)
        if self.size > self.limit and self.too_large is not None:
            self.drop()  # what a long poll carries is held here whole: bounded
            self.parts = []
            if self.counted is not None:
                self.counted(self.size)
            self.too_large()
            return
        self.parts.append(data)

    def drop(self) -> None:
        self.dropped = True
        if self.transport is not None:
            cast(_Producer, self.transport).stopProducing()

    def connectionLost(self, reason: Any = None) -> None:
        if self.dropped:
            return
        if self.counted is not None:
            self.counted(self.size)
        if reason is None or reason.check(client.ResponseDone, http.PotentialDataLoss):
            self.whole(b"".join(self.parts))
        else:
            log.error("store answer cut: %s", reason.getErrorMessage())
            self.whole(
                json.dumps(
                    {"error": "bad_gateway", "reason": "the store's answer was cut"}
                ).encode()
            )


def _read_bounded(response: Any, limit: int) -> defer.Deferred[bytes | None]:
    """A store answer's body read whole, or None (its connection dropped) once it is over
    `limit` bytes."""
    read: defer.Deferred[bytes | None] = defer.Deferred()
    response.deliverBody(_Collect(read.callback, lambda: read.callback(None), limit))
    return read


def _watch_client(request: server.Request) -> None:
    """Remember when the client goes away before its answer (Twisted's own flag is private)."""
    request.notifyFinish().addErrback(lambda _: setattr(request, "aso_client_gone", True))


def _client_gone(request: server.Request) -> bool:
    return bool(request.finished) or bool(getattr(request, "aso_client_gone", False))


def _answer(request: server.Request, status: int, error: str, reason: str) -> None:
    _answer_json(request, status, json.dumps({"error": error, "reason": reason}).encode() + b"\n")


def _answer_json(request: server.Request, status: int, body: bytes) -> None:
    if _client_gone(request):
        return  # nobody to tell (the client left while its certificate was checked)
    request.setResponseCode(status)
    request.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])
    request.write(body)
    request.finish()


def peer_chain(channel: http.HTTPChannel) -> list[x509.Certificate]:
    """The client's certificate, then the certificates it sent with it."""
    connection = _transport(channel).getHandle()
    leaf = connection.get_peer_certificate()
    if leaf is None:
        return []
    sent = connection.get_peer_cert_chain() or []
    chain = [leaf.to_cryptography()]
    chain += [c.to_cryptography() for c in sent if c.to_cryptography() != chain[0]]
    return chain


class _Refusals:
    """Every refusal counted in aso_frontend_refusals by kind; in the log, a kind's first in
    REFUSALS_TOLD_EVERY s at WARNING, saying how many came since its last, the rest at DEBUG (a
    flood of refused requests had written 1,350 WARNING lines a second)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.told_at: dict[str, float] = {}
        self.untold: collections.Counter[str] = collections.Counter()

    def tell(self, kind: str, message: str, *args: Any) -> None:
        metrics.FRONTEND_REFUSALS.labels(kind).inc()
        now = self.clock()
        if now - self.told_at.get(kind, -REFUSALS_TOLD_EVERY) < REFUSALS_TOLD_EVERY:
            self.untold[kind] += 1
            log.debug("refused " + message, *args)
            return
        untold = self.untold.pop(kind, 0)
        self.told_at[kind] = now
        if untold:
            message += f" (and {untold} more refused as {kind} since the last told, at DEBUG)"
        log.warning("refused " + message, *args)


REFUSALS = _Refusals()


def _too_fine(pieces: int, size: int) -> bool:
    """A request that comes in too many tiny pieces (reads, chunks): each costs the front end
    far more than its bytes (1-byte chunks from 8 connections had slowed another user's reads
    from 0.01 to 2.6 s)."""
    return pieces > FINE_PIECES_ALLOWED and size < pieces * FINEST_PIECES


def _refusal(status: bytes, error: str, reason: str, headers: bytes = b"") -> bytes:
    """A whole answer, written straight to the connection, for what is refused before any
    resource sees the request (`headers`: more header lines, each ending CR LF)."""
    body = json.dumps({"error": error, "reason": reason}).encode()
    return (
        b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"%sConnection: close\r\n\r\n%s" % (status, len(body), headers, body)
    )


def _close_with(channel: http.HTTPChannel, status: bytes, error: str, reason: str) -> None:
    """Answer and close: Twisted would write a bare status line or drop the connection
    without a word."""
    _transport(channel).write(_refusal(status, error, reason))
    channel.loseConnection()


class _Verdict:
    """A connection's certificate chain, checked once (at the handshake's end, then every
    REVERIFY s): requests that come before the answer wait for it."""

    def __init__(
        self,
        checked: defer.Deferred[Identity],
        on_identified: Callable[[], None],
        on_refused: Callable[[Failure], None],
    ):
        self.at = time.monotonic()
        self.result: Identity | Failure | None = None
        self.waiting: list[defer.Deferred[Identity]] = []
        self.on_identified, self.on_refused = on_identified, on_refused
        checked.addBoth(self._done)

    def identity(self) -> Identity | None:
        return self.result if isinstance(self.result, Identity) else None

    def refusal(self) -> Failure | None:
        return self.result if isinstance(self.result, Failure) else None

    def fresh(self) -> bool:
        return time.monotonic() - self.at < REVERIFY

    def wait(self) -> defer.Deferred[Identity]:
        if self.result is None:
            waiting: defer.Deferred[Identity] = defer.Deferred()
            self.waiting.append(waiting)
            return waiting
        if isinstance(self.result, Failure):
            return defer.fail(self.result)
        return defer.succeed(self.result)

    def _done(self, result: Identity | Failure) -> None:
        self.result = result  # first: the hooks ask whose the connection is now
        if isinstance(result, Failure):
            self.on_refused(result)
        else:
            self.on_identified()
        waiting, self.waiting = self.waiting, []
        for each in waiting:
            if isinstance(result, Failure):
                each.errback(result)
            else:
                each.callback(result)


@implementer(IHandshakeListener)
class _Channel(http.HTTPChannel):
    """Twisted's channel, but every refusal of the framing says why (Twisted answers a bare 400,
    or drops a line over MAX_LENGTH, 16 KiB, without a word); and a request must come whole
    within `frontend.request_timeout` of its first line (a head sent a byte every 40 s had held
    its connection for ever)."""

    site: _Site  # set by the site that built the channel (Site.buildProtocol)
    aso_verdict: _Verdict | None = None  # the client's chain, checked
    _aso_deadline: Any = None
    _aso_fault: Callable[[], str] = staticmethod(lambda: "the request is not well-formed HTTP/1.1")
    # The connection's reads and their bytes, its chunks and theirs (_too_fine): counted over
    # the connection, as pieces spread over keep-alive requests cost the same.
    aso_pieces, aso_piece_bytes, aso_chunks, aso_chunk_bytes = 0, 0, 0, 0
    maxHeaders = 100  # Twisted's 500: each line costs its parsing (490 tiny ones, 5 ms a request)

    def handshakeCompleted(self) -> None:
        """The client's chain checked at once: once it verifies, the connection is no longer
        an unidentified one (_Admission)."""
        front = cast(FrontEnd, self.site.resource)
        self.aso_verdict = front.check_chain(self)

    def identified_client(self) -> None:
        """The client's chain verified: the bodies of its requests are its user's from now on,
        what has arrived included (a body may have come whole before the verdict). A request
        whose client has left has no channel any more (Twisted keeps it in `requests`)."""
        for request in self.requests:
            if request.channel is self and (request.held or request.in_body):
                request.recharge()

    def refused_client(self, failure: Failure) -> None:
        """The client's chain is refused: a body under way is refused now, not read to its end
        (an unidentified client's bodies had held the room others' bodies need)."""
        last = self.requests[-1] if self.requests else None
        if last is not None and last.channel is self and last.in_body:
            last.refuse_client(failure)

    def dataReceived(self, data: bytes) -> None:
        if self._aso_deadline is None and not self._handlingRequest and data:
            # A request's first bytes: it must come whole within request_timeout.
            self._aso_deadline = self.callLater(  # type: ignore[no-untyped-call]  # Twisted's
                self.site.request_timeout, self._too_slow
            )
        self.aso_pieces += 1
        self.aso_piece_bytes += len(data)
        answered = bool(self.requests) and self.requests[-1].refused_body  # its rest is dropped
        if _too_fine(self.aso_pieces, self.aso_piece_bytes) and not answered:
            self._refuse_head(f"a request must come in pieces of {FINEST_PIECES} bytes or more "
                              "on average (a TLS record each)")  # fmt: skip
            return
        super().dataReceived(data)  # type: ignore[no-untyped-call]  # unannotated in Twisted
        # What is left in line mode is a head line not ended yet: Twisted would wait for a CR LF
        # that a client ending lines with a bare LF never sends.
        if self.line_mode and not self._handlingRequest and not _transport(self).disconnecting:
            unended = self._buffer[:-1] if self._buffer.endswith(b"\r") else self._buffer
            if b"\r" in unended or b"\n" in unended:
                self._refuse_head(gate.LINE_ENDING_FAULT)

    def lineReceived(self, line: bytes) -> None:
        first = getattr(self, "_HTTPChannel__first_line", True)
        fault = gate.line_fault(line, bool(first))
        if fault:  # Twisted would fold the line into the header before it, or keep its CR
            self._refuse_head(fault)
            return
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            limit = self.totalHeadersSize
            self._aso_fault = lambda: f"a request's head is limited to {limit} bytes"
        elif first:
            self._aso_fault = lambda: gate.request_line_fault(line)
        super().lineReceived(line)  # type: ignore[no-untyped-call]  # unannotated in Twisted

    def headerReceived(self, line: bytes) -> bool:
        length_given, count = self._transferDecoder is not None, self._receivedHeaderCount
        self._aso_fault = lambda: gate.header_fault(line, length_given, count, self.maxHeaders)
        return bool(super().headerReceived(line))  # type: ignore[no-untyped-call]  # Twisted's

    def allHeadersReceived(self) -> None:
        fault = gate.host_fault(
            self._version, self.requests[-1].requestHeaders.getRawHeaders(b"host")
        )
        if fault:
            self._refuse_head(fault)
            return
        super().allHeadersReceived()  # type: ignore[no-untyped-call]  # unannotated in Twisted

    def _send100Continue(self) -> None:
        if not self.requests[-1].refused_body:  # its 413 or 503 is the answer
            super()._send100Continue()  # type: ignore[no-untyped-call]  # unannotated in Twisted

    def _maybeChooseTransferDecoder(self, header: bytes, data: bytes) -> bool:
        # Twisted also takes `identity`, which RFC 9112 no longer has: only chunked is.
        if header == b"Transfer-Encoding" and data.lower() != b"chunked":
            return self._failChooseTransferDecoder()
        chosen = bool(super()._maybeChooseTransferDecoder(header, data))  # type: ignore[no-untyped-call]
        if type(self._transferDecoder) is http._ChunkedTransferDecoder:
            request = self.requests[-1]
            self._transferDecoder = _BoundedChunks(
                self, request.handleContentChunk, self._finishRequestBody
            )
        return chosen

    def rawDataReceived(self, data: bytes) -> None:
        self._aso_fault = lambda: "the chunked body is malformed (RFC 9112 7.1)"
        super().rawDataReceived(data)

    def _refuse_head(self, fault: str) -> None:
        self._aso_fault = lambda: fault
        self._respondToBadRequestAndDisconnect()

    def _respondToBadRequestAndDisconnect(self) -> None:
        reason = self._aso_fault()
        REFUSALS.tell("framing", "a request's framing: %s", reason)
        self._no_deadline()
        if len(self.requests) > 1:  # an answer of an earlier request may be under way
            _transport(self).abortConnection()
            return
        _close_with(self, b"400 Bad Request", "bad_request", reason)

    def allContentReceived(self) -> None:
        self._no_deadline()
        if _transport(self).disconnecting:  # refused already (Twisted goes on after a header)
            return
        super().allContentReceived()  # type: ignore[no-untyped-call]  # unannotated in Twisted

    def connectionLost(self, reason: Any = None) -> None:
        self._no_deadline()
        super().connectionLost(reason)  # type: ignore[no-untyped-call]  # unannotated in Twisted

    def _no_deadline(self) -> None:
        if self._aso_deadline is not None and self._aso_deadline.active():
            self._aso_deadline.cancel()
        self._aso_deadline = None

    def linger(self) -> None:
        """After a refusal sent while the body still comes: what follows is read and dropped
        for LINGER s, so that a client still sending reads the answer (closing at once can reset
        the connection under it), then the connection is closed."""
        self._no_deadline()
        self._aso_deadline = self.callLater(LINGER, self.loseConnection)  # type: ignore[no-untyped-call]

    def timeoutConnection(self) -> None:
        if self._aso_deadline is not None:  # a request under way: its 408, not a silent close
            self._aso_deadline.cancel()
            self._too_slow()
            return
        super().timeoutConnection()  # type: ignore[no-untyped-call]  # unannotated in Twisted

    def _too_slow(self) -> None:
        self._aso_deadline = None
        reason = f"a request must arrive whole within {self.site.request_timeout:g} s"
        _close_with(self, b"408 Request Timeout", "request_timeout", reason)

    def lineLengthExceeded(self, line: bytes) -> None:
        first = getattr(self, "_HTTPChannel__first_line", 1)  # still reading the request line
        status = b"414 URI Too Long" if first else b"431 Request Header Fields Too Large"
        what = "request line" if first else "header line"
        reason = f"a {what} is limited to {self.MAX_LENGTH} bytes"
        _close_with(self, status, "too_large", reason)


class _BoundedChunks(http._ChunkedTransferDecoder):
    """Twisted's chunked decoder, but a chunk declared larger than the request may still send
    is refused at its size line (Twisted waited for its bytes, up to the request timeout), no
    trailer field is taken, and a malformed body says how it is malformed."""

    def __init__(
        self, channel: _Channel, data: Callable[[bytes], None], finish: Callable[[bytes], None]
    ):
        super().__init__(data, finish)
        self.channel = channel

    def _dataReceived_CHUNK_LENGTH(self) -> bool:
        line_end = self._buffer.find(b"\n")  # Twisted looks for CR LF only, and waits for it
        if line_end != -1 and self._buffer[line_end - 1 : line_end] != b"\r":
            raise http._MalformedChunkedDataError("a chunk's size line must end with CR LF")
        read = super()._dataReceived_CHUNK_LENGTH()
        if read and self.state == "BODY":
            channel = self.channel
            channel.aso_chunks, channel.aso_chunk_bytes = (
                channel.aso_chunks + 1, channel.aso_chunk_bytes + self.length)  # fmt: skip
            if _too_fine(channel.aso_chunks, channel.aso_chunk_bytes):
                raise http._MalformedChunkedDataError(
                    f"chunks must hold {FINEST_PIECES} bytes or more on average"
                )
            self.channel.requests[-1].declared(self.length)
        return read

    def _dataReceived_TRAILER(self) -> bool:
        ending = bytes(self._buffer[:2])
        if ending not in (b"\r\n", b"\r"):
            bare = ending[:1] in (b"\r", b"\n")
            raise http._MalformedChunkedDataError(
                "a chunked body must end with CR LF" if bare else gate.TRAILER_FAULT
            )
        return super()._dataReceived_TRAILER()

    def dataReceived(self, data: bytes) -> None:
        try:
            super().dataReceived(data)
        except http._MalformedChunkedDataError as exc:
            reason = f"the chunked body is malformed (RFC 9112 7.1): {exc}"
            self.channel._aso_fault = lambda: reason
            raise


class _BodyBytes:
    """Request body bytes held at once (Twisted spools a body over 100 kB to a temporary file
    until its request ends: eight 60 MB bodies had held 480 MiB of /tmp, nothing bounding their
    sum): `frontend.body_bytes` in all, `frontend.body_bytes_per_user` for one client (a user,
    by its certificate's DN; a client whose chain is still being checked, by its address). What
    is charged is what has arrived, so that a body announced and never sent holds nothing."""

    def __init__(self, total: int, per_client: int):
        self.total, self.per_client = total, per_client
        self.held = 0
        self.by_client: collections.Counter[str] = collections.Counter()

    def room(self, client: str, size: int) -> bool:
        """Whether `size` more bytes from `client` fit now."""
        return self.held + size <= self.total and self.by_client[client] + size <= self.per_client

    def take(self, client: str, size: int) -> None:
        self.held += size
        self.by_client[client] += size

    def give_back(self, client: str, size: int) -> None:
        self.held -= size
        self.by_client[client] -= size
        if self.by_client[client] <= 0:
            del self.by_client[client]


class _BoundedRequest(server.Request):
    """A request whose body is counted as it arrives, however it is framed. Twisted sizes
    nothing but a Content-Length and buffers a chunked body whole (a 70 MiB chunked `_bulk_docs`
    had been forwarded): past `frontend.max_body` the client gets its 413 at once; a body the
    front end has no room for now (_BodyBytes) gets a 503 with Retry-After, at its length or
    as its bytes come. Then the rest of the body is read and dropped, and the connection is
    closed once the body ends (cut at DISCARD_LIMIT times the limit)."""

    DISCARD_LIMIT = 4
    received, refused_body = 0, False  # bytes of the body so far; answered (413, 503) already
    in_body = False  # its body is arriving
    held, charged_to = 0, ""  # of them, bytes charged to the site's _BodyBytes, and to whom
    over_room = False  # came whole before its chain verified, past its user's room: 503
    channel: _Channel  # requests come from _Site, whose channels are _Channel
    aso_content_type = b""  # the Content-Type sent (Twisted is not shown it: requestReceived)

    def gotLength(self, length: int | None) -> None:
        self.received, self.refused_body = 0, False
        limit = self.channel.site.max_body
        forwarded = length if length is None or length <= limit else 0
        super().gotLength(forwarded)  # type: ignore[no-untyped-call]  # unannotated in Twisted
        self.in_body = length != 0
        if not self.in_body:
            return
        verdict = self.channel.aso_verdict
        refusal = verdict.refusal() if verdict is not None else None
        if refusal is not None:
            self.refuse_client(refusal)
        elif length is not None and length > limit:
            self._too_large(limit)
        elif length and not self.channel.site.body_bytes.room(self._client(), length):
            self._no_room()

    def handleContentChunk(self, data: bytes) -> None:
        limit = self.channel.site.max_body
        self.received += len(data)
        if self.refused_body:
            if self.received > self.DISCARD_LIMIT * limit:
                _transport(self.channel).abortConnection()
            return
        if self.received > limit:
            self._too_large(limit)
            return
        budget = self.channel.site.body_bytes
        self.recharge()
        if not budget.room(self.charged_to, len(data)):
            self._no_room()
            return
        budget.take(self.charged_to, len(data))
        self.held += len(data)
        super().handleContentChunk(data)  # type: ignore[no-untyped-call]  # unannotated in Twisted

    def declared(self, size: int) -> None:
        """A chunk of `size` bytes is on its way."""
        limit = self.channel.site.max_body
        if not self.refused_body and self.received + size > limit:
            self._too_large(limit)

    def finish(self) -> None:
        self._give_back()
        super().finish()  # type: ignore[no-untyped-call]  # unannotated in Twisted

    def connectionLost(self, reason: Any) -> None:
        self._give_back()
        super().connectionLost(reason)  # type: ignore[no-untyped-call]  # unannotated in Twisted

    def recharge(self) -> None:
        """What has arrived charged to whom the body is now (_client): a client whose chain
        verified meanwhile, from its address to its user; past the user's room, 503 (a body
        that came whole gets it in its turn: FrontEnd.verified)."""
        budget, client = self.channel.site.body_bytes, self._client()
        if client == self.charged_to:
            return
        if self.held:
            budget.give_back(self.charged_to, self.held)
            budget.take(client, self.held)
        self.charged_to = client
        if self.refused_body or budget.by_client[client] <= budget.per_client:
            return
        if self.in_body:
            self._no_room()
        else:
            self.over_room = True
            self._give_back()

    def _give_back(self) -> None:
        if self.held and self.charged_to:
            self.channel.site.body_bytes.give_back(self.charged_to, self.held)
            self.held = 0

    def _client(self) -> str:
        """Whom the body is charged to: its user once the chain has verified, else its address."""
        verdict = self.channel.aso_verdict
        identity = verdict.identity() if verdict is not None else None
        if identity is not None:
            return "user " + identity.dn
        return "address " + str(getattr(self.channel.transport, "aso_address", ""))

    def refuse_client(self, failure: Failure) -> None:
        """The client's chain is refused: so is its body, now (its reason, not a read body)."""
        if self.refused_body:
            return
        status, error, reason = chain_refusal(failure)
        if failure.check(Refused):
            REFUSALS.tell("certificate", "%s %s: %s", _method(self), _path(self), reason)
        retry = b"Retry-After: %d\r\n" % BODY_RETRY_AFTER if status == 503 else b""
        phrase = http.RESPONSES.get(status, b"Error")
        self._refuse_body(_refusal(b"%d %s" % (status, phrase), error, reason, retry))

    def _too_large(self, limit: int) -> None:
        REFUSALS.tell("too_large", "%s %s: body over %d bytes", _method(self), _path(self), limit)
        self._refuse_body(
            _refusal(b"413 Content Too Large", "too_large", f"bodies are limited to {limit} bytes")
        )

    def _no_room(self) -> None:
        budget, client = self.channel.site.body_bytes, self.charged_to or self._client()
        REFUSALS.tell("busy", "%s %s: %d body bytes held, %d for %s", _method(self),
                      _path(self), budget.held, budget.by_client[client], client)  # fmt: skip
        self._refuse_body(_refusal(b"503 Service Unavailable", "busy", BODY_BUSY,
                                   b"Retry-After: %d\r\n" % BODY_RETRY_AFTER))  # fmt: skip

    def _refuse_body(self, answer: bytes) -> None:
        self.refused_body = True
        self._give_back()
        if self.channel.requests != [self]:  # an answer of an earlier request may be under way
            _transport(self.channel).abortConnection()
            return
        _transport(self.channel).write(answer)
        self.channel.linger()

    def _handleStar(self) -> None:
        """Twisted answers `OPTIONS *` itself (an empty 200): here `*` goes to the front end
        like any other target, and the gate refuses it."""
        self.render(self.channel.site.getResourceFor(self))  # type: ignore[no-untyped-call]

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        self.in_body = False
        if self.refused_body:  # answered already
            self.channel.loseConnection()  # type: ignore[no-untyped-call]  # unannotated in Twisted
            return
        # Twisted would read a form body itself (and answer a malformed one with a bare 400):
        # the body is the gate's to judge, so Twisted is not shown its type.
        content_type = self.requestHeaders.getRawHeaders(b"content-type")
        self.aso_content_type = content_type[-1] if content_type else b""
        self.requestHeaders.removeHeader(b"content-type")
        try:
            # Twisted's requestReceived is unannotated.
            super().requestReceived(command, path, version)  # type: ignore[no-untyped-call]
        finally:
            if content_type is not None:
                self.requestHeaders.setRawHeaders(b"content-type", content_type)


def address_key(host: str) -> str:
    """Whose connection it is, as far as an address says: the address, an IPv6 one's /64 (one
    host is given a /64 whole) and an IPv4-mapped one as IPv4."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class _Admitted(TLSMemoryBIOProtocol):
    """A connection _Admission let in: whose it is (its address; once identified, its user's
    DN), and when it is cut if still unidentified."""

    aso_address: str
    aso_user: str | None = None
    aso_gone = False  # closed: a chain check that ends later changes no count
    aso_deadline: Any


class _Admission(TLSMemoryBIOFactory):
    """The front end's TLS connections, few enough that no one client takes them all.

    Past `frontend.connections` open, or `frontend.connections_per_address` from one address, a
    new one is closed at once, before its handshake. A connection is *unidentified* until its
    client's certificate chain verifies (at the handshake's end); unidentified ones are cut
    after `frontend.identify_timeout` and are `frontend.unidentified_per_address` at most from
    one address and `frontend.unidentified_connections` in all. When all are taken, a newcomer
    takes the place of the oldest of the address that holds the most, if it holds more than the
    newcomer's would, else of the oldest of all: connections that never identify (silent TCP
    from a few addresses, or one each from a thousand) cannot keep others out for longer than
    it takes them to open as many again. An identified one stays unidentified, its requests
    answered 503, past `frontend.connections_per_user` of its user (alice's connections from 16
    addresses had held all 8192)."""

    def __init__(self, tls: Any, site: _Site, settings: FrontendConfig, reactor: Any):
        super().__init__(tls, False, cast(Any, site))  # a Site is an IProtocolFactory
        self.protocol = _Admitted
        self.total, self.per_address = settings.connections, settings.connections_per_address
        self.unidentified_total = settings.unidentified_connections
        self.unidentified_per_address = settings.unidentified_per_address
        self.identify_timeout = settings.identify_timeout
        self.per_user = settings.connections_per_user
        self.by_user: collections.Counter[str] = collections.Counter()
        self.oldest: dict[Any, None] = {}  # the unidentified, oldest first, of all addresses
        self.peak = 0  # connections open at most since memory was last given back
        self.open = 0
        self.by_address: collections.Counter[str] = collections.Counter()
        # Each address's unidentified connections, oldest first (a dict as an ordered set).
        self.waiting: dict[str, dict[Any, None]] = {}
        self.reactor = reactor

    def buildProtocol(self, addr: Any) -> Any:
        host = address_key(str(getattr(addr, "host", "")))
        if self.open >= self.total or self.by_address[host] >= self.per_address:
            REFUSALS.tell("connections", "a connection from %s: %d open, %d from it", host,
                          self.open, self.by_address[host])  # fmt: skip
            return None  # the port closes the socket
        mine = len(self.waiting.get(host, ()))
        if mine >= self.unidentified_per_address:
            REFUSALS.tell("unidentified", "a connection from %s: %d unidentified, %d from it",
                          host, len(self.oldest), mine)  # fmt: skip
            return None
        if len(self.oldest) >= self.unidentified_total:
            self._make_room(mine)
        self.open += 1
        self.peak = max(self.peak, self.open)
        self.by_address[host] += 1
        connection = cast(_Admitted, super().buildProtocol(addr))
        connection.aso_address = host
        self.waiting.setdefault(host, {})[connection] = None
        self.oldest[connection] = None
        connection.aso_deadline = self.reactor.callLater(
            self.identify_timeout, self._too_late, connection
        )
        return connection

    def identified(self, connection: Any, user: str) -> None:
        """The connection's client has shown a chain that verifies, of `user` (a DN): it leaves
        the unidentified, unless its user holds `frontend.connections_per_user` already
        (TooManyConnections)."""
        if connection.aso_user is not None or connection.aso_gone:
            return
        if self.by_user[user] >= self.per_user:
            REFUSALS.tell("user_connections", "a connection of %s: %d of theirs open", user,
                          self.by_user[user])  # fmt: skip
            raise TooManyConnections(
                f"{self.by_user[user]} connections of yours are open (at most "
                f"{self.per_user}, frontend.connections_per_user): close some"
            )
        self._leave_waiting(connection)
        connection.aso_user = user
        self.by_user[user] += 1

    def unregisterProtocol(self, p: Any) -> None:
        super().unregisterProtocol(p)  # type: ignore[no-untyped-call]  # unannotated in Twisted
        p.aso_gone = True
        self._leave_waiting(p)
        if p.aso_user is not None:
            self.by_user[p.aso_user] -= 1
            if not self.by_user[p.aso_user]:
                del self.by_user[p.aso_user]
        host = p.aso_address
        self.open -= 1
        self.by_address[host] -= 1
        if not self.by_address[host]:
            del self.by_address[host]
        if self.peak - self.open >= TRIM_AFTER_CLOSED and self.open <= self.peak // 2:
            # Each TLS connection's buffers are C heap, kept by glibc once freed: 8192 closed
            # had left the front end 430 MB larger.
            self.peak = self.open
            self.reactor.callInThread(give_back_memory)

    def _make_room(self, mine: int) -> None:
        """An unidentified connection cut for a newcomer whose address holds `mine`: the oldest
        of the address holding the most, if that address holds more than the newcomer's would,
        else the oldest of all."""
        fullest = max(self.waiting, key=lambda host: len(self.waiting[host]))
        if len(self.waiting[fullest]) > mine + 1:
            oldest = next(iter(self.waiting[fullest]))
        else:
            oldest = next(iter(self.oldest))
        self._leave_waiting(oldest)
        REFUSALS.tell("evicted", "a connection from %s kept unidentified: cut for a newcomer",
                      oldest.aso_address)  # fmt: skip
        oldest.abortConnection()

    def _too_late(self, connection: Any) -> None:
        if self._leave_waiting(connection):
            REFUSALS.tell("identify_timeout", "a connection from %s: not identified within %g s",
                          connection.aso_address, self.identify_timeout)  # fmt: skip
            connection.abortConnection()

    def _leave_waiting(self, connection: Any) -> bool:
        """The connection out of the unidentified (False: it was not among them)."""
        waiting = self.waiting.get(connection.aso_address)
        if waiting is None or connection not in waiting:
            return False
        del waiting[connection]
        del self.oldest[connection]
        if not waiting:
            del self.waiting[connection.aso_address]
        if connection.aso_deadline.active():
            connection.aso_deadline.cancel()
        return True


class _Site(server.Site):
    # HTTP/1.1 only: ASO's clients speak nothing else.
    protocol = _Channel  # type: ignore[assignment]  # Twisted's type: its HTTP/2-capable wrapper
    requestFactory = _BoundedRequest

    def __init__(self, root: resource.Resource, settings: FrontendConfig):
        # A connection silent for `frontend.idle_timeout` between requests is closed.
        super().__init__(root, timeout=settings.idle_timeout)  # type: ignore[no-untyped-call]
        self.max_body = settings.max_body
        self.request_timeout = settings.request_timeout
        self.body_bytes = _BodyBytes(settings.body_bytes, settings.body_bytes_per_user)


class FrontEnd(resource.Resource):
    isLeaf = True

    def __init__(
        self, config: Config, trust: TrustStore, gridmap: GridMap, identity: Any, reactor: Any
    ):
        super().__init__()  # type: ignore[no-untyped-call]  # unannotated in Twisted
        self.config = config
        self.trust, self.gridmap, self.identity = trust, gridmap, identity
        self.origins = own_origins(config)
        self.pages = f"/{config.store.pages_db}/{PAGES_DDOC}/".encode()
        self.reactor = reactor
        self.routes = routes.table(config)
        self.body_checks = BodyChecks(config, self.routes, config.frontend.body_processes)
        # Before the reactor's threads are joined: a check queued in one starts no new workers.
        reactor.addSystemEventTrigger("before", "shutdown", self.body_checks.stop)
        self.heavy = Slots(
            reactor,
            HEAVY_READS,
            "heavy reads (documents, a reduce, no limit)",
            for_services=SERVICE_HEAVY_READS,
        )
        self.bodies = Slots(reactor, BIG_BODIES, "large bodies")
        self.checks = Slots(reactor, 1, "a user's requests being checked", each=CHECKS_PER_USER)
        self.writes = Slots(reactor, 1, "a user's writes at the store", each=WRITES_PER_USER)
        self.heavy_turns = Slots(reactor, 1, "a user's heavy reads")
        self.heavy_time = Pace(reactor, HEAVY_SHARE, HEAVY_BURST)  # seconds at the store
        self.light_time = Pace(reactor, LIGHT_SHARE, LIGHT_BURST)  # the other reads' seconds
        self.shared = shared_reads.SharedReads()  # operators' costly reduce reads
        self.reads = Slots(reactor, 1, "a user's reads at the store", each=READS_PER_USER)
        self.pace = Pace(reactor, config.frontend.user_docs_per_second, limits.MAX_DOCS)
        # Chains are checked in threads of their own: a check waiting behind other work had
        # let a connection be cut as unidentified (_Admission).
        self.chain_checks = ThreadPool(minthreads=1, maxthreads=CHAIN_CHECKS, name="chain checks")
        reactor.callWhenRunning(self.chain_checks.start)
        reactor.addSystemEventTrigger("during", "shutdown", self.chain_checks.stop)
        self.polls = Slots(reactor, config.frontend.polls, "long polls",
                           each=config.frontend.polls_per_user)  # fmt: skip
        self.store_nodes: frozenset[str] = frozenset()  # the nodes the store's sequences name
        self.nodes_read_at = -NODES_REFRESH
        self.nodes_waiting: list[defer.Deferred[None]] | None = None  # while a reading is out
        url = urlsplit(config.store.url)
        if url.scheme != "http":
            raise ValueError("the front end forwards to a store on http:// (its loopback side)")
        self.store_url = f"http://{url.hostname or '127.0.0.1'}:{url.port or 80}".encode()
        # HTTP/1.1 to the store with kept-alive connections (not one per request).
        pool = client.HTTPConnectionPool(reactor, persistent=True)
        pool.maxPersistentPerHost = STORE_CONNECTIONS
        # Closed before the store closes it (node's keep-alive: 5 s): a request sent on a
        # connection the store has just closed was a 502 (a write is not sent again).
        pool.cachedConnectionTimeout = POOL_IDLE
        timeout = config.store.connect_timeout
        self.agent = client.Agent(reactor, pool=pool, connectTimeout=timeout)
        # A feed holds its connection for as long as it lasts: its own, never pooled.
        self.feeds = client.Agent(
            reactor, pool=client.HTTPConnectionPool(reactor, persistent=False),
            connectTimeout=timeout,
        )  # fmt: skip

    def render(self, request: server.Request) -> Any:
        request.responseHeaders.removeHeader(b"server")  # Twisted's name and version
        # Every answer is read as the type it says: an error's JSON that quotes a request is
        # never sniffed into a page (round 26).
        request.responseHeaders.setRawHeaders(b"x-content-type-options", [b"nosniff"])
        _measure(request)
        _watch_client(request)
        channel = cast(_Channel, request.channel)  # every request comes through _Site
        # A connection's chain is checked once and the verdict kept for REVERIFY seconds, so
        # that keep-alive clients do not pay for it on every request, while an expired proxy or
        # a new CRL still takes effect within that time.
        if channel.aso_verdict is None or not channel.aso_verdict.fresh():
            channel.aso_verdict = self.check_chain(channel)
        checked = channel.aso_verdict.wait()
        checked.addCallback(self.verified, request)
        checked.addErrback(self._not_verified, request)
        return server.NOT_DONE_YET

    def check_chain(self, channel: _Channel) -> _Verdict:
        """The client's chain verified: read here (the TLS connection is the reactor's), checked
        in a thread (CRLs, a CA directory read again after fetch-crl), so that one client's
        check never holds up the others' requests. A chain that verifies identifies the
        connection (_Admission)."""
        checked = threads.deferToThreadPool(
            self.reactor,
            self.chain_checks,
            verify_chain,
            peer_chain(channel),
            self.trust,
            require_crl=self.config.frontend.require_crl,
        )

        def identified(identity: Identity) -> Identity:
            tls = channel.transport
            admission = getattr(tls, "factory", None)
            if isinstance(admission, _Admission):
                admission.identified(tls, identity.dn)
            return identity

        checked.addCallback(identified)
        return _Verdict(checked, channel.identified_client, channel.refused_client)

    def verified(self, identity: Identity, request: server.Request) -> None:
        if _client_gone(request):  # left while its certificate was checked
            return
        if cast(_BoundedRequest, request).over_room:
            REFUSALS.tell("busy", "%s %s: a body past the room of %s", _method(request),
                          _path(request), identity.dn)  # fmt: skip
            request.setHeader(b"retry-after", b"%d" % BODY_RETRY_AFTER)
            _answer(request, 503, "busy", BODY_BUSY)
            return
        self.authorised(request, identity)

    def _not_verified(self, failure: Any, request: server.Request) -> None:
        if _client_gone(request):
            log.debug("the client of %s left: %s", _path(request), failure.getErrorMessage())
            return
        status, error, reason = chain_refusal(failure)
        if failure.check(Refused):
            REFUSALS.tell("certificate", "%s %s: %s", _method(request), _path(request), reason)
        elif failure.check(TooManyConnections):
            request.setHeader(b"connection", b"close")
            request.setHeader(b"retry-after", b"%d" % BODY_RETRY_AFTER)
        else:
            log.error("cannot verify the client of %s: %s", _path(request),
                      failure.getErrorMessage())  # fmt: skip
        _answer(request, status, error, reason)

    def authorised(self, request: server.Request, identity: Identity) -> None:
        """Map the verified client, match the request against the route table, and forward
        what the match made."""
        if _client_gone(request):
            return
        who = self.gridmap.lookup(identity.dn)
        if who is None:
            REFUSALS.tell("unmapped", "%s: DN %s is not mapped", _path(request), identity.dn)
            _answer(request, 403, "forbidden", f"DN {identity.dn} is not mapped to an ASO user")
            return
        refused = cross_site(request, self.origins, self.pages)
        if refused is not None:
            self._refused(request, who, refused)
            return
        content = cast(BinaryIO, request.content)  # the body, received whole before render
        if content.seek(0, 2) <= BIG_BODY:
            self._check(request, who, None)
            return
        slot = self.bodies.take_for(request, who.name)
        slot.addCallback(lambda release: self._check(request, who, release))
        slot.addErrback(self._failed, request)

    def _check(
        self, request: server.Request, who: Mapped, release: Callable[[], None] | None
    ) -> None:
        """The gate's verdict on the request, made in a thread: parsing a body is the front
        end's CPU, and one client's large body never holds up the others' requests on the
        reactor. A user's checks wait for each other past CHECKS_PER_USER (one user's bodies
        of 1 MiB had taken every thread, and others' requests waited 13 s). A large body's
        slot (`release`) is held until the gate has made the store's request, and for a write
        until its answer."""
        if _client_gone(request):
            self._body_done(release)
            return
        turn = self.checks.take_for(request, who.name, shared=False)

        def check(done: Callable[[], None]) -> defer.Deferred[gate.GateRefusal | gate.Forward]:
            checked = threads.deferToThreadPool(
                self.reactor, self.reactor.getThreadPool(), _gate_check, request, who,
                self.body_checks
            )  # fmt: skip
            checked.addBoth(_after, done)
            return checked

        verdict: defer.Deferred[Any] = turn.addCallback(check)
        verdict.addCallback(self._checked, request, who, release)
        verdict.addErrback(self._not_checked, request, release)

    def _not_checked(
        self, failure: Any, request: server.Request, release: Callable[[], None] | None
    ) -> None:
        self._body_done(release)
        self._failed(failure, request)

    def _body_done(self, release: Callable[[], None] | None) -> None:
        if release is None:
            return
        release()
        threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), give_back_memory)

    def _refused(self, request: server.Request, who: Mapped, verdict: gate.GateRefusal) -> None:
        REFUSALS.tell("gate", "%s %s of %s: %s", _method(request), _path(request), who.name,
                      verdict.reason)  # fmt: skip
        _answer(request, verdict.status, verdict.error, verdict.reason)

    def _checked(
        self,
        verdict: gate.GateRefusal | gate.Forward,
        request: server.Request,
        who: Mapped,
        release: Callable[[], None] | None = None,
    ) -> None:
        writes = isinstance(verdict, gate.Forward) and verdict.route.kind in WRITES
        # A user's write first waits for its turn and its documents' pace (_write_slot), its
        # slot given back meanwhile and taken again to go to the store (two users' paced
        # writes had held both slots: another's large body waited 27 s).
        waits = writes and _user_only(who) and not _holds(request, WRITE_SLOT)
        if release is not None and waits:
            setattr(request, BIG_WRITE, True)
        if _client_gone(request) or not writes or waits:
            self._body_done(release)
        elif release is not None:  # the store parses it too: one at a time per user, few at all
            request.notifyFinish().addBoth(lambda _: self._body_done(release))
        if _client_gone(request):
            return
        if isinstance(verdict, gate.GateRefusal):
            self._refused(request, who, verdict)
            return
        headers = self.identity.ready(who)
        if headers is not None:
            self.forward(request, who, headers, verdict)
            return
        done = threads.deferToThreadPool(  # may write to the store
            self.reactor, self.reactor.getThreadPool(), self.identity.prepare, who
        )
        done.addCallback(lambda headers: self.forward(request, who, headers, verdict))
        done.addErrback(self._failed, request)

    def _failed(self, failure: Any, request: server.Request) -> None:
        if _client_gone(request):  # nobody to tell: what failed is the work of a client gone
            log.debug("the client of %s left: %s", _path(request), failure.getErrorMessage())
            return
        if failure.check(Busy):
            request.setHeader(b"retry-after", b"5")
            _answer(request, 503, "busy", str(failure.value))
            return
        if failure.check(Spent):
            wait = math.ceil(failure.value.seconds)
            request.setHeader(b"retry-after", b"%d" % wait)
            spent = failure.value
            _answer(request, 503, "too_costly", spent.reason.format(share=spent.share, wait=wait))
            return
        if failure.check(Refused):
            refused = failure.value
            _answer(request, refused.status, "forbidden", refused.reason)
            return
        if failure.check(Stopped):
            _answer(request, 503, "stopping", str(failure.value))
            return
        log.error("cannot forward %s: %s", _path(request), failure.getErrorMessage())
        _answer(request, 502, "bad_gateway", "the document store is not available")

    def forward(
        self, request: server.Request, who: Mapped, identity: dict[bytes, bytes], made: gate.Forward
    ) -> None:
        """Send the store request the gate made (aso.frontend.gate.Forward) as `who`. Of the
        client's headers only those that ask for a representation go on (KEPT_HEADERS), and
        a JSON route asks for JSON; the identity is the front end's."""
        headers = {
            key: [value] for key, value in request.getAllHeaders().items() if key in KEPT_HEADERS
        }
        if made.route.json:
            headers[b"accept"] = [b"application/json"]
        headers.update({key: [value] for key, value in identity.items()})
        if made.body is not None:
            headers[b"content-type"] = [b"application/json"]
        producer = _producer_of(made)
        log.debug("%s %s %s as %s", who.name, _method(request), _path(request), ",".join(who.roles))
        if _light_cost(made) and _user_only(who) and not _holds(request, LIGHT_PACED):
            self._light_paced(request, who, identity, made)
            return
        if made.nodes - self.store_nodes:
            self._check_nodes(request, who, headers, made)
            return
        if made.poll_ms is not None and made.since == "now":
            self._poll_from_now(request, who, headers, made)
            return
        # After `now` is read: a poll that waits its turn must not lose what is written meanwhile.
        if made.poll_ms is not None and _user_only(who) and not _holds(request, POLL_SLOT):
            self._poll_slot(request, who, identity, made)
            return
        if made.route.kind in WRITES and _user_only(who) and not _holds(request, WRITE_SLOT):
            self._write_slot(request, who, identity, made)
            return
        if _light_read(made) and _user_only(who) and not _holds(request, READ_SLOT):
            self._read_slot(request, who, identity, made)
            return
        # A user's filtered long poll takes its turns as it goes (_catch_up, _wait_from).
        catches_up = made.filtered and made.poll_ms is not None and _user_only(who)
        if made.heavy and _user_only(who) and not catches_up and not _holds(request, PACED):
            self._heavy_paced(request, who, identity, made)
            return
        paced_poll = made.with_docs and made.poll_ms is not None and _user_only(who)
        if paced_poll and not catches_up and not _holds(request, PACED):
            self._poll_paced(request, who, identity, made)
            return
        if made.reduces and made.poll_ms is None and _is_operator(who):
            self._shared_read(request, who, headers, made, producer)
            return
        if (made.heavy or (made.with_docs and not _is_agent(who))) and not catches_up:
            self._heavy_slot(request, who, headers, made, producer)
            return
        self._send(request, who, headers, made, producer)

    def _heavy_slot(
        self,
        request: server.Request,
        who: Mapped,
        headers: dict[bytes, list[bytes]],
        made: gate.Forward,
        producer: IBodyProducer | None,
    ) -> None:
        """Sent once one of the heavy reads' slots is taken (a user's in their own queue). A
        long poll with documents waits in its user's queue, never for a shared slot (it may
        wait a minute); agents' polls are the service's own and run side by side."""
        slot = self.heavy.take_for(
            request, who.name, shared=made.heavy, service=not _user_only(who)
        )
        slot.addCallback(lambda release: self._send(request, who, headers, made, producer, release))
        slot.addErrback(self._failed, request)

    def _shared_read(
        self,
        request: server.Request,
        who: Mapped,
        headers: dict[bytes, list[bytes]],
        made: gate.Forward,
        producer: IBodyProducer | None,
    ) -> None:
        """An operator's reduce read (aso.frontend.shared): a kept answer if it is fresh, else
        the answer of the same read under way, else a heavy read that leads, its answer kept if
        it was costly."""
        if _client_gone(request):  # notifyFinish would never fire: a lead would never end
            return
        key = made.method + b" " + made.target + b"\n" + (made.body or b"")
        kept = self.shared.fresh(key)
        if kept is not None:
            _serve(request, kept, self.shared.clock())
            return
        joined = self.shared.join(key)
        if joined is None:
            lead = self.shared.lead(key)
            setattr(request, SHARED_READ, lead)
            request.notifyFinish().addBoth(lambda _: lead.done(None))  # if it ends without one
            self._heavy_slot(request, who, headers, made, producer)
            return

        def answered(answer: shared_reads.Answer | None) -> None:
            if _client_gone(request):
                return
            if answer is None:  # the read it joined ended without an answer: one of its own
                self._heavy_slot(request, who, headers, made, producer)
            else:
                _serve(request, answer, self.shared.clock())

        joined.addCallback(answered)
        joined.addErrback(self._failed, request)

    def _in_turn(
        self,
        request: server.Request,
        who: Mapped,
        slots: Slots,
        mark: str,
        then: Callable[[], None],
        wait: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """`then()` once the request holds one of its user's own turns of `slots` (held until
        its answer ends, `mark` set on it) and has waited the `wait()` seconds asked then; not
        if its client has left meanwhile. An error of either is the client's answer."""
        slot = slots.take_for(request, who.name, shared=False)

        def taken(release: Callable[[], None]) -> Any:
            if not _held_to_its_end(request, release, mark):
                return None
            seconds = wait()
            return task.deferLater(self.reactor, seconds, lambda: None) if seconds else None

        def go(_: Any) -> None:
            if not _client_gone(request):
                then()

        slot.addCallback(taken)
        slot.addCallback(go)
        slot.addErrback(self._failed, request)

    def _write_slot(
        self, request: server.Request, who: Mapped, identity: dict[bytes, bytes], made: gate.Forward
    ) -> None:
        """A user's write waits for one of its user's WRITES_PER_USER at the store, then for
        its documents' turn (Pace, by limits.PACED_DOC_BYTES too): the store validates each
        document in JavaScript, and a user's bulk writes had kept it busy for every other user."""

        def paced() -> None:
            if not _holds(request, BIG_WRITE):
                self.forward(request, who, identity, made)
                return
            big = self.bodies.take_for(request, who.name)
            big.addCallback(lambda release: self._big_write(request, who, identity, made, release))
            big.addErrback(self._failed, request)

        documents = max(made.documents, 1, len(made.body or b"") / limits.PACED_DOC_BYTES)
        self._in_turn(request, who, self.writes, WRITE_SLOT, paced,
                      lambda: self.pace.delay(who.name, documents))  # fmt: skip

    def _light_paced(
        self, request: server.Request, who: Mapped, identity: dict[bytes, bytes], made: gate.Forward
    ) -> None:
        """A user's read that is not heavy (a page, a batch of few changes, a long poll without
        documents) spends its cost from the user's light share (LIGHT_SHARE) and waits until
        the share holds it, within a long poll's own time; past HEAVY_WAIT, 503. What a read
        takes at the store beyond its cost is spent once it is answered (_send)."""
        setattr(request, LIGHT_PACED, True)
        asked_at = time.monotonic()
        seconds = self.light_time.delay(who.name, _light_cost(made))
        if seconds > HEAVY_WAIT:
            self._failed(Failure(Spent(seconds, LIGHT_SPENT_REASON, LIGHT_SHARE)), request)
            return

        def go(_: Any) -> None:
            if not _client_gone(request):
                waited = made if made.poll_ms is None else _less_time(made, asked_at)
                self.forward(request, who, identity, waited)

        later = task.deferLater(self.reactor, seconds, lambda: None).addCallback(go)
        later.addErrback(self._failed, request)

    def _light_done(self, user: str, sent_at: float, cost: float) -> None:
        """A light read answered: what it took at the store beyond the cost it paid to go."""
        extra = time.monotonic() - sent_at - cost
        if extra > 0:
            self.light_time.delay(user, extra)

    def _heavy_paced(
        self, request: server.Request, who: Mapped, identity: dict[bytes, bytes], made: gate.Forward
    ) -> None:
        """A user's heavy read, in its user's turn, waits until the user's heavy reads have
        not had more than their share of the store's time (HEAVY_SHARE; their time at the store
        is spent in _heavy_done), then goes as any heavy read; past HEAVY_WAIT of waiting, 503."""

        self._in_turn(request, who, self.heavy_turns, PACED,
                      lambda: self.forward(request, who, identity, made),
                      lambda: self._share_wait(who.name))  # fmt: skip

    def _share_wait(self, name: str) -> float:
        """Seconds until the user's heavy reads are back within their share (HEAVY_SHARE);
        Spent past HEAVY_WAIT."""
        seconds = self.heavy_time.delay(name, 0)
        if seconds > HEAVY_WAIT:
            raise Spent(seconds)
        return seconds

    def _poll_paced(
        self, request: server.Request, who: Mapped, identity: dict[bytes, bytes], made: gate.Forward
    ) -> None:
        """A user's long poll with documents waits, within its own time, until the user's
        heavy reads are within their share (its answer's bytes are spent from it: _poll); past
        HEAVY_WAIT, 503. It takes no heavy read's turn: it may wait a minute for a change."""
        setattr(request, PACED, True)
        self._within_share(
            request, who, made, lambda less: self.forward(request, who, identity, less)
        )

    def _within_share(
        self,
        request: server.Request,
        who: Mapped,
        made: gate.Forward,
        then: Callable[[gate.Forward], None],
    ) -> None:
        """`then(made)`, the time waited taken off its poll's, once the user's heavy reads are
        back within their share (a client gone meanwhile: never); past HEAVY_WAIT, 503."""
        asked_at = time.monotonic()
        try:
            seconds = self._share_wait(who.name)
        except Spent:
            self._failed(Failure(), request)
            return

        def go(_: Any) -> None:
            if not _client_gone(request):
                then(_less_time(made, asked_at))

        task.deferLater(self.reactor, seconds, lambda: None).addCallback(go)

    def _read_slot(
        self, request: server.Request, who: Mapped, identity: dict[bytes, bytes], made: gate.Forward
    ) -> None:
        """A user's light read waits for one of its user's READS_PER_USER, held until its
        answer ends: a page costs the store little, but one user's many at once had queued
        everyone's reads of that view behind them (heavy reads wait in their user's own turn)."""
        self._in_turn(request, who, self.reads, READ_SLOT,
                      lambda: self.forward(request, who, identity, made))  # fmt: skip

    def _big_write(
        self,
        request: server.Request,
        who: Mapped,
        identity: dict[bytes, bytes],
        made: gate.Forward,
        release: Callable[[], None],
    ) -> None:
        """A user's large write, its turn and pace through, sent holding a large body's slot
        until its answer (the store parses it too)."""
        if _client_gone(request):  # notifyFinish would never fire
            self._body_done(release)
            return
        request.notifyFinish().addBoth(lambda _: self._body_done(release))
        self.forward(request, who, identity, made)

    def _poll_slot(
        self, request: server.Request, who: Mapped, identity: dict[bytes, bytes], made: gate.Forward
    ) -> None:
        """A user's long poll waits for one of its user's `frontend.polls_per_user` and of all
        users' `frontend.polls` at the store: every write wakes every poll the store holds (400
        of one user's had slowed the others' reads to 17 s). It waits within its own time, and
        one that waited it all ends as a quiet poll ends."""
        asked_at = time.monotonic()

        def taken(release: Callable[[], None]) -> None:
            if _held_to_its_end(request, release, POLL_SLOT):
                self.forward(request, who, identity, _less_time(made, asked_at))

        # Its `since` is a sequence: `now` was read before it waited.
        self._poll_turn(self.polls, request, who, made, taken)

    def _poll_turn(
        self,
        slots: Slots,
        request: server.Request,
        who: Mapped,
        made: gate.Forward,
        taken: Callable[[Callable[[], None]], None],
        shared: bool = True,
    ) -> None:
        """`taken(release)` once the user's turn of `slots` comes within the long poll's own
        time; a poll that waited it all ends as a quiet poll ends (_ends_quiet)."""
        assert made.poll_ms is not None
        slot = slots.take_for(request, who.name, shared, wait=max(made.poll_ms / 1000, 0.001))
        slot.addCallbacks(taken, _ends_quiet, errbackArgs=(request, made))
        slot.addErrback(self._failed, request)

    def _check_nodes(
        self,
        request: server.Request,
        who: Mapped,
        headers: dict[bytes, list[bytes]],
        made: gate.Forward,
    ) -> None:
        """A `since` naming nodes the front end has not seen goes on only once the store's own
        sequence names them (aso.frontend.sequences): CouchDB would make an atom of any name in
        it."""
        if self.nodes_waiting is None:
            if time.monotonic() - self.nodes_read_at < NODES_REFRESH:
                self._unknown_nodes(request, made)
                return
            self._read_nodes(made, headers)
        assert self.nodes_waiting is not None
        waited: defer.Deferred[None] = defer.Deferred()
        self.nodes_waiting.append(waited)

        def learned(_: None) -> None:
            if made.nodes - self.store_nodes:
                self._unknown_nodes(request, made)
                return
            self.forward(request, who, {k: v[0] for k, v in headers.items()}, made)

        self._within_poll(waited, made).addCallback(learned).addErrback(self._failed, request)

    def _read_nodes(self, made: gate.Forward, headers: dict[bytes, list[bytes]]) -> None:
        """Read the store's sequence once for every request that comes while it is read (a
        client's polls sent at once had all but the first refused)."""
        self.nodes_read_at = time.monotonic()
        self.nodes_waiting = []

        def learned(seq: str) -> None:
            self.store_nodes |= sequences.check(seq)

        def tell(result: Any) -> None:
            waiting, self.nodes_waiting = self.nodes_waiting or [], None
            for waited in waiting:
                if waited.called:  # its poll's time ran out meanwhile
                    continue
                if isinstance(result, Failure):
                    waited.errback(result)
                else:
                    waited.callback(None)

        self._update_seq(made, headers).addCallback(learned).addBoth(tell)

    def _unknown_nodes(self, request: server.Request, made: gate.Forward) -> None:
        REFUSALS.tell("gate", "since naming nodes %s", sorted(made.nodes - self.store_nodes)[:3])
        _answer(request, 400, "bad_request", "since must be a sequence this store handed out "
                "(it names a node the store does not have)")  # fmt: skip

    def _update_seq(
        self, made: gate.Forward, headers: dict[bytes, list[bytes]]
    ) -> defer.Deferred[str]:
        """The current sequence of the database `made` asks, read as the same user."""
        info = self.agent.request(b"GET", self.store_url + b"/" + _db_of(made), Headers(headers))
        body = info.addCallback(client.readBody)
        return body.addCallback(lambda text: str(json.loads(text)["update_seq"]))

    def _within_poll(self, asked: defer.Deferred[T], made: gate.Forward) -> defer.Deferred[T]:
        """What a long poll asks the store before it begins, bounded by the poll's own time: a
        store too busy to answer by then is busy (503), not unreachable."""
        if made.poll_ms is not None:
            asked.addTimeout(made.poll_ms / 1000 + POLL_GRACE, self.reactor, _store_busy)
        return asked

    def _poll_from_now(
        self,
        request: server.Request,
        who: Mapped,
        headers: dict[bytes, list[bytes]],
        made: gate.Forward,
    ) -> None:
        """A long poll `since=now` asks from the database's current sequence, so that a quiet
        one ends with a `last_seq` the next poll can start from (the embedded store would
        answer "now")."""
        asked_at = time.monotonic()
        seq = self._within_poll(self._update_seq(made, headers), made)
        now = seq.addCallback(lambda seq: _less_time(gate.with_since(made, seq), asked_at))
        now.addCallback(lambda from_now: self.forward(request, who, {
            k: v[0] for k, v in headers.items()}, from_now))  # fmt: skip
        now.addErrback(self._failed, request)

    def _send(
        self,
        request: server.Request,
        who: Mapped,
        headers: dict[bytes, list[bytes]],
        made: gate.Forward,
        producer: IBodyProducer | None,
        release: Callable[[], None] | None = None,
        head: str | None = None,
    ) -> None:
        if _client_gone(request):
            if release is not None:
                release()
            return
        if release is not None and not isinstance(release, _Once | Turn):
            release = _Once(release)  # given back once, whichever way this ends
        batch = made.poll_ms is None and made.route.kind == "poll" and _user_only(who)
        polled = made.poll_ms is not None and _user_only(who)
        if made.filtered and (batch or polled) and head is None:
            # EMBEDDED_FILTERED_LAST_SEQ: the sequence read first is where a batch that finds
            # nothing ends, and where a long poll waits from once it has caught up.
            asked_at = time.monotonic()
            read = self._within_poll(self._update_seq(made, headers), made)

            def then(seq: str) -> None:
                if batch:
                    self._send(request, who, headers, made, producer, release, seq)
                    return
                if release is not None:  # a poll's turns are its catch-up's (forward takes none)
                    release()
                self._catch_up(request, who, headers, _less_time(made, asked_at), seq)

            def failed(failure: Any) -> None:
                if release is not None:
                    release()
                self._failed(failure, request)

            read.addCallbacks(then, failed)
            return
        if release is not None:
            # A client that does not read holds its slot (the store's side waits for it):
            # not for longer than HEAVY_HOLD past the time a long poll may wait for a change.
            waits = made.poll_ms / 1000 + POLL_GRACE if made.poll_ms is not None else 0.0
            hold = self.reactor.callLater(waits + HEAVY_HOLD, _cut, request)
            request.notifyFinish().addBoth(lambda _: hold.cancel() if hold.active() else None)
        # The store's work done (read whole, or paused by a client not reading), a heavy read
        # gives back its shared slot and keeps its user's queue until the client has its answer.
        share_back = release.share_back if isinstance(release, Turn) else None
        via = self.feeds if made.poll_ms is not None else self.agent
        sent_at = time.monotonic()
        lead = getattr(request, SHARED_READ, None)
        if lead is not None:
            lead.sent_at = self.shared.clock()
        sent = via.request(made.method, self.store_url + made.target, Headers(headers), producer)
        counted = None
        if _holds(request, LIGHT_PACED) and made.poll_ms is None:
            cost = _light_cost(made)
            sent.addBoth(_after, lambda: self._light_done(who.name, sent_at, cost))
        if made.heavy and made.poll_ms is None:
            charged = who.name if isinstance(release, Turn) and release.shares else None
            sent.addBoth(_after, lambda: self._heavy_done(charged, sent_at))
            if charged is not None and made.with_docs:
                counted = functools.partial(self._docs_read, charged)
        if isinstance(release, Turn) and release.shares and made.poll_ms is None:
            self._bound_work(sent, request, release)
        else:
            request.notifyFinish().addErrback(lambda _: sent.cancel())  # gone before the answer
            if release is not None:  # given back when the answer has gone out, or the client
                request.notifyFinish().addBoth(lambda _: release())
        if made.route.kind in ("write", "create"):
            sent.addCallback(self._written, request, who, headers, made)
        elif made.poll_ms is not None:
            paced = made.with_docs and _user_only(who)
            self._poll(sent, request, made, _user_only(who), who.name if paced else None)
        elif batch:
            self._whole(sent, request, head, read_whole=share_back, counted=counted)
        else:
            sent.addCallback(self._relay, request, share_back, counted)
        sent.addErrback(self._upstream_failed, request)

    def _docs_read(self, user: str, size: int) -> None:
        """A user's read with documents answered: its bytes are spent from the user's heavy
        share too (DOC_BYTES), whether the client took them or not."""
        self.heavy_time.delay(user, size / DOC_BYTES)

    def _heavy_done(self, user: str | None, sent_at: float) -> None:
        """A heavy read answered: its whole time at the store, from its sending to its answer,
        is spent from its user's share (a user's). Counted from the end of whichever heavy read
        was answered before it, any other client's heavy reads ending while hers ran had cut
        her charge to nothing (round 26); a read that waited behind another's pays the wait."""
        if user is not None:
            self.heavy_time.delay(user, time.monotonic() - sent_at)

    def _bound_work(self, sent: defer.Deferred[Any], request: server.Request, turn: Turn) -> None:
        """A user's heavy read holds its turn while the store works for it, whatever its
        client does: the embedded store goes on with a view's work when its client leaves, so
        a read left or cut had let a user pile up work at the store, the next sent at once.
        Its client is answered 503 if the store's answer has not started within
        USER_HEAVY_WORK; the turn is given back when the store answers (its answer dropped),
        or after HEAVY_STORE_CAP, when the store's side is closed."""

        def too_long() -> None:
            log.warning("refused %s: no answer from the store within %g s", _path(request),
                        USER_HEAVY_WORK)  # fmt: skip
            _answer(request, 503, "too_costly", USER_HEAVY_WORK_REASON.format(USER_HEAVY_WORK))

        def answered() -> None:
            for timer in (refusal, cap):
                if timer.active():
                    timer.cancel()

        refusal = self.reactor.callLater(USER_HEAVY_WORK, too_long)
        cap = self.reactor.callLater(HEAVY_STORE_CAP, sent.cancel)
        sent.addBoth(_after, answered)

        def ended(_: Any) -> None:
            if refusal.active():
                refusal.cancel()
            if sent.called:
                turn()
            else:
                sent.addBoth(_after, turn)

        request.notifyFinish().addBoth(ended)

    def _catch_up(
        self,
        request: server.Request,
        who: Mapped,
        headers: dict[bytes, list[bytes]],
        made: gate.Forward,
        head: str,
    ) -> None:
        """A user's filtered long poll from behind the database's sequence `head`: asked first
        as a batch up to now, answered with it if it found a change, else waiting from `head`.
        The embedded store's filtered poll reads the changes from `since` again at every write
        (it moves on only at a change of the ids): four polls from 0 had kept it 83% busy."""
        if _client_gone(request):
            return
        # The catch-up is a filtered batch and costs what one costs: it waits for its user's
        # share of the store's time, its time and bytes are spent from it, and its turn is held
        # until the store has answered, whatever the client does (round 27: polls with a timeout
        # of 1 ms had left scans of the whole feed running at the store, uncharged, 57 s of
        # them piled up after one minute). CouchDB's feed moves on by itself: a poll as asked,
        # after the same wait.
        self._within_share(
            request, who, made, lambda less: self._caught_up_from(request, who, headers, less, head)
        )

    def _caught_up_from(
        self,
        request: server.Request,
        who: Mapped,
        headers: dict[bytes, list[bytes]],
        made: gate.Forward,
        head: str,
    ) -> None:
        """_catch_up, within its user's share."""
        if _client_gone(request):
            return
        waiting = gate.with_since(made, head)
        if not (sequences.is_number(head) and sequences.is_number(made.since or "")):
            self._wait_from(request, who, headers, made, head)  # CouchDB's feed moves on
            return
        if int(made.since or 0) >= int(head):
            self._wait_from(request, who, headers, waiting, head)
            return
        asked_at = time.monotonic()
        assert made.poll_ms is not None
        poll_time = made.poll_ms / 1000

        def taken(release: Callable[[], None]) -> None:
            if _client_gone(request):  # notifyFinish would never fire: given back now
                release()
                return
            batch = gate.as_batch(made)
            sent_at = time.monotonic()
            sent = self.agent.request(batch.method, self.store_url + batch.target,
                                      Headers(headers), _producer_of(batch))  # fmt: skip
            cap = self.reactor.callLater(HEAVY_STORE_CAP, sent.cancel)

            def quiet() -> None:
                # The poll's time is out: its client has its quiet answer, from where it asked;
                # the store's work goes on in the user's turn.
                if not request.finished and not _client_gone(request):
                    _answer_json(request, 200, _quiet_body(made))

            left = poll_time - (time.monotonic() - asked_at)
            timer = self.reactor.callLater(max(left, 0.001) + POLL_GRACE, quiet)

            def store_done() -> None:
                for pending in (cap, timer):
                    if pending.active():
                        pending.cancel()
                self._heavy_done(who.name, sent_at)
                release()

            done = _Once(store_done)
            sent.addErrback(_after, done)

            def wait_from_head() -> None:
                self._wait_from(request, who, headers, _less_time(waiting, asked_at), head)

            self._whole(sent, request, head, then=wait_from_head, read_whole=done,
                        counted=functools.partial(self._docs_read, who.name),
                        whatever_the_client=True)  # fmt: skip
            sent.addErrback(_quiet_if_open, request, made)
            sent.addErrback(self._upstream_failed, request)

        self._poll_turn(self.heavy, request, who, made, taken)

    def _wait_from(
        self,
        request: server.Request,
        who: Mapped,
        headers: dict[bytes, list[bytes]],
        made: gate.Forward,
        head: str,
    ) -> None:
        """A user's filtered long poll sent to wait (its catch-up done): one with documents
        first takes its user's heavy queue, as forward has any other user's poll with them."""
        if not made.with_docs:
            self._send(request, who, headers, made, _producer_of(made), head=head)
            return

        def taken(release: Callable[[], None]) -> None:
            self._send(request, who, headers, made, _producer_of(made), release, head)

        self._poll_turn(self.heavy, request, who, made, taken, shared=False)

    def _whole(
        self,
        sent: defer.Deferred[Any],
        request: server.Request,
        head: str | None = None,
        then: Callable[[], None] | None = None,
        read_whole: Callable[[], None] | None = None,
        counted: Callable[[int], None] | None = None,
        whatever_the_client: bool = False,
    ) -> None:
        """A user's `_changes` batch, read whole (at most MAX_POLL_BYTES, as a long poll's) and
        sent without the store's own rows, ending at `head` if it found nothing (settled).
        `then`: called instead when it found nothing (a long poll goes on from `head`);
        `read_whole`: called once the store's answer is read whole (or cut as too large);
        `whatever_the_client`: read to its end even once the client has left or had its answer
        (the embedded store goes on with a batch whose reader left: its user's turn waits)."""

        def answered(response: Any) -> None:
            def whole(body: bytes) -> None:
                if read_whole is not None:
                    read_whole()
                if request.finished or _client_gone(request):
                    return
                if then is not None and response.code == 200 and _quiet_seq(body) is not None:
                    then()
                    return
                kept = threads.deferToThreadPool(
                    self.reactor, self.reactor.getThreadPool(), settled, body, head
                )
                kept.addCallback(lambda rows: _send_whole(request, response, rows, self.reactor))
                kept.addErrback(self._upstream_failed, request)

            def too_large() -> None:
                if read_whole is not None:
                    read_whole()
                if not request.finished:
                    _poll_too_large(request)

            collector = _Collect(whole, too_large, counted=counted)
            if not whatever_the_client:
                request.notifyFinish().addErrback(lambda _: collector.drop())
            response.deliverBody(collector)

        sent.addCallback(answered)

    def _without_store_rows(self, filtered: bool, body: bytes) -> defer.Deferred[bytes]:
        if not filtered:
            return defer.succeed(body)
        return threads.deferToThreadPool(
            self.reactor, self.reactor.getThreadPool(), without_store_rows, body
        )

    def _poll(
        self,
        sent: defer.Deferred[Any],
        request: server.Request,
        made: gate.Forward,
        filtered: bool = False,
        paced: str | None = None,
    ) -> None:
        """A long poll, bounded: its answer is read whole and sent once it is complete (its
        bytes spent from the heavy share of the user `paced`, DOC_BYTES); at its
        timeout it ends as CouchDB ends one (COUCHDB_FEED_ENDS_AT_TIMEOUT), with no results
        and the sequence it was asked from, on both stores: the embedded store never ends a
        long poll itself (EMBEDDED_FEED_NEVER_TIMES_OUT) and sends the head of its answer
        before any change. Heartbeats (blank lines, as CouchDB sends them) are the front end's
        own, so that no part of an answer is sent before it is whole."""
        assert made.poll_ms is not None
        beat_ms = made.heartbeat_ms or 0
        timers: list[Any] = []
        begun = ended = False

        def begin() -> None:
            nonlocal begun
            if not begun:
                begun = True
                request.setResponseCode(200)
                request.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])

        def end(code: int, phrase: bytes, headers: Any, body: bytes | None) -> None:
            nonlocal ended
            ended = True
            if paced is not None and body is not None:  # the store's work, read or not
                self.heavy_time.delay(paced, len(body) / DOC_BYTES)
            for timer in timers:
                if timer.active():
                    timer.cancel()
            if _client_gone(request):
                return
            if body is None:
                request.loseConnection()
                return
            if not begun:
                request.setResponseCode(code, phrase)
                if headers is not None:
                    _copy_headers_of(headers, request, feed=True)
            elif code != 200:
                log.warning(
                    "a long poll's answer %d came after its heartbeats: %s", code, body[:200]
                )
            # As its client reads it: the poll's turns are held until then (pipelined polls
            # of 43 MB answers, each written at once, had grown the front end by 1.4 GB).
            _send_paced(request, body, self.reactor)

        def beat() -> None:
            if _client_gone(request):
                return
            begin()
            request.write(b"\n")
            timers.append(self.reactor.callLater(beat_ms / 1000, beat))

        collectors: list[_Collect] = []

        def too_large() -> None:
            reason = (f"the answer to this long poll is larger than {MAX_POLL_BYTES >> 20} MiB; "
                      "ask with a smaller limit")  # fmt: skip
            body = json.dumps({"error": "bad_gateway", "reason": reason}).encode() + b"\n"
            end(502, b"Bad Gateway", Headers({b"content-type": [b"application/json"]}), body)

        def whole(response: Any, body: bytes) -> None:
            kept = self._without_store_rows(filtered, body)
            kept.addCallback(lambda rows: end(response.code, response.phrase, response.headers,
                                              rows))  # fmt: skip
            kept.addErrback(self._upstream_failed, request)

        def answered(response: Any) -> None:
            collector = _Collect(lambda body: whole(response, body), too_large)
            collectors.append(collector)
            request.notifyFinish().addErrback(lambda _: collector.drop())
            response.deliverBody(collector)

        def expire() -> None:
            # Answered first: the store's side, cut after, fails a request already finished
            # (a cancelled send fails with ResponseNeverReceived, not CancelledError).
            end(200, b"OK", Headers({b"content-type": [b"application/json"]}), _quiet_body(made))
            if collectors:
                collectors[0].drop()
            else:
                sent.cancel()

        def after_the_end(failure: Any) -> Any:
            # The store's side cut once the poll has its answer (at its timeout): the answer
            # goes out as the client reads it, and the cut is no failure of it.
            return None if ended else failure

        sent.addCallback(answered)
        sent.addErrback(after_the_end)
        timers.append(self.reactor.callLater(made.poll_ms / 1000 + POLL_GRACE, expire))
        if beat_ms:
            timers.append(self.reactor.callLater(beat_ms / 1000, beat))
        request.notifyFinish().addBoth(lambda _: [t.cancel() for t in timers if t.active()])

    def _relay(
        self,
        response: Any,
        request: server.Request,
        paused: Callable[[], None] | None = None,
        counted: Callable[[int], None] | None = None,
    ) -> None:
        if _client_gone(request):
            response.deliverBody(_Dropped())
            return
        request.setResponseCode(response.code, response.phrase)
        _copy_headers(response, request)
        lead = getattr(request, SHARED_READ, None)
        if lead is None:
            response.deliverBody(_Relay(request, paused, counted))
        else:
            response.deliverBody(_KeptRelay(request, paused, response, lead, self.shared.clock))

    @defer.inlineCallbacks
    def _written(
        self,
        response: Any,
        request: server.Request,
        who: Mapped,
        headers: dict[bytes, list[bytes]],
        made: gate.Forward,
    ) -> Any:
        """A write's answer, read whole: a refusal that is a conflict is a 409 on both stores
        (conflicts_to_409), and a creation's conflicts say whether the same request is recorded
        already (docs/status-api.md): the store says only "Document update conflict.", and a
        job wrapper should not need a second round trip to know whether its upload is done. The
        stored requests are read once, as the same user, for all conflicts."""
        body = yield client.readBody(response)
        code, phrase = response.code, response.phrase
        try:
            code, body = conflicts_to_409(code, body)
            phrase = http.RESPONSES.get(code, phrase)
            conflicts = {}
            if made.route.kind == "create" and b'"conflict"' in body:
                # Parsed off the reactor, and only when the store names a conflict (every
                # creation of 9 MB had been parsed again on the reactor's thread).
                conflicts = yield threads.deferToThreadPool(
                    self.reactor, self.reactor.getThreadPool(), conflicts_of, made, body
                )
            if conflicts:
                # A read that carries documents, as any other: in the user's turn, parsed off the
                # reactor (batches of conflicts had slowed every other user's answers).
                # The turn is held until they are explained, and what is read of the stored
                # requests is bounded (EXPLAIN_BYTES): 1000 creations naming large requests had
                # made the front end read and parse 44 MB in its own interpreter.
                release = yield self.heavy.take_for(request, who.name, service=not _user_only(who))
                try:
                    keys = json.dumps({"keys": sorted(conflicts)}).encode()
                    db = _db_of(made)
                    read = yield self.agent.request(
                        b"POST",
                        self.store_url + b"/" + db + b"/_all_docs?include_docs=true",
                        Headers({**headers, b"content-type": [b"application/json"]}),
                        cast(IBodyProducer, FileBodyProducer(BytesIO(keys))),
                    )
                    stored_body = yield _read_bounded(read, EXPLAIN_BYTES)
                    if stored_body is not None:
                        body = yield threads.deferToThreadPool(
                            self.reactor, self.reactor.getThreadPool(), _explained, body,
                            conflicts, stored_body, who.name,
                        )  # fmt: skip
                    else:
                        told = "conflicts of %s told as the store told them: over %d bytes"
                        log.info(told, _path(request), EXPLAIN_BYTES)
                finally:
                    release()
        except Busy:
            pass  # the conflicts are told as the store told them
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("conflicts of %s not explained: %s", _path(request), exc)
        try:
            if b'"forbidden"' in body or b'"conflict"' in body:
                body = yield threads.deferToThreadPool(
                    self.reactor, self.reactor.getThreadPool(), coded, body
                )
        except (ValueError, TypeError) as exc:
            log.warning("refusals of %s not coded: %s", _path(request), exc)
        if _client_gone(request):
            return
        request.setResponseCode(code, phrase)
        _copy_headers(response, request)
        request.write(body)
        request.finish()

    def _upstream_failed(self, failure: Any, request: server.Request) -> None:
        if failure.check(defer.CancelledError) or _client_gone(request) or request.finished:
            return
        log.error("store unreachable for %s: %s", _path(request), failure.getErrorMessage())
        _answer(request, 502, "bad_gateway", "the document store is unreachable")


def _less_time(made: gate.Forward, since: float) -> gate.Forward:
    """`made` with the time spent since `since` (monotonic) taken off its poll's time."""
    assert made.poll_ms is not None
    spent = int((time.monotonic() - since) * 1000)
    return dataclasses.replace(made, poll_ms=max(made.poll_ms - spent, 0))


def _quiet_if_open(failure: Any, request: server.Request, made: gate.Forward) -> None:
    """A catch-up's store call that failed once its client had its answer (or left): nothing
    more to tell; else the failure goes on."""
    if request.finished or _client_gone(request):
        return None
    return cast(None, failure)


def _ends_quiet(failure: Any, request: server.Request, made: gate.Forward) -> None:
    """A long poll that waited its whole time for its turn ends as a quiet poll ends."""
    failure.trap(Busy)
    _answer_json(request, 200, _quiet_body(made))


def _quiet_body(made: gate.Forward) -> bytes:
    """A long poll's answer when nothing changed: CouchDB's, on both stores."""
    assert made.since is not None
    return (
        json.dumps({"results": [], "last_seq": sequences.as_written(made.since)}).encode() + b"\n"
    )


# A request's marks (set on it) that it holds a slot of its kind, taken once before it is sent.
WRITE_SLOT, POLL_SLOT, READ_SLOT = "aso_write_slot", "aso_poll_slot", "aso_read_slot"
SHARED_READ = "aso_shared_read"  # the Lead of an operator's reduce read (FrontEnd._shared_read)
PACED = "aso_heavy_paced"  # a user's heavy read: its turn taken, its share of the store waited for
LIGHT_PACED = "aso_light_paced"  # a user's other read: its cost spent from the light share
BIG_WRITE = "aso_big_write"  # a user's large write: its large body's slot taken again to send it


def _holds(request: server.Request, mark: str) -> bool:
    return bool(getattr(request, mark, False))


def _held_to_its_end(request: server.Request, release: Callable[[], None], mark: str) -> bool:
    """A slot taken for `request`: held until its answer ends, and `mark` set on it; False
    (and the slot given back) if its client left meanwhile."""
    if _client_gone(request):  # notifyFinish would never fire
        release()
        return False
    request.notifyFinish().addBoth(lambda _: release())
    setattr(request, mark, True)
    return True


def _light_read(made: gate.Forward) -> bool:
    """A read whose cost a page bounds: not heavy, no documents, no long poll."""
    return made.route.kind in READS and made.poll_ms is None and not (made.heavy or made.with_docs)


def _user_only(who: Mapped) -> bool:
    """A grid user and nothing more: not an agent or an operator."""
    return not routes.audiences_of(who.roles) & routes.SERVICES


# A row of an id starting with `_` as both stores write `_changes` (compact JSON).
_STORE_ROW = re.compile(rb'"id"\s*:\s*"_')


def without_store_rows(body: bytes) -> bytes:
    """(In a thread.) A `_changes` answer without its rows of ids starting with `_`: design
    documents (the validation, the agents' views) are not a user's to read. Parsed only when
    such a row may be there (design documents change at `aso db init` only)."""
    if not _STORE_ROW.search(body):
        return body
    try:
        got = json.loads(body)
        results = got["results"]
    except (ValueError, KeyError, TypeError):
        return body  # an error the store answered
    got["results"] = [r for r in results if not _store_row(r)]
    return json.dumps(got, separators=(",", ":")).encode() + b"\n"


def settled(body: bytes, head: str | None) -> bytes:
    """(In a thread.) A `_changes` batch without its store rows (without_store_rows), whose
    `last_seq` is at least `head`, the database's sequence read before it, when it found
    nothing (EMBEDDED_FILTERED_LAST_SEQ: the embedded store ends such a batch at `since`, so a
    client following quiet files read the same history again at every poll). Only a quiet
    answer, a few bytes, is looked at: parsing a batch of documents had held every client."""
    quiet = _quiet_seq(body)
    numbered = head is not None and sequences.is_number(head)
    if quiet is not None and numbered and int(cast(str, head)) > quiet:
        return b'{"results":[],"last_seq":%d}\n' % int(cast(str, head))
    return without_store_rows(body)


# A batch with no result, as the embedded store writes it (its sequences are numbers).
_QUIET = re.compile(
    rb'\s*\{\s*"results"\s*:\s*\[\s*\]\s*,\s*"last_seq"\s*:\s*([0-9]{1,18})\s*\}\s*'
)
QUIET_BYTES = 256


def _quiet_seq(body: bytes) -> int | None:
    """The `last_seq` of a batch that found nothing (a number), None for any other answer."""
    quiet = _QUIET.fullmatch(body) if len(body) <= QUIET_BYTES else None
    return int(quiet.group(1)) if quiet else None


class _Once:
    """`call` made once, however often this is called."""

    def __init__(self, call: Callable[[], None]):
        self.call: Callable[[], None] | None = call

    def __call__(self) -> None:
        call, self.call = self.call, None
        if call is not None:
            call()


def _producer_of(made: gate.Forward) -> IBodyProducer | None:
    """The body of the store request `made`, sent once (a new producer for each request)."""
    if made.body is not None:
        return cast(IBodyProducer, FileBodyProducer(BytesIO(made.body)))
    if made.method in BODY:
        return cast(IBodyProducer, FileBodyProducer(BytesIO(b"")))
    return None


def _store_row(row: Any) -> bool:
    return isinstance(row, dict) and str(row.get("id", "")).startswith("_")


class _PacedBody:
    """A body written a piece at a time, each when the client has taken the last (a pull
    producer), then the request finished."""

    PIECE = 1 << 16

    def __init__(self, request: server.Request, body: bytes):
        self.request, self.body, self.at = request, memoryview(body), 0

    def resumeProducing(self) -> None:
        if self.at >= len(self.body):
            self.request.unregisterProducer()
            self.request.finish()
            return
        self.request.write(bytes(self.body[self.at : self.at + self.PIECE]))
        self.at += self.PIECE

    def stopProducing(self) -> None:
        self.at = len(self.body)


def _send_whole(request: server.Request, response: Any, body: bytes, clock: Any) -> None:
    """The store's answer `response` to the client, with `body` for its body; cut if the
    client has not read it within HEAVY_HOLD (what it holds is given back when it ends)."""
    if _client_gone(request):
        return
    request.setResponseCode(response.code, response.phrase)
    _copy_headers(response, request, feed=True)
    if request.method != b"HEAD":  # a HEAD's store answer has no body: its length is not told
        request.setHeader(b"content-length", b"%d" % len(body))
    _send_paced(request, body, clock)


def _send_paced(request: server.Request, body: bytes, clock: Any) -> None:
    """`body` sent as fast as the client reads it: the request (and what it holds) ends only
    then, or at the cut if the client has not read it within HEAVY_HOLD."""
    hold = clock.callLater(HEAVY_HOLD, _cut, request)
    request.notifyFinish().addBoth(lambda _: hold.cancel() if hold.active() else None)
    request.registerProducer(_PacedBody(request, body), False)


def _poll_too_large(request: server.Request) -> None:
    reason = (f"the answer is larger than {MAX_POLL_BYTES >> 20} MiB; "
              "ask with a smaller limit")  # fmt: skip
    _answer(request, 502, "bad_gateway", reason)


def _gate_check(
    request: server.Request, who: Mapped, checks: BodyChecks
) -> gate.GateRefusal | gate.Forward:
    """(In a thread.) The gate's verdict on the request as received, its body read here."""
    content = cast(BinaryIO, request.content)
    content.seek(0)
    asked = Asked(
        request.method,
        request.uri,
        content.read(),
        routes.audiences_of(who.roles),
        cast(_BoundedRequest, request).aso_content_type,
        who.name,
    )
    return checks.check(who.name, asked)


def _light_cost(made: gate.Forward) -> float:
    """What a read pays of its user's light share to go (0: not paced by it): a long poll
    without documents POLL_COST, any other read that is not heavy LIGHT_COST. Heavy reads and
    reads with documents are paced by the heavy share, writes by their documents."""
    if made.route.kind not in READS or made.with_docs:
        return 0.0
    if made.poll_ms is not None:
        return POLL_COST
    return 0.0 if made.heavy else LIGHT_COST


def _after(result: T, done: Callable[[], None]) -> T:
    """A Deferred's callback and errback both: `done()`, the result passed on as it was."""
    done()
    return result


def _cut(request: server.Request) -> None:
    if not request.finished and not _client_gone(request):
        log.warning("cut %s: not read within %g s", _path(request), HEAVY_HOLD)
        _transport(request.channel).abortConnection()


def _db_of(made: gate.Forward) -> bytes:
    """The database a forwarded request names (its first path segment, as sent)."""
    return made.target.partition(b"?")[0].split(b"/")[1]


def _is_agent(who: Mapped) -> bool:
    return model.AGENT_ROLE in who.roles


def _is_operator(who: Mapped) -> bool:
    """An operator and not an agent: a person at the pages, whose reads may be shared."""
    return routes.OPERATOR in routes.audiences_of(who.roles) and not _is_agent(who)


def _serve(request: server.Request, answer: shared_reads.Answer, now: float) -> None:
    """A kept (or shared) store answer as this request's, with its age."""
    if _client_gone(request):
        return
    request.setResponseCode(answer.code, answer.phrase)
    _copy_headers_of(answer.headers, request)
    request.setHeader(b"age", b"%d" % max(now - answer.at, 0))
    request.write(answer.body)
    request.finish()


def _explained(body: bytes, conflicts: dict[str, Any], stored_body: bytes, caller: str) -> bytes:
    rows = json.loads(stored_body)["rows"]
    stored = {r["key"]: r.get("doc") for r in rows if isinstance(r, dict)}
    return explain(body, conflicts, stored, caller)


def cross_site(
    request: server.Request, origins: frozenset[bytes], pages: bytes
) -> gate.GateRefusal | None:
    """A request that a page of another site makes a browser send, with the certificate the
    browser holds (a user's, an operator's): refused, reads too (a page had made an operator's
    browser run heavy reads in the operator's name, past users' bounds), but for a link
    followed to the monitoring pages (`pages`: their path). Browsers say where a request comes
    from (Sec-Fetch-Site, Origin); a client that is no browser sends neither. An Origin must
    be one of the front end's own (`origins`), not whatever Host the request names."""
    site = request.getHeader(b"sec-fetch-site")
    origin = request.getHeader(b"origin")
    # Scheme and host are case-insensitive (RFC 3986 6.2.2.1); `origins` is lower case.
    foreign = site in (b"cross-site", b"same-site") or (
        origin is not None and origin.lower() not in origins
    )
    if not foreign:
        return None
    if request.method in (b"GET", b"HEAD") and _opens_the_pages(request, pages):
        return None
    kind = "read" if request.method in (b"GET", b"HEAD") else "write"
    return gate.GateRefusal(403, "forbidden", f"a {kind} from another site's page is refused")


def _opens_the_pages(request: server.Request, pages: bytes) -> bool:
    """A top-level navigation (a link followed, an address typed) to the monitoring pages."""
    navigates = (request.getHeader(b"sec-fetch-mode"), request.getHeader(b"sec-fetch-dest")) == (
        b"navigate",
        b"document",
    )
    return navigates and request.uri.startswith(pages)


def own_origins(config: Config) -> frozenset[bytes]:
    """The front end's origins: https, each name and address of its host certificate, the port
    it listens on (a browser reaches it by no other name without a certificate error)."""
    fe = config.frontend
    cert = x509.load_pem_x509_certificate(config.path(fe.host_cert).read_bytes())
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        hosts = [str(h) for h in names.get_values_for_type(x509.DNSName)]
        hosts += [f"[{a}]" if a.version == 6 else str(a)
                  for a in names.get_values_for_type(x509.IPAddress)]  # fmt: skip
    except x509.ExtensionNotFound:
        hosts = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    port = int(fe.listen.rpartition(":")[2])
    suffixes = [f":{port}", ""] if port == 443 else [f":{port}"]
    return frozenset(f"https://{h.lower()}{p}".encode() for h in hosts for p in suffixes)


def _copy_headers(response: Any, request: server.Request, feed: bool = False) -> None:
    _copy_headers_of(response.headers, request, feed)


def _copy_headers_of(headers: Any, request: server.Request, feed: bool = False) -> None:
    """Of the store's answer headers, those that describe the answer (STORE_ANSWER_HEADERS):
    not its framing (each hop's own), cookies (a store session would bypass the front end) or
    what names the store's software. A user's feed (`feed`) has no ETag: the store's names its
    answer before the front end took the store's own rows out."""
    for name, values in headers.getAllRawHeaders():
        lowered = name.lower()
        if lowered not in STORE_ANSWER_HEADERS or (feed and lowered == b"etag"):
            continue
        if lowered == b"location":  # the store's own address is not the client's business
            values = [urlsplit(v.decode("latin-1")).path.encode("latin-1") for v in values]
        request.responseHeaders.setRawHeaders(name, values)


# EMBEDDED_VALIDATES_BEFORE_CONFLICT: the embedded store runs validate_doc_update for a write
# based on another revision than the current one, which refuses it as a conflict (a 403 whose
# reason starts so); CouchDB finds the conflict first and answers 409.
CONFLICT_REFUSAL = "[conflict]"
CONFLICT = {"error": "conflict", "reason": "Document update conflict."}


def conflicts_to_409(code: int, body: bytes) -> tuple[int, bytes]:
    """A write's answer with the validation's conflict refusals as the conflicts they are."""
    got = json.loads(body)
    if isinstance(got, dict) and code == 403 and _is_conflict_refusal(got):
        return 409, json.dumps(CONFLICT).encode()
    if isinstance(got, list) and any(_is_conflict_refusal(e) for e in got if isinstance(e, dict)):
        entries = [
            {"id": e.get("id"), **CONFLICT}
            if isinstance(e, dict) and _is_conflict_refusal(e)
            else e
            for e in got
        ]
        return code, json.dumps(entries).encode()
    return code, body


def _is_conflict_refusal(entry: dict[str, Any]) -> bool:
    reason = entry.get("reason")
    return (
        entry.get("error") == "forbidden"
        and isinstance(reason, str)
        and reason.startswith(CONFLICT_REFUSAL)
    )


def conflicts_of(made: gate.Forward, answer: bytes) -> dict[str, Any]:
    """The documents sent for creation (no `_rev`) that the store answered with a conflict,
    by id."""
    got = json.loads(answer)
    sent = json.loads(made.body or b"null")
    if isinstance(sent, dict) and isinstance(sent.get("docs"), list):
        docs = {d["_id"]: d for d in sent["docs"] if "_rev" not in d and _is_request_of_its_id(d)}
        return {
            entry["id"]: docs[entry["id"]]
            for entry in got if isinstance(got, list)
            if isinstance(entry, dict) and entry.get("error") == "conflict"
            and entry.get("id") in docs
        }  # fmt: skip
    is_conflict = isinstance(got, dict) and got.get("error") == "conflict"
    new = isinstance(sent, dict) and "_rev" not in sent and _is_request_of_its_id(sent)
    return {sent["_id"]: sent} if is_conflict and new else {}


def _is_request_of_its_id(doc: Any) -> bool:
    """`doc` is a creation of the request its id names (the id is its source LFN's): only
    such a conflict is explained; any other would only make the front end read another's
    request."""
    lfn = doc.get("source_lfn") if isinstance(doc, dict) else None
    return isinstance(lfn, str) and doc.get("_id") == model.request_id(lfn)


def explain(answer: bytes, conflicts: dict[str, Any], stored: dict[str, Any], caller: str) -> bytes:
    """The store's answer with each conflict's code and reason from upload.conflict_of."""
    got = json.loads(answer)
    for entry in got if isinstance(got, list) else [got]:
        doc_id = entry.get("id") if isinstance(got, list) else next(iter(conflicts))
        if doc_id in conflicts and entry.get("error") == "conflict":
            told = upload.conflict_of(stored.get(doc_id), conflicts[doc_id], caller)
            entry.update(code=told.code, reason=told.reason)
    return json.dumps(got).encode()


RULE = re.compile(r"^\[([a-z_-]{1,40})\] ")
# The code of a write's conflict the front end did not explain (a stale `_rev`, or a creation's
# when the stored requests could not be read): read the document again.
STALE = "conflict"


def coded(answer: bytes) -> bytes:
    """The store's answer to a write with a stable `code` beside each refusal's reason: a
    refusal's rule (the `[rule]` its reason begins with), a conflict's case (upload.conflict_of,
    else STALE). A client acts on the code; a person reads the reason."""
    got = json.loads(answer)
    for entry in got if isinstance(got, list) else [got]:
        if not isinstance(entry, dict) or "code" in entry:
            continue
        if entry.get("error") == "forbidden":
            rule = RULE.match(str(entry.get("reason", "")))
            entry["code"] = rule.group(1) if rule else "forbidden"
        elif entry.get("error") == "conflict":
            entry["code"] = STALE
    return json.dumps(got).encode()


def _method(request: server.Request) -> str:
    return request.method.decode("latin-1")


def _path(request: server.Request) -> str:
    return request.uri.decode("latin-1").split("?", 1)[0]


X509_V_ERR_CERT_CHAIN_TOO_LONG = 22  # OpenSSL's x509_vfy.h


def _key_in_policy(_conn: Any, cert: Any, errno: int, depth: int, _ok: int) -> bool:
    """OpenSSL's verify callback, during the handshake: a client certificate is taken whatever
    it is (aso.grid.x509auth judges it, and its refusals are HTTP answers), but for a key whose
    mere use costs the front end (x509auth.key_fault) and a chain longer than
    x509auth.MAX_CHAIN (each certificate a signature check): the handshake fails before the
    client proves it holds its key."""
    if errno == X509_V_ERR_CERT_CHAIN_TOO_LONG or depth >= MAX_CHAIN:
        REFUSALS.tell("key", "a TLS handshake: a chain of more than %d certificates", MAX_CHAIN)
        return False
    fault = key_fault(cert.to_cryptography().public_key())
    if fault:
        REFUSALS.tell("key", "a TLS handshake: %s", fault)
    return fault is None


@implementer(IOpenSSLContextFactory)
class ServerTLS:
    """The TLS context: the host certificate; a client certificate is asked for and accepted
    here whatever it is, then judged by aso.grid.x509auth, whose refusals are HTTP answers."""

    def __init__(self, cert: Path, key: Path):
        context = SSL.Context(SSL.TLS_SERVER_METHOD)
        context.set_min_proto_version(SSL.TLS1_2_VERSION)
        context.use_certificate_chain_file(str(cert))
        context.use_privatekey_file(str(key))
        context.check_privatekey()
        context.set_verify(SSL.VERIFY_PEER, _key_in_policy)
        context.set_verify_depth(MAX_CHAIN)  # past it: X509_V_ERR_CERT_CHAIN_TOO_LONG, refused
        # No session resumption: a resumed session keeps the client's certificate but not the
        # proxy chain it sent, so a proxy's issuer would be missing (401) at every resumption.
        context.set_session_cache_mode(SSL.SESS_CACHE_OFF)
        context.set_options(SSL.OP_NO_TICKET)
        # One handshake per connection: a client's renegotiations would each cost a key exchange.
        context.set_options(SSL.OP_NO_RENEGOTIATION)
        self.context = context

    def getContext(self) -> SSL.Context:
        return self.context


def build(config: Config, reactor: Any) -> tuple[FrontEnd, ServerTLS]:
    fe = config.frontend
    trust = TrustStore(config.path(fe.capath))
    trust.refresh()
    gridmap = GridMap(config.path(fe.mapfile))
    if fe.auth == "proxy":
        identity: Any = ProxyAuth(fe.secret, fe.proxy_hash)
    else:
        reserved = (config.store.admin_user, config.store.agent_user, config.store.user)
        identity = Sessions(fe.secret, Server.from_config(config, account="admin"), reserved)
    tls = ServerTLS(config.path(fe.host_cert), config.path(fe.host_key))
    return FrontEnd(config, trust, gridmap, identity, reactor), tls


_METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "COPY", "OPTIONS"}


def _measure(request: server.Request) -> None:
    """Count and time the request when its answer is finished (or its client went away)."""
    started = time.monotonic()
    method = request.method.decode("ascii", "replace")
    method = method if method in _METHODS else "other"  # labels stay few, whatever is sent

    def finished(result: Any) -> None:
        metrics.FRONTEND_REQUESTS.labels(method, str(request.code)).inc()
        metrics.FRONTEND_SECONDS.labels(method).observe(time.monotonic() - started)

    request.notifyFinish().addBoth(finished)


def serve_metrics(config: Config, reactor: Any) -> None:
    """The front end's Prometheus metrics, over plain HTTP on metrics.frontend_port. A port
    already taken turns the metrics off, loudly, not the front end: users keep their service."""
    settings = config.metrics
    if not settings.frontend_port:
        return
    try:
        metrics_site = server.Site(MetricsResource())  # type: ignore[no-untyped-call]  # a lambda
        cast(_Reactor, reactor).listenTCP(
            settings.frontend_port, metrics_site, interface=settings.host
        )
    except CannotListenError as exc:
        log.error(
            "metrics off: cannot listen on %s:%d (%s); set metrics.frontend_port to a free port",
            settings.host,
            settings.frontend_port,
            exc.socketError,
        )
        return
    log.info("metrics on http://%s:%d/metrics", settings.host, settings.frontend_port)


# Files the front end opens besides its clients' connections: its connections to the store
# (kept-alive and feeds), spooled bodies, the CA directory, logs.
FILES_BESIDES_CLIENTS = 4 * STORE_CONNECTIONS + 256


def fit_to_open_files(settings: FrontendConfig, soft: int, hard: int) -> tuple[int, FrontendConfig]:
    """(the open-file limit to set, the settings to run with): the soft limit raised as far as
    the connections need and the hard limit allows; past the hard limit, fewer connections than
    configured (with the default soft limit of 1024, the caps would never be reached: accepting
    would fail for want of a file first, for everyone)."""
    needed = settings.connections + FILES_BESIDES_CLIENTS
    if hard != RLIM_INFINITY and needed > hard:
        connections = max(1, hard - FILES_BESIDES_CLIENTS)
        log.warning("frontend.connections lowered from %d to %d: this process may open %d files "
                    "(ulimit -Hn; LimitNOFILE in a systemd unit)", settings.connections,
                    connections, hard)  # fmt: skip
        settings = dataclasses.replace(
            settings,
            connections=connections,
            connections_per_address=min(settings.connections_per_address, connections),
            unidentified_connections=min(settings.unidentified_connections, connections),
        )
        needed = hard
    return max(soft, needed), settings


def serve(config: Config) -> None:
    """Run the front end on Twisted's global reactor until SIGTERM/SIGINT."""
    from twisted.internet import reactor  # installed on first import: only the process's entry

    root, tls = build(config, reactor)
    host, _, port = config.frontend.listen.rpartition(":")
    soft, hard = getrlimit(RLIMIT_NOFILE)
    files, settings = fit_to_open_files(config.frontend, soft, hard)
    setrlimit(RLIMIT_NOFILE, (files, hard))
    site = _Site(root, settings)
    site.displayTracebacks = False
    running = cast(_Reactor, reactor)
    running.suggestThreadPoolSize(16)
    running.listenTCP(int(port), _Admission(tls, site, settings, reactor), interface=host)
    serve_metrics(config, reactor)
    log.info("front end on https://%s:%s, forwarding to %s (%s identity)", host, port,
             config.store.url, config.frontend.auth)  # fmt: skip
    print(f"ASO front end listening on https://{host}:{port}", flush=True)
    running.addSystemEventTrigger("before", "shutdown", _exit_within, STOP_GRACE)
    running.run()


def _exit_within(seconds: float) -> None:
    """A stop bounded in time: past `seconds` every thread's stack goes to stderr (the log)
    and the process exits 1 (a stop under load had waited over 30 s on threads)."""
    log.info("stopping (at most %g s)", seconds)
    faulthandler.dump_traceback_later(seconds, exit=True)
