"""Slow and greedy clients of the lab-wide service: header and body timeouts, a cap per address.

Tornado waits an hour (its default ``idle_connection_timeout``) for a request's headers and
forever for its body, and takes any number of connections from one address: 300 connections
trickling headers and 5 slow 50 MB bodies held the service's sockets for as long as their
clients liked. :class:`GuardedHTTPServer` is Tornado's server with three bounds
(:class:`ConnectionLimits`, set from ``GpuSchedService``'s traits):

* **headers** within ``header_timeout_s`` of the connection opening or of its previous answer
  ending (Tornado's own ``idle_connection_timeout``, which bounds the whole wait for the
  headers, so a trickle gains nothing; it also bounds how long an idle kept-alive connection
  stays open, which our clients expect of a server);
* **a body that keeps arriving**: closed when ``body_timeout_s`` passes without a byte, or when,
  past that grace, it averages less than ``body_min_rate_bytes_s`` (Apache's mod_reqtimeout
  rule: each byte received buys ``1/rate`` seconds). A timeout on progress rather than on the
  whole body, because the API reads bodies up to ``GpuSchedApp.max_request_bytes`` (96 MB of
  uploaded files): a total that let such an upload through on a slow-but-honest link would
  let a stalled body hold its socket for an hour too. An upload at the minimum rate or faster
  is never cut, whatever its size;
* **connections per client address** at most ``max_connections_per_address``: the next one is
  answered 503 with ``Retry-After`` and closed at once, before any of it is read; other
  addresses are not affected. Counted from the socket's peer, since nothing else is known yet
  (behind a proxy, that is the proxy).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from tornado import httputil
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.iostream import IOStream

log = logging.getLogger(__name__)

#: A body's timer that fires this late (the loop was busy) looks once more before it closes.
_LATE_S = 0.5
#: New connections between sweeps of addresses none of whose connections is open any more.
_SWEEP_EVERY = 1000


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a client may take to send a request, and how many connections it may hold."""

    header_timeout_s: float  # the headers, from the connection's start or its last answer
    body_timeout_s: float  # longest pause in a body; also the grace before the rate counts
    body_min_rate_bytes_s: float  # slowest average body rate past the grace (0: any)
    max_connections_per_address: int  # open at once from one address (0: no cap)


class GuardedHTTPServer(HTTPServer):
    """Tornado's HTTP server, closing slow clients and refusing greedy ones (module doc)."""

    def initialize(  # type: ignore[override]
        self, request_callback: Any, *, limits: ConnectionLimits, **kwargs: Any
    ) -> None:
        """Tornado's settings in ``kwargs``; ``limits`` sets the idle timeout too."""
        self.limits = limits
        self._open: dict[str, set[IOStream]] = {}  # address -> its connections not yet closed
        self._full: set[str] = set()  # addresses refused since they were last under the cap
        self._accepted = 0
        super().initialize(
            request_callback, idle_connection_timeout=limits.header_timeout_s, **kwargs
        )

    def handle_stream(self, stream: IOStream, address: Any) -> None:
        """Serve a new connection, unless its address already holds the most it may."""
        host = _host(address)
        cap = self.limits.max_connections_per_address
        if host is not None and cap:
            self._accepted += 1
            if self._accepted % _SWEEP_EVERY == 0:
                for other in list(self._open):
                    self._forget_closed(other)
            live = self._open.setdefault(host, set())
            live.difference_update([s for s in live if s.closed()])
            if len(live) >= cap:
                self._refuse(stream, host, cap)
                return
            self._full.discard(host)
            live.add(stream)
        super().handle_stream(stream, address)

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> httputil.HTTPMessageDelegate:
        """Tornado's request delegate, watched while it reads a body."""
        inner = super().start_request(server_conn, request_conn)
        return _BodyWatch(inner, request_conn, self.limits)

    def on_close(self, server_conn: object) -> None:
        """A connection ended (or was handed to a websocket): forget it when closed."""
        super().on_close(server_conn)
        host = _host(getattr(getattr(server_conn, "context", None), "address", None))
        if host is not None:
            self._forget_closed(host)

    def _forget_closed(self, host: str) -> None:
        """Drop ``host``'s closed connections, and ``host`` once none is left."""
        live = self._open.get(host)
        if live is not None:
            live.difference_update([s for s in live if s.closed()])
            if not live:
                del self._open[host]

    def _refuse(self, stream: IOStream, host: str, cap: int) -> None:
        """Answer 503 before reading anything, and close."""
        if host not in self._full:
            self._full.add(host)
            log.warning(
                "gpusched: refusing connections from %s: it holds %d open "
                "(GpuSchedService.max_connections_per_address)",
                host,
                cap,
            )
        body = json.dumps(
            {
                "error": "TooManyConnections",
                "message": f"{host} already holds {cap} open connections to this service "
                "(GpuSchedService.max_connections_per_address); close some, or ask the "
                "admins to raise the limit",
            }
        ).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Retry-After: 1\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            sent = stream.write(head + body)
        except Exception:  # noqa: BLE001 - gone already: nothing to tell it
            stream.close()
            return
        loop = IOLoop.current()
        stalled = loop.call_later(self.limits.header_timeout_s, stream.close)  # a TLS handshake

        def sent_or_not(future: Any) -> None:
            if not future.cancelled():
                future.exception()  # a client already gone is no error of ours
            loop.remove_timeout(stalled)
            stream.close()

        sent.add_done_callback(sent_or_not)


class _BodyWatch(httputil.HTTPMessageDelegate):
    """Passes a request through; closes its connection when its body stops coming."""

    def __init__(
        self,
        inner: httputil.HTTPMessageDelegate,
        conn: httputil.HTTPConnection,
        limits: ConnectionLimits,
    ) -> None:
        self._inner = inner
        self._conn = conn
        self._limits = limits
        self._timer: Any = None
        self._start = self._last = 0.0
        self._received = 0
        self._late = False  # the timer fired late once since the last bytes came

    def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> Any:
        """Start the clock when a body is to follow."""
        if _has_body(headers):
            loop = IOLoop.current()
            self._start = self._last = loop.time()
            self._timer = loop.call_at(self._deadline(), self._check)
        return self._inner.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Any:
        """Count what arrived."""
        self._received += len(chunk)
        self._last = IOLoop.current().time()
        self._late = False
        return self._inner.data_received(chunk)

    def finish(self) -> None:
        """The whole body came."""
        self._stop()
        self._inner.finish()

    def on_connection_close(self) -> None:
        """The connection went before the request was read (perhaps closed by us)."""
        self._stop()
        self._inner.on_connection_close()

    def _deadline(self) -> float:
        timeout_s, rate = self._limits.body_timeout_s, self._limits.body_min_rate_bytes_s
        stalled = self._last + timeout_s
        if rate <= 0:
            return stalled
        return min(stalled, self._start + timeout_s + self._received / rate)

    def _check(self) -> None:
        self._timer = None
        loop = IOLoop.current()
        now, deadline = loop.time(), self._deadline()
        if now < deadline:
            self._timer = loop.call_at(deadline, self._check)
            return
        if not self._late and now - deadline > _LATE_S:
            # The server was too busy to look (a long pass, a GC pause): what arrived meanwhile
            # waits in the socket behind this timer. Look again once it was read.
            self._late = True
            self._timer = loop.call_at(now + _LATE_S, self._check)
            return
        context = getattr(self._conn, "context", None)
        log.info(
            "gpusched: closing the connection of %s: its request body stopped coming "
            "(%d bytes in %.0f s; GpuSchedService.body_timeout_s, body_min_rate_bytes_s)",
            getattr(context, "remote_ip", "a client"),
            self._received,
            loop.time() - self._start,
        )
        self._conn.close()  # type: ignore[attr-defined]

    def _stop(self) -> None:
        if self._timer is not None:
            IOLoop.current().remove_timeout(self._timer)
            self._timer = None


def _has_body(headers: httputil.HTTPHeaders) -> bool:
    if "Transfer-Encoding" in headers:
        return True
    return headers.get("Content-Length", "0").strip() not in ("", "0")


def _host(address: Any) -> str | None:
    """The client's address of a TCP connection (None for a UNIX socket's)."""
    if isinstance(address, tuple) and address:
        return str(address[0])
    return None
