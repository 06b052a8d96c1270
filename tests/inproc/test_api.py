"""The REST + websocket API against a live Jupyter server on the embedded simulated cluster."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from _fixtures_server import FAR_FUTURE, OPENAPI, conforms

if TYPE_CHECKING:
    from _fixtures_server import ApiClient


def script(code: str) -> list[str]:
    """argv of a Python one-liner job (the sim runs real local processes)."""
    return [sys.executable, "-c", code]


SLEEPER = script("import time; print('started', flush=True); time.sleep(60)")


def is_error(resp: Any, status: int, error: str, field: str | None = None) -> dict:
    """The response is a documented error body with this status and class."""
    assert resp.code == status, (resp.code, resp.body)
    assert resp.headers["Content-Type"].startswith("application/json")
    body = conforms(json.loads(resp.body), "Error")
    assert body["error"] == error, body
    if field is not None:
        assert body.get("field") == field, body
    return body


# ---------------------------------------------------------------------------- submit, get


async def test_submit_answers_201_with_location_and_the_caller_as_owner(gpusched: ApiClient):
    resp = await gpusched.request(
        "POST",
        "jobs",
        body={
            "kind": "script",
            "command": ["python", "x.py"],
            "gpus": 2,
            "gpu_mem_gb": 16,
            "not_before": FAR_FUTURE,
        },
    )
    assert resp.code == 201
    job = conforms(json.loads(resp.body), "Job")
    assert resp.headers["Location"].endswith(f"/gpusched/api/jobs/{job['id']}")
    assert job["user"] == "alice" and job["spec"]["user"] == "alice"
    assert job["state"] == "queued"
    # A placing pass may run between the two reads and write a waiting reason, so compare
    # what a pass cannot change.
    again = conforms(await gpusched.get(job["id"]), "Job")
    assert (again["id"], again["spec"], again["user"]) == (job["id"], job["spec"], job["user"])


async def test_script_runs_to_success_and_its_log_can_be_read(gpusched: ApiClient):
    job = await gpusched.submit(kind="script", command=script("print('hello from the gpu')"))
    done = conforms(await gpusched.wait_state(job["id"], "succeeded", "failed"), "Job")
    assert (done["state"], done["exit_code"]) == ("succeeded", 0)
    assert done["placement"]["node"] in ("g0", "g1")
    resp = await gpusched.request("GET", "jobs", str(job["id"]), "log")
    assert resp.code == 200 and resp.body == b"hello from the gpu\n"
    assert resp.headers["Content-Type"].startswith("text/plain")
    assert resp.headers["X-Log-Offset"] == str(len(resp.body))


async def test_failing_script_keeps_its_exit_code(gpusched: ApiClient):
    job = await gpusched.submit(kind="script", command=script("raise SystemExit(3)"))
    done = await gpusched.wait_state(job["id"], "succeeded", "failed")
    assert (done["state"], done["exit_code"]) == ("failed", 3)


async def test_log_slices_by_offset_and_limit(gpusched: ApiClient):
    job = await gpusched.submit(kind="script", command=script("print('0123456789')"))
    await gpusched.wait_state(job["id"], "succeeded")
    resp = await gpusched.request(
        "GET", "jobs", str(job["id"]), "log", params={"offset": 2, "limit": 3}
    )
    assert resp.body == b"234" and resp.headers["X-Log-Offset"] == "5"


async def test_follow_streams_the_log_until_the_job_ends(gpusched: ApiClient):
    code = "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.2)"
    job = await gpusched.submit(kind="script", command=script(code))
    resp = await gpusched.request("GET", "jobs", str(job["id"]), "log", params={"follow": 1})
    assert resp.code == 200 and resp.body == b"0\n1\n2\n"
    assert (await gpusched.get(job["id"]))["state"] in ("running", "succeeded")


# ---------------------------------------------------------------------------- list


async def test_list_filters_by_state_user_and_kind_and_pages(gpusched: ApiClient):
    bob = gpusched.as_user("bob")
    mine = [
        await gpusched.submit(kind="script", command=["x"], not_before=FAR_FUTURE) for _ in range(3)
    ]
    theirs = await bob.submit(kind="script", command=["y"], not_before=FAR_FUTURE)
    page = conforms(
        await gpusched.json("GET", "jobs", params={"user": "me", "limit": 2}), "JobList"
    )
    assert page["total"] == 3 and page["limit"] == 2 and page["offset"] == 0
    assert [j["id"] for j in page["jobs"]] == [mine[0]["id"], mine[1]["id"]]
    rest = await gpusched.json("GET", "jobs", params={"user": "me", "limit": 2, "offset": 2})
    assert [j["id"] for j in rest["jobs"]] == [mine[2]["id"]]
    newest = await gpusched.json("GET", "jobs", params={"order": "-id", "limit": 2})
    assert [j["id"] for j in newest["jobs"]] == [theirs["id"], mine[2]["id"]]
    assert newest["total"] == 4
    bobs = await gpusched.json("GET", "jobs", params={"user": "bob"})
    assert [j["id"] for j in bobs["jobs"]] == [theirs["id"]]
    queued = await gpusched.json("GET", "jobs", params={"state": "queued,running"})
    assert queued["total"] == 4
    assert (await gpusched.json("GET", "jobs", params={"state": "succeeded"}))["total"] == 0
    assert (await gpusched.json("GET", "jobs", params={"kind": "lease"}))["total"] == 0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"state": "sleeping"}, "state"),
        ({"kind": "cron"}, "kind"),
        ({"limit": "ten"}, "limit"),
        ({"limit": 100000}, "limit"),
        ({"offset": -1}, "offset"),
        ({"order": "age"}, "order"),
    ],
)
async def test_bad_query_arguments_are_422_naming_the_argument(
    gpusched: ApiClient, params: dict, field: str
):
    is_error(await gpusched.request("GET", "jobs", params=params), 422, "InvalidSpecError", field)


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("spec", "field", "hint"),
    [
        ({"kind": "script"}, "command", "needs a command"),
        ({"kind": "script", "command": ["x"], "gpus": -1}, "gpus", "must be at least 0, not -1"),
        ({"kind": "script", "command": ["x"], "gpuz": 1}, "gpuz", "unknown field"),
        ({"kind": "script", "command": ["x"], "user": "mallory"}, "user", "leave it out"),
        (7, "body", "JSON object"),
        (["not", "an", "object"], "0.body", "JSON object"),  # a list is a bulk submit
    ],
)
async def test_invalid_spec_is_422_naming_the_field_to_fix(
    gpusched: ApiClient, spec: Any, field: str, hint: str
):
    body = is_error(
        await gpusched.request("POST", "jobs", body=spec), 422, "InvalidSpecError", field
    )
    assert hint in body["message"]


async def test_job_that_can_never_fit_is_422_infeasible(gpusched: ApiClient):
    resp = await gpusched.request(
        "POST", "jobs", body={"kind": "script", "command": ["x"], "gpus": 16}
    )
    assert "never fit" in is_error(resp, 422, "InfeasibleError")["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"kind": NaN}', b"\xff\xfe"])
async def test_unreadable_body_is_400(gpusched: ApiClient, raw: bytes):
    is_error(await gpusched.request("POST", "jobs", raw_body=raw), 400, "BadRequestError")


@pytest.mark.parametrize("job_id", ["999", "99999999999999999999999999", "abc", "-1"])
async def test_unknown_job_is_404(gpusched: ApiClient, job_id: str):
    for method in ("GET", "DELETE"):
        is_error(await gpusched.request(method, "jobs", job_id), 404, "NotFoundError")
    is_error(await gpusched.request("GET", "jobs", job_id, "log"), 404, "NotFoundError")
    resp = await gpusched.request("PATCH", "jobs", job_id, body={"held": True})
    is_error(resp, 404, "NotFoundError")


async def test_missing_token_is_401_and_wrong_method_405(gpusched: ApiClient):
    resp = await gpusched.request("GET", "jobs", headers={"Authorization": ""})
    body = is_error(resp, 401, "Unauthorized")
    assert "token" in body["message"]
    resp = await gpusched.request(
        "POST", "jobs", body={"kind": "lease"}, headers={"Authorization": "token wrong"}
    )
    is_error(resp, 401, "Unauthorized")
    is_error(await gpusched.request("PUT", "cluster", body={}), 405, "MethodNotAllowed")
    is_error(await gpusched.request("GET", "no", "such", "route"), 404, "NotFound")


async def test_a_request_with_its_token_is_not_answered_with_a_login_cookie(
    gpusched: ApiClient, jp_fetch: Any
):
    # An API client sends its token every time and never reads the cookie Jupyter would sign
    # for it on every request (a tenth of a submit's server time); Jupyter's routes still do.
    ours = await gpusched.request(
        "POST", "jobs", body={"kind": "script", "command": ["true"], "not_before": FAR_FUTURE}
    )
    assert ours.code == 201 and "Set-Cookie" not in ours.headers
    theirs = await jp_fetch("api", "me")
    assert "Set-Cookie" in theirs.headers


# ---------------------------------------------------------------------------- cancel, patch


async def test_cancel_a_queued_job_then_again_is_409(gpusched: ApiClient):
    job = await gpusched.submit(kind="script", command=["x"], not_before=FAR_FUTURE)
    cancelled = conforms(await gpusched.json("DELETE", "jobs", str(job["id"])), "Job")
    assert cancelled["state"] == "cancelled" and "alice" in cancelled["reason"]
    body = is_error(await gpusched.request("DELETE", "jobs", str(job["id"])), 409, "ConflictError")
    assert "already cancelled" in body["message"]


async def test_cancel_a_running_job_stops_its_process(gpusched: ApiClient):
    job = await gpusched.submit(kind="script", command=SLEEPER)
    await gpusched.wait_state(job["id"], "running")
    cancelled = await gpusched.json("DELETE", "jobs", str(job["id"]))
    assert cancelled["state"] == "cancelled"
    await asyncio.sleep(0.3)
    assert (await gpusched.get(job["id"]))["state"] == "cancelled"


async def test_only_owner_or_admin_may_cancel_or_change_a_job(gpusched: ApiClient):
    job = await gpusched.submit(kind="script", command=["x"], not_before=FAR_FUTURE)
    bob = gpusched.as_user("bob")
    body = is_error(await bob.request("DELETE", "jobs", str(job["id"])), 403, "ForbiddenError")
    assert "alice" in body["message"]
    is_error(
        await bob.request("PATCH", "jobs", str(job["id"]), body={"held": True}),
        403,
        "ForbiddenError",
    )
    body = is_error(await bob.request("GET", "jobs", str(job["id"]), "log"), 403, "ForbiddenError")
    assert "log" in body["message"]
    assert (await gpusched.get(job["id"]))["state"] == "queued"
    held = await gpusched.as_user("admin").json(
        "PATCH", "jobs", str(job["id"]), body={"held": True}
    )
    assert held["held"] is True
    gone = await gpusched.as_user("admin").json("DELETE", "jobs", str(job["id"]))
    assert gone["state"] == "cancelled"


async def test_patch_holds_and_reprioritises_a_queued_job(gpusched: ApiClient):
    job = await gpusched.submit(kind="script", command=["x"], not_before=FAR_FUTURE)
    changed = await gpusched.json(
        "PATCH", "jobs", str(job["id"]), body={"held": True, "priority": "interactive"}
    )
    assert changed["held"] is True and changed["spec"]["priority"] == "interactive"
    again = await gpusched.json("PATCH", "jobs", str(job["id"]), body={"held": False})
    assert again["held"] is False and again["spec"]["priority"] == "interactive"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"held": "yes"}, "held"),
        ({"priority": "urgent"}, "priority"),
        ({"gpus": 4}, "gpus"),
        ({}, "body"),
        ([1], "body"),
    ],
)
async def test_bad_patch_is_422_naming_the_field(gpusched: ApiClient, body: Any, field: str):
    job = await gpusched.submit(kind="script", command=["x"], not_before=FAR_FUTURE)
    resp = await gpusched.request("PATCH", "jobs", str(job["id"]), body=body)
    is_error(resp, 422, "InvalidSpecError", field)


async def test_patch_of_a_finished_job_is_409(gpusched: ApiClient):
    job = await gpusched.submit(kind="script", command=["x"], not_before=FAR_FUTURE)
    await gpusched.json("DELETE", "jobs", str(job["id"]))
    resp = await gpusched.request("PATCH", "jobs", str(job["id"]), body={"held": True})
    is_error(resp, 409, "ConflictError")


# ---------------------------------------------------------------------------- leases


async def test_leases_list_only_mine_and_all_needs_admin(gpusched: ApiClient):
    assert await gpusched.json("GET", "leases") == {"leases": []}
    is_error(await gpusched.request("GET", "leases", params={"user": "all"}), 403, "Forbidden")
    assert await gpusched.as_user("admin").json("GET", "leases", params={"user": "all"}) == {
        "leases": []
    }


async def test_releasing_a_job_that_is_no_lease_is_404(gpusched: ApiClient):
    job = await gpusched.submit(kind="script", command=["x"], not_before=FAR_FUTURE)
    body = is_error(
        await gpusched.request("DELETE", "leases", str(job["id"])), 404, "NotFoundError"
    )
    assert "not a lease" in body["message"]


# ---------------------------------------------------------------------------- cluster, policy


async def test_cluster_shows_every_gpu_and_who_holds_it(gpusched: ApiClient):
    job = await gpusched.submit(kind="script", command=SLEEPER, gpus=2)
    running = await gpusched.wait_state(job["id"], "running")
    cluster = conforms(await gpusched.json("GET", "cluster"), "Cluster")
    assert [n["name"] for n in cluster["nodes"]] == ["g0", "g1"]
    assert cluster["metrics"]["gpus_total"] == 6
    node = next(n for n in cluster["nodes"] if n["name"] == running["placement"]["node"])
    held = [g for g in node["gpus"] if g["jobs"]]
    assert sorted(g["index"] for g in held) == running["placement"]["gpu_indices"]
    assert {g["state"] for g in held} == {"batch"}
    assert held[0]["jobs"][0]["id"] == job["id"] and held[0]["jobs"][0]["user"] == "alice"
    assert cluster["queue"]["running"] == 1
    await gpusched.json("DELETE", "jobs", str(job["id"]))


async def test_policy_explains_the_window_at_a_time(gpusched: ApiClient):
    now = await gpusched.json("GET", "policy")
    assert now["window"]["name"] and now["explanation"]
    at = await gpusched.json("GET", "policy", params={"at": "2026-11-24T03:00:00+00:00"})
    assert at["window"]["name"]
    is_error(
        await gpusched.request("GET", "policy", params={"at": "2026-11-24T03:00:00"}),
        422,
        "InvalidSpecError",
        "at",
    )
    is_error(
        await gpusched.request("GET", "policy", params={"at": "tomorrow"}),
        422,
        "InvalidSpecError",
        "at",
    )


async def test_openapi_file_is_served_and_parses(gpusched: ApiClient):
    resp = await gpusched.request("GET", "openapi.yaml")
    assert resp.code == 200 and yaml.safe_load(resp.body) == OPENAPI


def test_openapi_job_spec_lists_every_model_field():
    from jupyter_gpusched.core.models import JobSpec

    schemas = OPENAPI["components"]["schemas"]
    assert set(schemas["JobSpec"]["properties"]) == set(JobSpec.model_fields)
    posted = set(schemas["JobPost"]["properties"])
    assert posted == set(JobSpec.model_fields) - {"user"} | {"uploads", "array", "at", "timezone"}


# ---------------------------------------------------------------------------- wiring


def test_server_tells_its_kernels_where_it_is(gpusched: ApiClient, jp_serverapp: Any):
    import os

    assert os.environ["GPUSCHED_URL"] == jp_serverapp.connection_url
    assert os.environ["GPUSCHED_TOKEN"] == jp_serverapp.identity_provider.token


@pytest.mark.parametrize(
    ("trait", "value", "hint"),
    [
        ("nodes", [{"host": "gpu1"}], "needs 'name' and 'host'"),
        ("nodes", [{"name": "a", "host": "h", "pasword": "x"}], "unknown keys ['pasword']"),
        ("packer_policy", "tetris", "tetris"),
        ("tick_interval_s", 0.0, "0.0"),
        ("sim_nodes", [{"name": "n", "gpus": 2}], "give name, gpu_model"),
    ],
)
def test_bad_config_is_refused_quoting_the_value(trait: str, value: Any, hint: str):
    from traitlets import TraitError

    from jupyter_gpusched.server.app import GpuSchedApp

    with pytest.raises(TraitError, match=re.escape(hint)):
        GpuSchedApp(**{trait: value})


# ---------------------------------------------------------------------------- events


async def _next_event(ws: Any, timeout_s: float = 10.0) -> dict:
    message = await asyncio.wait_for(ws.read_message(), timeout_s)
    assert message is not None, "the events websocket closed"
    return conforms(json.loads(message), "Event")


async def test_events_stream_over_the_websocket_and_resume_after_an_id(
    gpusched: ApiClient, jp_ws_fetch: Any
):
    ws = await jp_ws_fetch("gpusched", "api", "events", params={"after": 0})
    job = await gpusched.submit(kind="script", command=script("print(1)"))
    seen, maps = [], []
    while not (maps and any(e.get("to_state") == "succeeded" for e in seen)):
        event = await _next_event(ws)
        if event.get("job_id") == job["id"]:
            seen.append(event)
        if event["kind"] == "cluster":
            maps.append(event)
    ws.close()
    assert seen[0]["kind"] == "submitted" and seen[0]["job"]["id"] == job["id"]
    assert [e["to_state"] for e in seen if e["kind"] == "state"][-1] == "succeeded"
    assert [n["name"] for n in conforms(maps[0]["cluster"], "Cluster")["nodes"]] == ["g0", "g1"]

    resumed = await jp_ws_fetch("gpusched", "api", "events", params={"after": seen[0]["id"]})
    first = await _next_event(resumed)
    resumed.close()
    assert first["id"] > seen[0]["id"]


async def test_events_websocket_needs_a_token(gpusched: ApiClient, jp_ws_fetch: Any):
    from tornado.httpclient import HTTPClientError

    with pytest.raises(HTTPClientError) as err:
        await jp_ws_fetch("gpusched", "api", "events", headers={"Authorization": ""})
    assert err.value.code == 401
