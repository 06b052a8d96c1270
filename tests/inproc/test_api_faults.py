"""Faults at the API: oversized requests, abandoned log follows (issue #15, items 4 and 5)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import TYPE_CHECKING, Any

import pytest
from _fixtures_server import TOKEN_USER_HEADER, conforms

if TYPE_CHECKING:
    from _fixtures_server import ApiClient

FOLLOWS = 3
COUNT = "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.2)"


@pytest.fixture
def gpusched_overrides() -> dict[str, Any]:
    return {"max_request_bytes": 512 * 1024, "max_follows_per_user": FOLLOWS}


def script(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def error(resp: Any, status: int) -> dict[str, Any]:
    assert resp.code == status, (resp.code, resp.body[:300])
    return conforms(json.loads(resp.body), "Error")


async def test_a_300KB_argument_is_refused_with_the_limit_and_a_body_past_the_limit_413(
    gpusched: ApiClient,
) -> None:
    arg = await gpusched.request(
        "POST", "jobs", body={"kind": "script", "command": ["echo", "x" * 300_000]}
    )
    body = error(arg, 422)
    assert body["field"] == "command" and "at most 128K each" in body["message"]
    huge = await gpusched.request(
        "POST", "jobs", body={"kind": "script", "command": ["true"], "labels": {"a": "x" * 600_000}}
    )
    body = error(huge, 413)
    assert body["error"] == "PayloadTooLarge"
    assert "at most 512K" in body["message"] and "max_request_bytes" in body["message"]
    label = await gpusched.request(
        "POST", "jobs", body={"kind": "script", "command": ["true"], "labels": {"a": "x" * 5000}}
    )
    assert error(label, 422)["field"] == "labels.a"


class Follow:
    """A raw ``log?follow=1`` request that a test can drop as a client would."""

    def __init__(self, app: Any, job_id: int, user: str) -> None:
        self.app, self.job_id, self.user = app, job_id, user
        self.status = ""

    async def open(self) -> Follow:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.app.port)
        path = f"{self.app.base_url}gpusched/api/jobs/{self.job_id}/log?follow=1"
        token = self.app.identity_provider.token
        self.writer.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: token {token}\r\n"
            f"{TOKEN_USER_HEADER}: {self.user}\r\n\r\n".encode()
        )
        await self.writer.drain()
        line = await asyncio.wait_for(self.reader.readline(), 10)
        self.status = line.decode().split()[1]
        return self

    def drop(self) -> None:
        self.writer.close()


def followers() -> list[int]:
    """Pids of node-side log followers (the sim runs them as local processes)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"--follow" in argv and b"jupyter_gpusched.node.agent" in argv:
            found.append(int(pid))
    return found


async def test_abandoned_follows_stop_and_never_hold_up_another_users_follow(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    bob = gpusched.as_user("bob")
    quiet = await bob.submit(
        kind="script", command=script("import time; time.sleep(60)"), gpu_models=["T4"]
    )
    await bob.wait_state(quiet["id"], "running")
    for _ in range(3):  # 9 follows dropped in all: never more than FOLLOWS open at once
        opened = [await Follow(jp_serverapp, quiet["id"], "bob").open() for _ in range(FOLLOWS)]
        assert [f.status for f in opened] == ["200"] * FOLLOWS
        await asyncio.sleep(0.3)
        for follow in opened:
            follow.drop()
        await asyncio.sleep(0.3)
    hers = await gpusched.submit(kind="script", command=script("print('hi')"), gpu_models=["T4"])
    resp = await asyncio.wait_for(
        gpusched.request("GET", "jobs", str(hers["id"]), "log", params={"follow": 1}), 20
    )
    assert resp.code == 200 and resp.body == b"hi\n"
    await asyncio.sleep(1.0)  # a dropped follower sees its stdin close within 0.2 s
    assert followers() == []
    await bob.request("DELETE", "jobs", str(quiet["id"]))


async def test_follows_are_bounded_per_user_and_a_full_node_still_serves_a_follow(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    bob, carol = gpusched.as_user("bob"), gpusched.as_user("carol")
    sleeper = script("import time; time.sleep(60)")
    half_t4: dict[str, Any] = {"gpu_models": ["T4"], "gpu_share": 0.5}
    quiet = await bob.submit(kind="script", command=sleeper, **half_t4)
    await bob.wait_state(quiet["id"], "running")
    held = [await Follow(jp_serverapp, quiet["id"], "bob").open() for _ in range(FOLLOWS)]
    extra = await Follow(jp_serverapp, quiet["id"], "bob").open()
    assert extra.status == "429"
    extra.drop()
    hers = await carol.submit(kind="script", command=sleeper, **half_t4)
    await carol.wait_state(hers["id"], "running")
    held += [await Follow(jp_serverapp, hers["id"], "carol").open() for _ in range(FOLLOWS)]
    assert [f.status for f in held] == ["200"] * (2 * FOLLOWS)
    await asyncio.sleep(0.5)  # the node's follow channels (4 of its 8) are all taken now
    alice = await gpusched.submit(
        kind="script",
        command=script(
            "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.2)"
        ),
        **half_t4,
    )
    resp = await asyncio.wait_for(
        gpusched.request("GET", "jobs", str(alice["id"]), "log", params={"follow": 1}), 20
    )
    assert resp.code == 200 and resp.body == b"0\n1\n2\n"
    for follow in held:
        follow.drop()
    await bob.request("DELETE", "jobs", str(quiet["id"]))
    await carol.request("DELETE", "jobs", str(hers["id"]))
