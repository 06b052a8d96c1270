"""The only node is off at start: the API answers and jobs queue (issue #15, item 6).

Before, every route answered 422 "nodes: a cluster needs at least one node" and the server log
said nothing.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _fixtures_polling import wait_for_async

if TYPE_CHECKING:
    from _fixtures_server import ApiClient


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once closed


@pytest.fixture
def gpusched_overrides(tmp_path: Path) -> dict[str, Any]:
    known = tmp_path / "known_hosts"
    known.write_text("")
    node = {"name": "gpu1", "host": "127.0.0.1", "port": _closed_port()}
    return {"nodes": [node], "known_hosts": str(known)}


async def test_with_its_only_node_off_the_api_answers_and_jobs_queue(gpusched: ApiClient) -> None:
    cluster = await gpusched.json("GET", "cluster")
    (node,) = cluster["nodes"]
    assert (node["name"], node["up"]) == ("gpu1", False) and "gpu1" in node["error"]
    job = await gpusched.submit(kind="script", command=["true"])
    assert job["state"] == "queued"
    listed = await gpusched.json("GET", "jobs")
    assert [j["id"] for j in listed["jobs"]] == [job["id"]]
    await gpusched.json("GET", "policy")
    # a pass over the queue says why it waits
    waiting = await wait_for_async(
        lambda: gpusched.get(job["id"]), lambda job: "no node is up" in (job["reason"] or "")
    )
    assert "no node is up (gpu1:" in waiting["reason"]
