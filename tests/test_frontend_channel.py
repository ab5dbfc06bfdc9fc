"""The front end's pieces on their own (no store, no TLS): a request's body when its client's
chain is judged after the client has left; how it stops."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest
from twisted.internet import address, defer
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web import resource

from aso.config import Config, FrontendConfig
from aso.frontend import bodychecks, routes
from aso.frontend import server as frontend_module
from aso.grid.x509auth import Identity, unauthorized

HEAD = b"POST /asynctransfer/_bulk_docs HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"


def _channel_with_a_body_under_way() -> tuple[Any, defer.Deferred[Identity], list[Failure]]:
    """A channel whose client has sent part of a body, its chain still being checked."""
    site = frontend_module._Site(resource.Resource(), FrontendConfig())
    channel = site.buildProtocol(address.IPv4Address("TCP", "127.0.0.1", 40000))
    channel.callLater = Clock().callLater  # the request timeout, never reached here
    channel.makeConnection(StringTransport())
    checked: defer.Deferred[Identity] = defer.Deferred()
    channel.aso_verdict = frontend_module._Verdict(
        checked, channel.identified_client, channel.refused_client
    )
    channel.dataReceived(HEAD + b"x" * 300)
    request = channel.requests[-1]
    assert request.in_body and request.held == 300, "the body's bytes so far are charged"
    errors: list[Failure] = []
    checked.addErrback(errors.append)
    return channel, checked, errors


def test_a_chain_verified_after_its_client_left_charges_nothing_and_raises_nothing() -> None:
    channel, checked, errors = _channel_with_a_body_under_way()
    channel.connectionLost(Failure(ConnectionError("the client left")))
    assert channel.site.body_bytes.held == 0, "a request that ended gives its bytes back"
    checked.callback(Identity(dn="/DC=org/CN=alice", proxies=1))
    assert errors == [], [error.getTraceback() for error in errors]
    assert channel.site.body_bytes.held == 0
    assert not channel.site.body_bytes.by_client


def test_a_chain_refused_after_its_client_left_raises_nothing() -> None:
    channel, checked, errors = _channel_with_a_body_under_way()
    channel.connectionLost(Failure(ConnectionError("the client left")))
    refusal = unauthorized("no such CA")
    checked.errback(Failure(refusal))
    assert errors == [], [error.getTraceback() for error in errors]
    assert channel.aso_verdict.refusal().value is refusal, "the verdict keeps its reason"
    assert channel.site.body_bytes.held == 0


def test_a_chain_verified_while_the_body_arrives_charges_it_to_the_user() -> None:
    channel, checked, errors = _channel_with_a_body_under_way()
    checked.callback(Identity(dn="/DC=org/CN=alice", proxies=1))
    assert errors == []
    assert channel.site.body_bytes.by_client == {"user /DC=org/CN=alice": 300}


def test_a_body_check_asked_for_once_stopping_starts_no_worker() -> None:
    """Checks still queued in the reactor's threads when the front end stops had started new
    worker processes (the pool was made again for each): they now fail at once."""
    config = Config()
    checks = bodychecks.BodyChecks(config, routes.table(config), processes=2)
    checks.stop()
    body = b"[" + b"0," * bodychecks.IN_PROCESS_VALUES + b"0]"
    asked = bodychecks.Asked(b"POST", b"/x/_bulk_docs", body, frozenset(), b"application/json")
    assert bodychecks.costly(asked.body)
    with pytest.raises(bodychecks.Stopped):
        checks.check("alice", asked)
    assert checks._pool is None


STUCK_AT_STOP = """
import time
from twisted.internet import reactor
from aso.frontend import server
reactor.addSystemEventTrigger("before", "shutdown", server._exit_within, 1.0)
reactor.addSystemEventTrigger("during", "shutdown", time.sleep, 60)  # a thread never joined
reactor.callWhenRunning(reactor.stop)
reactor.run()
"""


def test_a_stop_that_hangs_ends_within_its_grace_with_every_stack_told() -> None:
    """A front end asked to stop under load had not exited within 30 s: past its grace it
    writes every thread's stack to its log and exits 1."""
    started = time.monotonic()
    ended = subprocess.run(
        [sys.executable, "-c", STUCK_AT_STOP], capture_output=True, text=True, timeout=30
    )
    assert time.monotonic() - started < 20
    assert ended.returncode == 1, ended.stderr
    assert "Timeout (0:00:01)!" in ended.stderr, ended.stderr
    # every thread's stack, the reactor's where it waits on the stop's own work
    assert ended.stderr.count("Thread 0x") >= 2 and "fireSystemEvent" in ended.stderr
