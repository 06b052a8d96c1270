"""The client's kept-alive connections: reused, replaced when the server closed them, and a
request that may have reached the server is never sent twice unless repeating it is safe."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from jupyter_gpusched.client import transport


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, behaviour: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.behaviour = behaviour  # "answer", "close-after-answer", "drop-second-request"
        self.connections = 0
        self.requests: list[str] = []
        self.paths: list[str] = []
        self.closed = threading.Event()  # the server hung up on a connection

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.closed.set()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as tornado answers
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.requests.append(self.command)
        self.server.paths.append(self.path)
        if self.server.behaviour == "drop-second-request" and len(self.server.requests) == 2:
            self.close_connection = True  # read it, then hang up without answering
            return
        body = f"{self.command} {len(self.server.requests)}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.server.behaviour == "close-after-answer":
            self.close_connection = True  # an idle timeout or a restart, as the client sees it

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


def _serve(behaviour: str) -> Iterator[_Server]:
    server = _Server(behaviour)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's own proxy settings must not route these loopback requests."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[_Server]:
    yield from _serve(request.param)


def _call(server: _Server, method: str) -> transport.Answer:
    url = f"http://127.0.0.1:{server.server_address[1]}/gpusched/api/jobs"
    body = b"{}" if method == "POST" else None
    return transport.request(method, url, body=body, headers={}, timeout=5)


@pytest.mark.parametrize("server", ["answer"], indirect=True)
def test_requests_of_one_thread_share_one_connection(server: _Server) -> None:
    answers = [_call(server, m).body for m in ("POST", "GET", "POST")]
    assert answers == [b"POST 1", b"GET 2", b"POST 3"]
    assert server.connections == 1


@pytest.mark.parametrize("server", ["answer"], indirect=True)
def test_each_thread_has_its_own_connection(server: _Server) -> None:
    _call(server, "GET")
    other = threading.Thread(target=_call, args=(server, "GET"))
    other.start()
    other.join()
    _call(server, "GET")
    assert server.connections == 2


@pytest.mark.parametrize("server", ["close-after-answer"], indirect=True)
def test_a_connection_the_server_closed_is_replaced_before_a_post_is_sent(
    server: _Server,
) -> None:
    assert _call(server, "POST").body == b"POST 1"
    assert server.closed.wait(5)  # as after an idle timeout: closed before the next request
    assert _call(server, "POST").body == b"POST 2"
    assert server.requests == ["POST", "POST"] and server.connections == 2


@pytest.mark.parametrize("server", ["drop-second-request"], indirect=True)
def test_a_post_cut_off_after_it_was_sent_is_not_sent_again(server: _Server) -> None:
    _call(server, "POST")
    with pytest.raises(transport.Unreachable):
        _call(server, "POST")
    assert server.requests == ["POST", "POST"]  # the server got it once; the caller is told
    assert _call(server, "GET").body == b"GET 3"  # and the next call reconnects


@pytest.mark.parametrize("server", ["drop-second-request"], indirect=True)
def test_a_get_cut_off_on_a_kept_connection_is_asked_once_more(server: _Server) -> None:
    _call(server, "GET")
    assert _call(server, "GET").body == b"GET 3"
    assert server.requests == ["GET", "GET", "GET"] and server.connections == 2


def test_a_server_that_is_not_there_is_unreachable() -> None:
    with pytest.raises(transport.Unreachable):
        transport.request("GET", "http://127.0.0.1:9/", body=None, headers={}, timeout=5)


@pytest.mark.parametrize("server", ["answer"], indirect=True)
def test_a_server_behind_a_proxy_is_asked_through_it_unless_no_proxy_says_otherwise(
    server: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("http_proxy", proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("ALL_PROXY", raising=False)
    url = "http://gpusched.lab.invalid:8888/gpusched/api/jobs"
    answer = transport.request("GET", url, body=None, headers={}, timeout=5)
    assert answer.body == b"GET 1" and server.paths == [url]  # the proxy got the whole URL
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    assert _call(server, "GET").body == b"GET 2"
    assert server.paths[1] == "/gpusched/api/jobs"  # straight to the server
