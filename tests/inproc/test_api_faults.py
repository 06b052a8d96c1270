"""Faults at the API: oversized requests, abandoned log follows (issue #15, items 4 and 5)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

import pytest
from _fixtures_follows import Follow, node_followers
from _fixtures_polling import wait_for_async
from _fixtures_server import conforms

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


async def test_abandoned_follows_stop_and_never_hold_up_another_users_follow(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    bob = gpusched.as_user("bob")
    quiet = await bob.submit(
        kind="script", command=script("import time; time.sleep(600)"), gpu_models=["T4"]
    )
    await bob.wait_state(quiet["id"], "running")
    for _ in range(3):  # 9 follows dropped in all: never more than FOLLOWS open at once
        opened = [await Follow(jp_serverapp, quiet["id"], "bob").open() for _ in range(FOLLOWS)]
        assert [f.status for f in opened] == ["200"] * FOLLOWS
        await wait_for_async(
            lambda: len(node_followers(jp_serverapp)),
            lambda n: n == FOLLOWS,
            timeout_s=60,
            what=lambda n: f"bob's {FOLLOWS} followers to run on the node; {n} run",
        )
        for follow in opened:
            follow.drop()
        await wait_for_gone(jp_serverapp)
    hers = await gpusched.submit(kind="script", command=script("print('hi')"), gpu_models=["T4"])
    resp = await asyncio.wait_for(
        gpusched.request("GET", "jobs", str(hers["id"]), "log", params={"follow": 1}), 120
    )
    assert resp.code == 200 and resp.body == b"hi\n"
    await wait_for_gone(jp_serverapp)
    await bob.request("DELETE", "jobs", str(quiet["id"]))


async def wait_for_gone(app: Any) -> None:
    """Wait (generously: the box may be busy) until no log follower runs on the nodes."""
    await wait_for_async(
        lambda: node_followers(app),
        lambda pids: not pids,
        timeout_s=60,
        what=lambda pids: f"the node's log followers to end; {len(pids)} still run",
    )


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
    await wait_for_async(  # the node's follow channels (4 of its 8) are all taken now
        lambda: len(node_followers(jp_serverapp)),
        lambda n: n >= 4,
        timeout_s=60,
        what=lambda n: f"4 followers to run on the node; {n} run",
    )
    alice = await gpusched.submit(
        kind="script",
        command=script(
            "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.2)"
        ),
        **half_t4,
    )
    resp = await asyncio.wait_for(
        gpusched.request("GET", "jobs", str(alice["id"]), "log", params={"follow": 1}), 120
    )
    assert resp.code == 200 and resp.body == b"0\n1\n2\n"
    for follow in held:
        follow.drop()
    await bob.request("DELETE", "jobs", str(quiet["id"]))
    await carol.request("DELETE", "jobs", str(hers["id"]))
