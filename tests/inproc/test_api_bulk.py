"""Bulk submits through a live Jupyter server: arrays (``array: N``) and lists of jobs."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import pytest
from _fixtures_polling import wait_for_async
from _fixtures_server import FAR_FUTURE, conforms

if TYPE_CHECKING:
    from _fixtures_server import ApiClient

PRINT_INDEX = [
    sys.executable,
    "-c",
    "import os; print(os.environ['GPUSCHED_ARRAY_ID'], os.environ['GPUSCHED_ARRAY_INDEX'])",
]


async def test_an_array_runs_each_task_with_its_index_and_lists_by_its_id(gpusched: ApiClient):
    resp = await gpusched.request(
        "POST", "jobs", body={"kind": "script", "command": PRINT_INDEX, "gpus": 0, "array": 3}
    )
    assert resp.code == 201, resp.body
    body = conforms(json.loads(resp.body), "JobArray")
    array_id = body["array_id"]
    assert (body["size"], body["pending"]) == (3, 2)  # one record: task 0, and 2 to make
    assert [j["id"] for j in body["jobs"]] == [array_id]
    assert resp.headers["Location"].endswith(f"/gpusched/api/jobs?array={array_id}")
    assert body["jobs"][0]["spec"]["labels"] == {"array_id": str(array_id), "array_index": "0"}

    logs = []
    for index in range(3):
        task = await wait_for_async(
            lambda i=index: gpusched.json("GET", "arrays", str(array_id), "tasks", str(i)),
            lambda t: t["job"] is not None and t["state"] in ("succeeded", "failed"),
            what=f"task {index} to end",
        )
        assert conforms(task, "ArrayTask")["state"] == "succeeded", task
        log = await gpusched.request("GET", "jobs", str(task["job"]["id"]), "log")
        logs.append(log.body.decode())
    assert logs == [f"{array_id} {i}\n" for i in range(3)]

    listed = await gpusched.json("GET", "jobs", params={"array": str(array_id)})
    assert listed["total"] == 3 and listed["arrays"] == []  # nothing pending any more
    array = conforms(await gpusched.json("GET", "arrays", str(array_id)), "ArrayView")
    assert (array["size"], array["pending"], array["counts"]) == (3, 0, {"succeeded": 3})


async def test_a_pending_array_is_one_line_its_tasks_wait_and_cancel_one_or_all(
    gpusched: ApiClient,
):
    job = {"kind": "script", "command": ["true"], "gpus": 1, "not_before": FAR_FUTURE}
    resp = await gpusched.request("POST", "jobs", body={**job, "array": 100_000})
    assert resp.code == 201, resp.body
    array_id = json.loads(resp.body)["array_id"]

    listed = await wait_for_async(  # the pending part waits with its queued task's reason
        lambda: gpusched.json("GET", "jobs", params={"user": "me"}),
        lambda page: any(a["reason"] for a in page["arrays"]),
        what="the array's waiting reason",
    )
    mine = [a for a in conforms(listed, "JobList")["arrays"] if a["id"] == array_id]
    assert [(a["pending"], a["pending_range"]) for a in mine] == [(99_999, "1-99999")]
    assert mine[0]["reason"].startswith("waiting: not before")
    task = await gpusched.json("GET", "arrays", str(array_id), "tasks", "7")
    assert (task["state"], task["job"]) == ("pending", None)
    assert task["detail"].startswith(f"task {array_id}_7 has not started")

    other = await gpusched.as_user("mallory").request("DELETE", "arrays", str(array_id))
    assert other.code == 403, other.body
    gone = await gpusched.request("DELETE", "arrays", str(array_id), "tasks", "7")
    assert json.loads(gone.body)["state"] == "cancelled"
    done = conforms(await gpusched.json("DELETE", "arrays", str(array_id)), "ArrayCancelled")
    assert (done["pending"], done["jobs"]) == (99_998, [array_id])
    assert done["array"]["pending"] == 0 and done["array"]["cancelled"] == 99_999
    missing = await gpusched.request("GET", "arrays", "999999999")
    assert missing.code == 404


async def test_a_list_of_jobs_is_queued_at_once_as_one_array(gpusched: ApiClient):
    specs = [
        {"kind": "script", "command": ["true"], "gpus": 1, "not_before": FAR_FUTURE},
        {"kind": "script", "command": ["false"], "gpus": 2, "name": "two", "labels": {"a": "b"}},
    ]
    specs[1]["not_before"] = FAR_FUTURE
    resp = await gpusched.request("POST", "jobs", body=specs)
    assert resp.code == 201, resp.body
    jobs = conforms(json.loads(resp.body), "JobArray")["jobs"]
    assert [(j["spec"]["gpus"], j["spec"]["name"], j["user"]) for j in jobs] == [
        (1, None, "alice"),
        (2, "two", "alice"),
    ]
    assert jobs[1]["spec"]["labels"] == {
        "a": "b",
        "array_id": str(jobs[0]["id"]),
        "array_index": "1",
    }
    assert jobs[1]["spec"]["env"]["GPUSCHED_ARRAY_INDEX"] == "1"


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"kind": "script", "command": ["true"], "array": 0}, "array", "from 1 to 10000000"),
        ({"kind": "script", "command": ["true"], "array": 10**7 + 1}, "array", "to 10000000,"),
        ({"kind": "script", "command": ["true"], "array": "3"}, "array", "got '3'"),
        ({"kind": "script", "command": ["true"], "array": True}, "array", "got True"),
        ([], "body", "a list of 1 to 10000 jobs, got 0"),
        ([{"kind": "script", "command": ["true"]}] * 10_001, "body", "got 10001"),
        ([{"kind": "script", "command": ["true"]}, {"kind": "script"}], "1.command", "needs"),
        ([{"kind": "script", "command": ["true"], "array": 2}], "0.array", "cannot be nested"),
        ([{"kind": "script", "command": ["true"], "user": "bob"}], "0.user", "leave it out"),
        ([{"kind": "script", "command": ["true"]}, 7], "1.body", "JSON object"),
    ],
)
async def test_bad_bulk_submits_are_422_naming_what_to_fix_and_queue_nothing(
    gpusched: ApiClient, body: Any, field: str, says: str
):
    before = (await gpusched.json("GET", "jobs", params={"limit": "0"}))["total"]
    resp = await gpusched.request("POST", "jobs", body=body)
    assert resp.code == 422, resp.body
    error = conforms(json.loads(resp.body), "Error")
    assert error["field"] == field and says in error["message"], error
    assert (await gpusched.json("GET", "jobs", params={"limit": "0"}))["total"] == before


async def test_a_bulk_submit_with_one_job_that_can_never_fit_queues_none(gpusched: ApiClient):
    before = (await gpusched.json("GET", "jobs", params={"limit": "0"}))["total"]
    specs = [
        {"kind": "script", "command": ["true"], "not_before": FAR_FUTURE},
        {"kind": "script", "command": ["true"], "gpus": 64},
    ]
    resp = await gpusched.request("POST", "jobs", body=specs)
    error = json.loads(resp.body)
    assert resp.code == 422 and error["error"] == "InfeasibleError", error
    assert error["message"].startswith("job 1 of 2: this job can never fit")
    assert (await gpusched.json("GET", "jobs", params={"limit": "0"}))["total"] == before
