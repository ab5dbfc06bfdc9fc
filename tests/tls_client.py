"""A raw TLS client of the front end, for the tests that write bytes no HTTP library would."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path


def client_context(ca_file: str | Path, *cert: str) -> ssl.SSLContext:
    """Trusting the front end's CA; with a certificate (and key) file when `cert` names one."""
    context = ssl.create_default_context(cafile=str(ca_file))
    if cert:
        context.load_cert_chain(*cert)
    return context


def connect(
    url: str,
    context: ssl.SSLContext,
    source: str = "",
    timeout: float = 10,
    session: ssl.SSLSession | None = None,
    receive_buffer: int = 0,
) -> ssl.SSLSocket:
    """A TLS connection to the front end at `url` (from `source`, a loopback address), its
    handshake done; `receive_buffer` bytes of kernel buffer when given (a client slow to read)."""
    host, port = url.removeprefix("https://").split(":")
    plain = socket.create_connection((host, int(port)), timeout, (source, 0) if source else None)
    try:
        if receive_buffer:
            plain.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        return context.wrap_socket(plain, server_hostname=host, session=session)
    except BaseException:
        plain.close()
        raise
