"""A dropped log follow ends its node process, however fast follows come and go (issue #31).

The simulated nodes run each follow as a real ``agent log --follow`` process behind a real
asyncssh channel, so what a dropped client leaves behind is counted on the node itself.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from _fixtures_follows import Follow, node_followers
from _fixtures_polling import wait_for_async
from _fixtures_server import script

if TYPE_CHECKING:
    from _fixtures_server import ApiClient

DROPS = 200


@pytest.fixture
def gpusched_overrides() -> dict[str, Any]:
    # room for every follow still closing when the next opens: the test is about the node
    return {"max_follows_per_user": DROPS}


async def test_200_follows_dropped_fast_leave_no_process_on_the_node(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    quiet = await gpusched.submit(
        kind="script", command=script("import time; time.sleep(600)"), gpu_models=["T4"]
    )
    await gpusched.wait_state(quiet["id"], "running")
    statuses = set()
    for _ in range(DROPS):
        # dropped as soon as the follow is on: its node channel is still opening
        follow = await Follow(jp_serverapp, quiet["id"], "alice").open()
        statuses.add(follow.status)
        follow.drop()
        await asyncio.sleep(0.05)
    assert statuses == {"200"}
    left = await wait_for_async(
        lambda: node_followers(jp_serverapp),
        lambda pids: not pids,
        timeout_s=60,
        what=lambda pids: f"the node's log followers to end; {len(pids)} still run",
    )
    assert left == []
    await gpusched.request("DELETE", "jobs", str(quiet["id"]))
