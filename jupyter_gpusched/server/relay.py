"""A log follow forwarded to the lab-wide service, ended as soon as its caller goes.

Tornado's HTTP client cannot abort a request in flight, and the follow of a quiet job may send
nothing for hours: forwarded through it, the service's follow (an SSH channel on the job's
node, and one of the user's few follows there) would outlive the caller by as long. So a follow
is relayed over a connection of its own, which the caller's going closes.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Sequence
from typing import Any
from urllib.parse import urlsplit

from tornado import httputil
from tornado.http1connection import HTTP1Connection, HTTP1ConnectionParameters
from tornado.iostream import IOStream
from tornado.tcpclient import TCPClient


class _Relay(httputil.HTTPMessageDelegate):
    """The service's answer, written to the caller as it comes."""

    def __init__(self, handler: Any, pass_headers: Sequence[str]) -> None:
        self.handler = handler
        self.pass_headers = pass_headers

    def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> Awaitable[None]:
        assert isinstance(start_line, httputil.ResponseStartLine)
        self.handler.set_status(start_line.code)
        for name in self.pass_headers:
            if name in headers:
                self.handler.set_header(name, headers[name])
        return self.handler.flush()  # the caller learns at once that the follow is on

    def data_received(self, chunk: bytes) -> Awaitable[None]:
        self.handler.write(chunk)
        return self.handler.flush()  # read on only as fast as the caller takes it


async def connect(url: str) -> IOStream:
    """A connection to the host of ``url`` (TLS for https)."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    options = ssl.create_default_context() if tls else None
    return await TCPClient().connect(parts.hostname or "localhost", port, ssl_options=options)


async def relay_get(
    stream: IOStream,
    url: str,
    headers: dict[str, str],
    handler: Any,
    pass_headers: Sequence[str],
) -> None:
    """GET ``url`` over ``stream`` and relay the answer to ``handler`` until it ends."""
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    conn = HTTP1Connection(stream, True, HTTP1ConnectionParameters(no_keep_alive=True))
    request = httputil.HTTPHeaders({"Host": parts.netloc, "Connection": "close", **headers})
    await conn.write_headers(httputil.RequestStartLine("GET", target, "HTTP/1.1"), request)
    conn.finish()
    await conn.read_response(_Relay(handler, pass_headers))
