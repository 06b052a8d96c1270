"""One queue for a lab without a Hub: a service, and two users' servers in client mode.

alice and bob each run their own ``jupyter server`` whose extension forwards to one
``jupyter gpusched service`` with the token the service minted for them (``jupyter gpusched
service token USER``); carol is the service's admin.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fixtures_live_server import api, execute, notebook, text
from _fixtures_server import FAR_FUTURE, ServerProcess
from _fixtures_service import ServiceProcess, client_server
from _lab_scenarios import (
    definition_outlives_its_owners_server,
    one_queue,
    sleeper,
    status_of,
    wait_for,
)
from tornado import httpclient, websocket
from tornado.ioloop import IOLoop

from jupyter_gpusched.client.api import close_websocket  # noqa: E402

pytestmark = pytest.mark.slow


class TokenLab:
    """The service and each user's own server, reached with the server's token."""

    def __init__(self, service: ServiceProcess, servers: dict[str, ServerProcess]) -> None:
        self.service = service
        self.servers = servers

    def call(self, user: str, method: str, path: str, body: Any = None) -> Any:
        return api(self.servers[user], method, path, body)

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        return self.service.api(method, path, body, token=self.service.admin_token)

    def gpu_cell(self, user: str, source: str) -> str:
        server = self.servers[user]
        nb = execute(
            notebook("%load_ext jupyter_gpusched", "%%gpu\n" + source), server, server.root
        )
        return text(nb.cells[1]) or json.dumps(nb.cells[1].outputs)

    def root(self, user: str) -> Path:
        return self.servers[user].root

    def hand_over(self, user: str) -> None:
        pass  # one Unix user runs everything here

    def stop_server(self, user: str) -> None:
        self.servers[user].stop()

    def start_server(self, user: str) -> None:
        self.servers[user].start()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenLab]:
    root = tmp_path_factory.mktemp("lab")
    # the service's default limits, but bob may hold 2 streams (so a test can fill them)
    policy = {"windows": [{"name": "all"}], "user_limits": {"bob": {"streams": 2}}}
    service = ServiceProcess(root / "service", policy=policy).start()
    servers = {
        user: client_server(root / user, service, service.mint(user)).start()
        for user in ("alice", "bob")
    }
    try:
        yield TokenLab(service, servers)
    finally:
        for server in servers.values():
            server.stop()
        service.stop()


def test_two_users_servers_share_one_queue_fairly_and_only_owners_change_jobs(
    lab: TokenLab,
) -> None:
    one_queue(lab)


def test_events_reach_each_user_through_their_own_server(lab: TokenLab) -> None:
    bob = lab.servers["bob"]
    job = lab.call("bob", "POST", "jobs", sleeper(0.1))

    async def first_event_of_job() -> dict[str, Any]:
        url = bob.url.replace("http", "ws") + "gpusched/api/events?after=0"
        req = httpclient.HTTPRequest(url, headers={"Authorization": f"token {bob.token}"})
        conn = await websocket.websocket_connect(req)
        try:
            while True:
                message = json.loads(await conn.read_message())
                if message.get("job_id") == job["id"]:
                    return message
        finally:
            await close_websocket(conn)

    event = IOLoop.current().run_sync(first_event_of_job, timeout=30)
    assert event["kind"] == "submitted" and event["job"]["spec"]["user"] == "bob"


def test_a_users_files_travel_with_the_job_and_only_from_inside_their_root(lab: TokenLab) -> None:
    train = lab.root("bob") / "train.py"
    train.write_text("print('trained by bob')\n")
    spec = {"kind": "script", "command": ["python3", "train.py"], "files": [str(train)]}
    job = lab.call("bob", "POST", "jobs", spec)
    assert job["spec"]["files"][0].endswith("/train.py")
    wait_for(lambda: lab.call("bob", "GET", f"jobs/{job['id']}")["state"] == "succeeded", 60)
    with urllib.request.urlopen(
        urllib.request.Request(
            lab.servers["bob"].url + f"gpusched/api/jobs/{job['id']}/log",
            headers={"Authorization": f"token {lab.servers['bob'].token}"},
        ),
        timeout=30,
    ) as resp:
        assert resp.read() == b"trained by bob\n"
    code, body = status_of(lab, "bob", "POST", "jobs", {"kind": "script", "command": ["true"],
                                                        "files": ["/etc/shadow"]})  # fmt: skip
    assert code == 422 and "outside your Jupyter root" in body["message"]
    # the service itself never reads paths its callers name
    with pytest.raises(urllib.error.HTTPError) as info:
        lab.service.api(
            "POST", "jobs", {"kind": "script", "command": ["true"], "files": ["/etc/shadow"]},
            token=lab.service.mint("bob"),
        )  # fmt: skip
    info.value.close()
    assert info.value.code == 422


def test_a_definition_fires_while_its_owners_server_is_down_and_its_output_comes_home(
    lab: TokenLab,
) -> None:
    definition_outlives_its_owners_server(lab)


def test_a_follow_dropped_at_the_users_server_ends_at_the_service(lab: TokenLab) -> None:
    # There it holds an SSH channel on the job's node and one of the user's few follows.
    alice = lab.servers["alice"]
    job = lab.call("alice", "POST", "jobs", sleeper(60))
    wait_for(lambda: lab.call("alice", "GET", f"jobs/{job['id']}")["state"] == "running", 30)
    for _ in range(3):  # 12 follows dropped; alice may hold 4 at the service at once
        # the follows dropped in the round before are released (429 until then)
        opened = wait_for(lambda: _open_follows(alice, job["id"], 4), 30, "4 follows to open")
        time.sleep(0.5)
        for sock in opened:
            sock.close()
    lab.call("alice", "DELETE", f"jobs/{job['id']}")


def _open_follows(server: ServerProcess, job_id: int, n: int) -> list[socket.socket] | None:
    """``n`` follows answered 200, or None (those that opened are dropped again)."""
    opened = [_open_follow(server, job_id) for _ in range(n)]
    if all(status == "200" for status, _ in opened):
        return [sock for _, sock in opened]
    for _, sock in opened:
        sock.close()
    return None


def _open_follow(server: ServerProcess, job_id: int) -> tuple[str, socket.socket]:
    """A raw follow request: its status, and the socket to drop as a client would."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    sock.sendall(
        f"GET /gpusched/api/jobs/{job_id}/log?follow=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: token {server.token}\r\n\r\n".encode()
    )
    return sock.makefile("rb").readline().decode().split()[1], sock


FAR = FAR_FUTURE


def test_the_service_limits_each_user_by_default_and_a_429_reaches_their_server(
    lab: TokenLab,
) -> None:
    view = lab.call("alice", "GET", "policy")
    assert view["limits"]["everyone"] == {
        "queued_jobs": 10_000, "running_jobs": 500, "array_size": 10_000, "leases": 4,
        "streams": 16, "upload_bytes": 2 << 30, "submits_per_s": 20.0, "submit_burst": 100,
    }  # fmt: skip
    assert view["limits"]["yours"]["streams"] == 16
    lease = {"kind": "lease", "gpus": 1, "not_before": FAR}  # queued for months: no kernel
    held = [lab.call("alice", "POST", "jobs", lease)["id"] for _ in range(4)]
    alice = lab.servers["alice"]
    req = urllib.request.Request(
        alice.url + "gpusched/api/jobs",
        data=json.dumps(lease).encode(),
        method="POST",
        headers={"Authorization": f"token {alice.token}", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as info, urllib.request.urlopen(req, timeout=30):
        pass
    with info.value as refused:
        body, retry = json.loads(refused.read()), refused.headers["Retry-After"]
    assert (refused.code, retry) == (429, "30")
    assert body["message"] == (
        "alice holds 4 leases (queued or running), the limit (GpuSchedPolicy.limits leases) is "
        "4: release one (%gpu release, or shut down a GPU kernel)"
    )
    assert lab.call("bob", "POST", "jobs", lease)["user"] == "bob"  # hers are hers alone
    for job_id in held:
        lab.call("alice", "DELETE", f"jobs/{job_id}")


def test_a_stream_past_the_users_limit_is_refused_through_their_server(lab: TokenLab) -> None:
    bob = lab.servers["bob"]
    url = bob.url.replace("http", "ws") + "gpusched/api/events?after=-1"

    async def third_stream() -> httpclient.HTTPClientError:
        def connect() -> Any:
            req = httpclient.HTTPRequest(url, headers={"Authorization": f"token {bob.token}"})
            return websocket.websocket_connect(req)

        held = [await connect(), await connect()]
        try:
            with pytest.raises(httpclient.HTTPClientError) as info:
                await connect()
            return info.value
        finally:
            for conn in held:
                await close_websocket(conn)

    refused = IOLoop.current().run_sync(third_stream, timeout=30)
    assert refused.code == 429 and refused.response is not None
    assert refused.response.headers["Retry-After"] == "10"
    assert json.loads(refused.response.body)["message"].startswith(
        "bob has 2 streams open (event websockets and log follows), the limit "
        "(GpuSchedPolicy.user_limits['bob'] streams) is 2"
    )
