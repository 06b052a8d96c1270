"""A per-job cap refused says which cap, and what the cluster offers instead (issue #32).

The refusals read "must be at most 64, not 100" and "gpu_mem_gb: must be at most 1024.0":
which limit, and what may one ask instead on a lab of 4-GPU, 80G nodes?
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from _fixtures_server import conforms

if TYPE_CHECKING:
    from _fixtures_server import ApiClient


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        (
            {"gpus": 100},
            "gpus",
            "gpus: must be at most 64 (the per-job cap on GPUs), not 100; the largest node "
            "here has 4 GPUs (g0): ask for 4 or fewer",
        ),
        (
            {"gpu_mem_gb": 2000},
            "gpu_mem_gb",
            "gpu_mem_gb: must be at most 1024 (the per-job cap on GPU memory in GB, on each "
            "GPU), not 2000; the largest GPU here has 80G (A100-80GB on g0): ask for 80G or less",
        ),
        (
            {"mem_gb": 20000},
            "mem_gb",
            "mem_gb: must be at most 16384 (the per-job cap on host memory in GB), not 20000; "
            "the largest node here has 256G of host memory (g0): ask for 256G or less",
        ),
    ],
)
async def test_a_cap_refused_names_the_cap_and_what_the_largest_node_offers(
    gpusched: ApiClient, fields: dict[str, Any], field: str, message: str
) -> None:
    resp = await gpusched.request(
        "POST", "jobs", body={"kind": "script", "command": ["true"], **fields}
    )
    assert resp.code == 422, resp.body
    body = conforms(json.loads(resp.body), "Error")
    assert (body["field"], body["message"]) == (field, message)


async def test_a_cap_refused_in_a_list_names_the_job_too(gpusched: ApiClient) -> None:
    one = {"kind": "script", "command": ["true"]}
    resp = await gpusched.request("POST", "jobs", body=[one, {**one, "gpus": 99}])
    body = conforms(json.loads(resp.body), "Error")
    assert body["field"] == "1.gpus"
    assert body["message"].endswith(
        "not 99; the largest node here has 4 GPUs (g0): ask for 4 or fewer"
    )


async def test_a_cap_refused_for_a_notebook_names_the_largest_node_too(
    gpusched: ApiClient,
) -> None:
    resp = await gpusched.request("POST", "notebooks", body={"notebook": "nb.ipynb", "gpus": 80})
    body = conforms(json.loads(resp.body), "Error")
    assert resp.code == 422 and body["field"] == "gpus", body
    assert body["message"] == (
        "gpus: must be at most 64 (the per-job cap on GPUs), not 80; the largest node here "
        "has 4 GPUs (g0): ask for 4 or fewer"
    )
