"""Slow and greedy clients of the lab-wide service, on real sockets (issue #31, item 5).

A live ``jupyter gpusched service`` with short timeouts: headers that trickle and bodies that
stall or crawl get their connections closed, an upload of the allowed size at a slow but
steady rate goes through, and one address past its connection cap is refused while another
connects. Each test speaks from its own loopback address (Linux routes all of 127/8 to
``lo``), so one test's connections never count against another's.
"""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import time
from collections.abc import Iterator

import pytest
from _fixtures_polling import wait_for
from _fixtures_server import FAR_FUTURE
from _fixtures_service import ServiceProcess

HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
MIN_RATE = 128 * 1024  # bytes/s a body must average past its first BODY_TIMEOUT_S
MAX_BODY = 1_250_000  # GpuSchedApp.max_request_bytes of this service
CAP = 4  # connections per address
#: Longest any close may take here: far past every timeout, for a busy machine.
CLOSED_WITHIN_S = 45.0


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = ServiceProcess(
        tmp_path_factory.mktemp("slow-clients"),
        max_request_bytes=MAX_BODY,
        service={
            "header_timeout_s": HEADER_TIMEOUT_S,
            "body_timeout_s": BODY_TIMEOUT_S,
            "body_min_rate_bytes_s": MIN_RATE,
            "max_connections_per_address": CAP,
        },
    )
    try:
        yield svc.start()
    finally:
        svc.stop()


def connect(service: ServiceProcess, source: str) -> socket.socket:
    """A TCP connection to the service from loopback address ``source``."""
    sock = socket.create_connection(("127.0.0.1", service.port), 30, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def head(path: str, token: str, **extra: str) -> bytes:
    """A request's start line and headers, up to (not including) the blank line."""
    lines = [f"{path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: token {token}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in extra.items()]
    return ("\r\n".join(lines) + "\r\n").encode()


def closed_by_server(sock: socket.socket, wait_s: float) -> bool:
    """Whether the server closed ``sock`` within ``wait_s`` (what it sent meanwhile is read)."""
    until = time.monotonic() + wait_s
    while (left := until - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            return False
        try:
            if not sock.recv(65536):
                return True
        except ConnectionResetError:
            return True
    return False


def trickle(sock: socket.socket, piece: bytes, every_s: float, for_s: float) -> float | None:
    """Send ``piece`` every ``every_s`` for at most ``for_s``: seconds until the server closed
    the connection, None if it never did."""
    start = time.monotonic()
    while time.monotonic() - start < for_s:
        try:
            sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - start
        if closed_by_server(sock, every_s):
            return time.monotonic() - start
    return None


def answer(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of the one answer on ``sock`` (its length given, or until closed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before an answer: {data!r}"
        data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    status = int(top.split()[1])
    fields = dict(
        line.split(": ", 1) for line in top.decode("latin-1").split("\r\n")[1:] if ": " in line
    )
    length = int(fields.get("Content-Length", fields.get("content-length", "-1")))
    while length < 0 or len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, body


def test_clients_trickling_their_headers_are_closed_after_the_header_timeout(
    service: ServiceProcess,
) -> None:
    socks = [connect(service, f"127.0.1.{i}") for i in range(1, 11)]
    for sock in socks:
        sock.sendall(head("GET /gpusched/api/jobs", service.admin_token) + b"X-Slow: ")
    start = time.monotonic()
    # one byte a socket every half second: each sends its headers for ever if let
    while any(s.fileno() >= 0 for s in socks) and time.monotonic() - start < CLOSED_WITHIN_S:
        for sock in [s for s in socks if s.fileno() >= 0]:
            try:
                sock.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                sock.close()
                continue
            if closed_by_server(sock, 0.05):
                sock.close()
        time.sleep(0.4)
    took = time.monotonic() - start
    still = sum(s.fileno() >= 0 for s in socks)
    for sock in socks:
        sock.close()
    assert still == 0, f"{still} of 10 header tricklers still open after {took:.0f}s"
    assert took >= HEADER_TIMEOUT_S * 0.9


def test_a_stalled_body_is_closed_after_the_body_timeout(service: ServiceProcess) -> None:
    with connect(service, "127.0.0.4") as sock:
        sock.sendall(
            head("POST /gpusched/api/jobs", service.admin_token, Content_Length="1000000")
            + b"\r\n"
            + b'{"kind": "script", "command": ["'
            + b"x" * 10_000
        )
        start = time.monotonic()
        assert closed_by_server(sock, CLOSED_WITHIN_S), "a body stalled for ever stays open"
        assert time.monotonic() - start >= BODY_TIMEOUT_S * 0.9


def test_a_body_crawling_below_the_minimum_rate_is_closed(service: ServiceProcess) -> None:
    with connect(service, "127.0.0.5") as sock:
        sock.sendall(
            head("POST /gpusched/api/jobs", service.admin_token, Content_Length="1000000") + b"\r\n"
        )
        # 400 bytes a second, never a pause as long as the body timeout
        took = trickle(sock, b"x" * 100, 0.25, CLOSED_WITHIN_S)
        assert took is not None, "a body crawling at 400 B/s stays open"
        assert took >= BODY_TIMEOUT_S * 0.9


def test_an_upload_of_the_allowed_size_at_a_slow_steady_rate_succeeds(
    service: ServiceProcess,
) -> None:
    content = base64.b64encode(os.urandom(900_000)).decode()
    spec = {
        "kind": "script",
        "command": ["python3", "data.bin"],
        "not_before": FAR_FUTURE,
        "uploads": [{"name": "data.bin", "content_base64": content}],
    }
    body = json.dumps(spec).encode()
    assert MAX_BODY * 0.9 < len(body) <= MAX_BODY
    with connect(service, "127.0.0.6") as sock:
        sock.sendall(
            head(
                "POST /gpusched/api/jobs",
                service.admin_token,
                Content_Length=str(len(body)),
                Content_Type="application/json",
            )
            + b"\r\n"
        )
        # 16 KiB every 50 ms (~320 KiB/s, 2.5 times the minimum): ~4 s, twice the body timeout
        start = time.monotonic()
        for at in range(0, len(body), 16384):
            sock.sendall(body[at : at + 16384])
            time.sleep(0.05)
        took = time.monotonic() - start
        status, text = answer(sock)
    assert status == 201, (status, text[:300])
    assert took > BODY_TIMEOUT_S
    assert json.loads(text)["spec"]["command"] == ["python3", "data.bin"]


def test_connections_past_the_cap_from_one_address_are_refused_and_another_address_connects(
    service: ServiceProcess,
) -> None:
    # events websockets: held open as long as their client likes, never timed out
    held = [connect(service, "127.0.0.7") for _ in range(CAP)]
    for sock in held:
        sock.sendall(
            head(
                "GET /gpusched/api/events",
                service.admin_token,
                Upgrade="websocket",
                Connection="Upgrade",
                Sec_WebSocket_Key=base64.b64encode(os.urandom(16)).decode(),
                Sec_WebSocket_Version="13",
            )
            + b"\r\n"
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 101")
    jobs = head("GET /gpusched/api/jobs?limit=1", service.admin_token) + b"\r\n"
    with connect(service, "127.0.0.7") as extra:
        status, text = answer(extra)  # answered before it asked
        assert closed_by_server(extra, CLOSED_WITHIN_S)
    assert status == 503
    assert "max_connections_per_address" in json.loads(text)["message"]
    with connect(service, "127.0.0.8") as other:
        other.sendall(jobs)
        assert answer(other)[0] == 200
    held.pop().close()

    def one_more_is_served() -> bool:
        with connect(service, "127.0.0.7") as again:
            again.sendall(jobs)
            return answer(again)[0] == 200

    wait_for(one_more_is_served, timeout_s=CLOSED_WITHIN_S, what="a freed place to be taken")
    for sock in held:
        sock.close()
