"""HTTP requests over kept-alive connections, one per thread.

``urllib.request`` opens a new connection for every request and builds an opener each time:
for a client that asks again and again (a submit loop, ``wait``, the magic polling a lease)
that was a third of a submit's round trip. Here each thread keeps one connection to the server
it last asked (``http.client`` objects are not thread-safe), checked before reuse: one the
server closed meanwhile (a restart, an idle timeout) is replaced before the request is sent. A
connection that breaks during a request is retried once only for methods that are safe to
repeat; a ``POST`` is not sent twice here (the API client repeats a create with its
``Idempotency-Key``, which makes that safe). Where an HTTP proxy applies to the server the request
goes through ``urllib`` as before, which honours ``*_proxy`` and ``no_proxy``.
"""

from __future__ import annotations

import http.client
import os
import select
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import Message

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


@dataclass(frozen=True)
class Answer:
    """A whole response: status, headers (lower-case names) and body."""

    status: int
    reason: str
    headers: dict[str, str]
    body: bytes


class Unreachable(OSError):
    """No answer came: the server is down, refused, or the connection broke mid-request."""


class _Kept:
    """A thread's kept connection to one server; closed when dropped (the thread ended)."""

    def __init__(self, key: tuple[str, str], conn: http.client.HTTPConnection) -> None:
        self.key = key
        self.conn = conn
        self.pid = os.getpid()

    def __del__(self) -> None:
        self.conn.close()


_local = threading.local()  # .kept: this thread's _Kept, one server at a time


def request(
    method: str, url: str, *, body: bytes | None, headers: dict[str, str], timeout: float | None
) -> Answer:
    """Send one request and read its whole answer (errors are answers too, not raised)."""
    parts = urllib.parse.urlsplit(url)
    kept: _Kept | None = getattr(_local, "kept", None)
    # Whether a proxy applies is asked when a connection opens (it reads the environment).
    if (kept is None or kept.key != (parts.scheme, parts.netloc)) and _proxied(parts):
        return _via_urllib(method, url, body, headers, timeout)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    for attempt in (1, 2):
        conn, reused = _connection(parts, timeout)
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request(method, target or "/", body=body, headers=headers)
            resp = conn.getresponse()
            answer = Answer(
                resp.status,
                resp.reason,
                {k.lower(): v for k, v in resp.getheaders()},
                resp.read(),
            )
        except (OSError, http.client.HTTPException) as err:
            _forget()
            # A kept connection can die between the check and the send; a fresh one cannot
            # have been closed for idling. Only then, and only when repeating is safe, retry.
            safe = method in IDEMPOTENT and not isinstance(err, TimeoutError)
            if attempt == 1 and reused and safe:
                continue
            raise Unreachable(str(getattr(err, "reason", err)) or type(err).__name__) from None
        if resp.will_close:
            _forget()
        return answer
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _connection(
    parts: urllib.parse.SplitResult, timeout: float | None
) -> tuple[http.client.HTTPConnection, bool]:
    """The calling thread's connection to the server, and whether it served a request before.

    One per thread: asking another server closes the last one's (a forked child gets its own).
    """
    key = (parts.scheme, parts.netloc)
    kept: _Kept | None = getattr(_local, "kept", None)
    if kept is not None and kept.key == key and kept.pid == os.getpid():
        if kept.conn.sock is not None and not _dropped(kept.conn):
            return kept.conn, True
    _forget()
    host, port = parts.hostname or "localhost", parts.port
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=timeout)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    _local.kept = _Kept(key, conn)
    return conn, False


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """An idle kept connection that is readable was closed by the server (or is broken)."""
    try:
        readable, _, _ = select.select([conn.sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _forget() -> None:
    kept: _Kept | None = getattr(_local, "kept", None)
    _local.kept = None
    if kept is not None:
        kept.conn.close()


def _proxied(parts: urllib.parse.SplitResult) -> bool:
    proxies = urllib.request.getproxies()
    if parts.scheme not in proxies:
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


def _via_urllib(
    method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float | None
) -> Answer:
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        # A fresh opener: urlopen's own is built once and keeps the proxies of its first use.
        with urllib.request.build_opener().open(req, timeout=timeout) as resp:
            return Answer(resp.status, resp.reason, _lower(resp.headers), resp.read())
    except urllib.error.HTTPError as err:
        with err:  # it holds the response (and its socket): read the body, then close
            return Answer(err.code, str(err.reason), _lower(err.headers), err.read())
    except (urllib.error.URLError, OSError) as err:
        raise Unreachable(str(getattr(err, "reason", err))) from None


def _lower(headers: Message) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}
