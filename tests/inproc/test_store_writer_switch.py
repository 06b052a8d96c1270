"""``GpuSchedApp.store_writer_process``: on, submits are committed by a child process once it
is up; off, by the server's own thread, with no child ever started."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from _fixtures_polling import wait_for_async
from _fixtures_server import FAR_FUTURE

if TYPE_CHECKING:
    from _fixtures_server import ApiClient


@pytest.fixture(params=[True, False], ids=["process", "thread"])
def gpusched_overrides(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {"store_writer_process": request.param}


async def test_the_switch_decides_who_commits_submits(
    gpusched: ApiClient, jp_serverapp: Any, gpusched_overrides: dict[str, Any]
) -> None:
    group = jp_serverapp.web_app.settings["gpusched"]._group
    first = await gpusched.submit(kind="script", command=["true"], gpus=1, not_before=FAR_FUTURE)
    if gpusched_overrides["store_writer_process"]:
        writer = group._writer
        await wait_for_async(writer.ready, what="the store writer process")
        assert writer._proc.returncode is None
    else:
        assert group._writer is None  # so no child is ever started
    jobs = [
        await gpusched.submit(kind="script", command=["true"], gpus=1, not_before=FAR_FUTURE)
        for _ in range(3)
    ]
    assert [job["id"] for job in jobs] == [first["id"] + i for i in (1, 2, 3)]
    for job in jobs:
        assert (await gpusched.get(job["id"]))["state"] == "queued"
