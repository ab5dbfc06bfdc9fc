"""The front end's HTTP channel on its own (no store, no TLS): what happens to a request's body
when its client's chain is judged after the client has left."""

from __future__ import annotations

from typing import Any

from twisted.internet import address, defer
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web import resource

from aso.config import FrontendConfig
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
