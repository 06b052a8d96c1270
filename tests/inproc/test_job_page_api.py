"""The routes a job page reads: its timeline and its GPUs' history, on a live server."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import pytest
from _fixtures_polling import wait_for_async
from _fixtures_server import conforms

if TYPE_CHECKING:
    from _fixtures_server import ApiClient

BUSY = [sys.executable, "-c", "import time; time.sleep(2.5)"]


@pytest.fixture
def gpusched_overrides() -> dict[str, Any]:
    """Probe every 0.3 s, so a 2.5 s job leaves several samples."""
    return {"inventory_interval_s": 0.3}


async def test_a_job_timeline_lists_its_state_changes_with_reasons(gpusched: ApiClient) -> None:
    job = await gpusched.submit(kind="script", command=BUSY, gpus=1, gpu_mem_gb=4)
    await gpusched.wait_state(job["id"], "succeeded")
    body = conforms(await gpusched.json("GET", "jobs", str(job["id"]), "events"), "JobEvents")
    moves = [(e["from_state"], e["to_state"]) for e in body["events"] if e["kind"] == "state"]
    assert moves == [("queued", "starting"), ("starting", "running"), ("running", "succeeded")]
    assert body["events"][0]["kind"] == "submitted"
    placed = next(e for e in body["events"] if e["to_state"] == "starting")
    assert placed["detail"]["reason"].startswith("placed on g")
    assert placed["detail"]["reason"].endswith(", 4G of each")
    assert all(e["job"] is None for e in body["events"])


async def test_a_job_gpu_history_covers_its_gpus_over_its_life(gpusched: ApiClient) -> None:
    job = await gpusched.submit(kind="script", command=BUSY, gpus=1, gpu_mem_gb=8)
    done = await gpusched.wait_state(job["id"], "succeeded")
    node, (gpu,) = done["placement"]["node"], done["placement"]["gpu_indices"]

    async def samples() -> dict[str, Any]:
        return await gpusched.json("GET", "cluster", "history", params={"job": job["id"]})

    body = conforms(
        await wait_for_async(samples, lambda b: b["series"], what="the job's samples"),
        "GpuHistory",
    )
    (series,) = body["series"]
    assert (series["node"], series["index"]) == (node, gpu)
    assert len(series["at"]) >= 2 and all(job["id"] in j for j in series["jobs"])
    assert max(series["util_pct"]) > 0 and max(series["mem_used_gb"]) >= 8
    assert body["interval_s"] == 0.3 and body["kept_samples"] == 2880

    whole = await gpusched.json("GET", "cluster", "history", params={"node": node, "gpu": "0,1"})
    assert [(s["node"], s["index"]) for s in whole["series"]] == [(node, 0), (node, 1)]
    few = await gpusched.json("GET", "cluster", "history", params={"node": node, "points": 2})
    assert all(len(s["at"]) <= 2 for s in few["series"])


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"gpu": "zero"}, "gpu"),
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-11-23"}, "until"),
    ],
)
async def test_history_refuses_bad_filters_saying_what_to_fix(
    gpusched: ApiClient, params: dict[str, str], field: str
) -> None:
    resp = await gpusched.request("GET", "cluster", "history", params=params)
    assert resp.code == 422, resp.body
    assert json.loads(resp.body)["field"] == field


async def test_the_timeline_of_an_unknown_job_is_404(gpusched: ApiClient) -> None:
    resp = await gpusched.request("GET", "jobs", "999", "events")
    assert resp.code == 404
