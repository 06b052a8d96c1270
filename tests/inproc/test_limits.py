"""Per-user and per-group limits (issue #30, point 2): one user's flood leaves others served.

A live server with small limits configured: over a limit a request gets 429 with
``Retry-After`` and a message naming the limit's setting and the user's count (a bulk submit
over ``array_size``: 422); a job over ``running_jobs`` waits with a reason. Groups come from
the identity (``X-Test-Groups``, as JupyterHub's user model) and ``user_groups``; ``admin`` is
the server's admin. With no limits configured (a personal server) nothing is limited.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _fixtures_polling import wait_for_async
from _fixtures_server import FAR_FUTURE, TOKEN_GROUPS_HEADER, TOKEN_USER_HEADER, conforms, script
from tornado.httpclient import HTTPClientError
from traitlets.config import Config

if TYPE_CHECKING:
    from _fixtures_server import ApiClient

FAR = FAR_FUTURE
LATER = {"kind": "script", "command": ["true"], "not_before": FAR}  # queued for months
POLICY = {
    "limits": {
        "queued_jobs": 3,
        "running_jobs": 1,
        "array_size": 5,
        "leases": 1,
        "streams": 2,
        "upload_bytes": 1000,
    },
    "group_limits": {"lab": {"queued_jobs": 6}, "big": {"queued_jobs": 10, "leases": None}},
    "admin_limits": {"queued_jobs": None},
    "user_limits": {"ratty": {"submits_per_s": 0.05, "submit_burst": 2}},
    "user_groups": {"bob": ["lab"]},
}


@pytest.fixture
def policy() -> dict[str, Any]:
    """``c.GpuSchedPolicy`` of the server (a test may parametrize it)."""
    return POLICY


@pytest.fixture
def jp_server_config(jp_server_config: Config, policy: dict[str, Any]) -> Config:
    jp_server_config["GpuSchedPolicy"] = Config(policy)
    return jp_server_config


def refused(resp: Any, status: int = 429) -> dict[str, Any]:
    """The error body of a refusal with ``status``."""
    assert resp.code == status, (resp.code, resp.body[:300])
    return conforms(json.loads(resp.body), "Error")


async def test_a_user_at_her_queued_limit_gets_429_and_another_user_still_submits(
    gpusched: ApiClient,
) -> None:
    alice, bob = gpusched, gpusched.as_user("bob")
    resp = await alice.request("POST", "jobs", body={**LATER, "array": 4})  # counts all 4
    assert refused(resp)["message"] == (
        "alice has 0 queued jobs and asks for 4 more, the limit (GpuSchedPolicy.limits "
        "queued_jobs) is 3: wait for some to start, or cancel some"
    )
    assert resp.headers["Retry-After"] == "30"
    await alice.json("POST", "jobs", body=[LATER, LATER], expect=201)
    await alice.submit(**LATER)
    resp = await alice.request("POST", "jobs", body=LATER)
    body = refused(resp)
    assert body["error"] == "TooManyError" and body["message"].startswith(
        "alice has 3 queued jobs, the limit (GpuSchedPolicy.limits queued_jobs) is 3"
    )
    assert (await bob.submit(**LATER))["user"] == "bob"  # her flood is hers alone
    queued = await alice.json("GET", "jobs", params={"user": "alice", "state": "queued"})
    assert queued["total"] == 3


async def test_two_bulk_submits_at_once_cannot_both_pass_the_queued_limit(
    gpusched: ApiClient,
) -> None:
    bob = gpusched.as_user("bob")  # in 'lab' by user_groups: 6 queued
    first, second = await asyncio.gather(
        *(bob.request("POST", "jobs", body={**LATER, "array": 4}) for _ in range(2))
    )
    assert sorted([first.code, second.code]) == [201, 429], (first.body, second.body)
    queued = await bob.json("GET", "jobs", params={"user": "bob", "state": "queued"})
    # the array is one record: its task 0 queued, the rest pending (counted as queued)
    assert queued["total"] + sum(a["pending"] for a in queued["arrays"]) == 4


async def test_a_bulk_submit_past_array_size_is_refused_422_naming_the_limit(
    gpusched: ApiClient,
) -> None:
    array = refused(await gpusched.request("POST", "jobs", body={**LATER, "array": 6}), 422)
    assert array["field"] == "array"
    assert array["message"] == (
        "array: a bulk submit of 6 jobs, the limit (GpuSchedPolicy.limits array_size) is 5: "
        "split it into smaller ones"
    )
    listed = refused(await gpusched.request("POST", "jobs", body=[LATER] * 6), 422)
    assert listed["field"] == "body" and "array_size" in listed["message"]


async def test_group_and_admin_limits_override_everyones(gpusched: ApiClient) -> None:
    bob = gpusched.as_user("bob")  # in 'lab' by user_groups: 6 queued
    await bob.json("POST", "jobs", body={**LATER, "array": 5}, expect=201)
    over = refused(await bob.request("POST", "jobs", body={**LATER, "array": 2}))
    assert over["message"].startswith(
        "bob has 5 queued jobs and asks for 2 more, the limit "
        "(GpuSchedPolicy.group_limits['lab'] queued_jobs) is 6"
    )
    # in 'big' and 'lab' as the identity says: the more generous group's limit holds
    carol = gpusched.as_user("carol")
    groups = {TOKEN_GROUPS_HEADER: "big,lab"}
    for _ in range(2):
        resp = await carol.request("POST", "jobs", body={**LATER, "array": 5}, headers=groups)
        assert resp.code == 201, resp.body
    over = refused(await carol.request("POST", "jobs", body=LATER, headers=groups))
    assert "(GpuSchedPolicy.group_limits['big'] queued_jobs) is 10" in over["message"]
    admin = gpusched.as_user("admin")  # admin_limits: no queued limit
    for _ in range(3):
        await admin.json("POST", "jobs", body={**LATER, "array": 5}, expect=201)


async def test_the_policy_shows_everyones_the_groups_and_the_callers_own_limits(
    gpusched: ApiClient,
) -> None:
    resp = await gpusched.as_user("carol").request(
        "GET", "policy", headers={TOKEN_GROUPS_HEADER: "big,other"}
    )
    view = conforms(json.loads(resp.body), "Policy")
    limits = view["limits"]
    assert limits["everyone"]["queued_jobs"] == 3 and limits["everyone"]["streams"] == 2
    assert limits["groups"]["big"] == {"queued_jobs": 10, "leases": None}
    assert limits["admins"] == {"queued_jobs": None} and limits["users_with_own"] == 1
    assert (limits["yours"]["queued_jobs"], limits["yours"]["leases"]) == (10, None)
    assert limits["your_groups"] == ["big"]  # 'other' sets nothing
    assert limits["your_sources"]["queued_jobs"] == "GpuSchedPolicy.group_limits['big']"
    text = view["explanation"]
    assert "limits per user (GpuSchedPolicy.limits): queued jobs 3, running jobs 1" in text
    assert "yours (carol in big): queued jobs 10" in text


async def test_leases_at_once_are_limited_apart_from_other_jobs(gpusched: ApiClient) -> None:
    lease = {"kind": "lease", "gpus": 1, "not_before": FAR}
    await gpusched.submit(**lease)
    resp = await gpusched.request("POST", "jobs", body=lease)
    assert refused(resp)["message"] == (
        "alice holds 1 lease (queued or running), the limit (GpuSchedPolicy.limits leases) is "
        "1: release one (%gpu release, or shut down a GPU kernel)"
    )
    assert resp.headers["Retry-After"] == "30"
    await gpusched.submit(**LATER)  # a batch job is no lease


async def test_jobs_past_running_jobs_wait_with_a_reason_and_others_run(
    gpusched: ApiClient,
) -> None:
    sleeper = {"kind": "script", "command": script("import time; time.sleep(60)"), "gpus": 0}
    first = await gpusched.submit(**sleeper)
    await gpusched.wait_state(first["id"], "running")
    second = await gpusched.submit(**sleeper)
    waiting = await wait_for_async(
        lambda: gpusched.get(second["id"]),
        lambda job: job["reason"] is not None,
        what="the second job's waiting reason",
    )
    assert (waiting["state"], waiting["reason"]) == (
        "queued",
        "waiting: limit (alice runs 1 of 1 jobs)",
    )
    bobs = await gpusched.as_user("bob").submit(**sleeper)
    await gpusched.wait_state(bobs["id"], "running")
    await gpusched.json("DELETE", "jobs", str(first["id"]))
    await gpusched.wait_state(second["id"], "running")
    for job in (second, bobs):
        await gpusched.as_user(job["user"]).json("DELETE", "jobs", str(job["id"]))


async def test_streams_websockets_and_follows_together_are_refused_before_the_upgrade(
    gpusched: ApiClient, jp_ws_fetch: Any
) -> None:
    async def events(user: str = "alice") -> Any:
        return await jp_ws_fetch(
            "gpusched", "api", "events", params={"after": -1}, headers={TOKEN_USER_HEADER: user}
        )

    job = await gpusched.submit(**LATER)
    opened = [await events(), await events()]
    with pytest.raises(HTTPClientError) as info:
        await events()
    assert info.value.code == 429 and info.value.response is not None
    body = conforms(json.loads(info.value.response.body), "Error")
    assert body["message"] == (
        "alice has 2 streams open (event websockets and log follows), the limit "
        "(GpuSchedPolicy.limits streams) is 2: close a lab tab, a %gpu status widget or a "
        "log follow"
    )
    assert info.value.response.headers["Retry-After"] == "10"
    follow = await gpusched.request("GET", "jobs", str(job["id"]), "log", params={"follow": 1})
    assert "(GpuSchedPolicy.limits streams) is 2" in refused(follow)["message"]
    (await events("bob")).close()  # bob's are his own
    opened.pop().close()

    async def reopened() -> Any:
        try:
            return await events()
        except HTTPClientError as err:
            assert err.code == 429, err
            return None

    again = await wait_for_async(reopened, what="a stream once one was closed")
    for ws in (*opened, again):
        ws.close()


def upload(size: int) -> dict[str, Any]:
    """A job carrying one file of ``size`` bytes, queued for months."""
    data = base64.b64encode(b"x" * size).decode()
    return {**LATER, "uploads": [{"name": "data.bin", "content_base64": data, "mode": 0o600}]}


def upload_dirs(data_dir: Path, user: str = "alice") -> list[str]:
    """The request directories of ``user``'s uploads on the server."""
    folder = data_dir / "gpusched" / "files" / "users" / user / "uploads"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


async def test_upload_bytes_held_are_limited_and_a_cancelled_jobs_uploads_free_room(
    gpusched: ApiClient, jp_data_dir: Path
) -> None:
    first = await gpusched.submit(**upload(600))
    resp = await gpusched.request("POST", "jobs", body=upload(600))
    assert refused(resp)["message"] == (
        "alice holds 600B of uploaded files and notebooks and sends 600B more, the limit "
        "(GpuSchedPolicy.limits upload_bytes) is 1000B: wait for jobs that carry files to "
        "end, or cancel some"
    )
    assert resp.headers["Retry-After"] == "60"
    bad = await gpusched.request("POST", "jobs", body={**upload(10), "gpus": -1})
    assert refused(bad, 422)["field"] == "gpus"
    assert len(upload_dirs(jp_data_dir)) == 1  # refused requests leave no files
    await gpusched.json("DELETE", "jobs", str(first["id"]))
    await gpusched.submit(**upload(600))  # the cancelled job's files no longer count
    assert len(upload_dirs(jp_data_dir)) == 1


async def test_an_ended_jobs_uploads_are_removed(gpusched: ApiClient, jp_data_dir: Path) -> None:
    job = {
        "kind": "script",
        "command": script("print(len(open('data.bin','rb').read()))"),
        "gpus": 0,
    }
    done = await gpusched.submit(**{**upload(100), **job, "not_before": None})
    await gpusched.wait_state(done["id"], "succeeded")
    await wait_for_async(
        lambda: upload_dirs(jp_data_dir), lambda dirs: dirs == [], what="no uploads left"
    )


async def test_submissions_past_the_rate_wait_for_retry_after(gpusched: ApiClient) -> None:
    ratty = gpusched.as_user("ratty")
    for _ in range(2):  # the burst
        await ratty.submit(**LATER)
    resp = await ratty.request("POST", "jobs", body=LATER)
    message = refused(resp)["message"]
    assert message.startswith(
        "ratty sent more than 2 requests that create at once, the limit "
        "(GpuSchedPolicy.user_limits['ratty'] submits_per_s) is 0.1 a second: try again in"
    )
    assert 1 <= int(resp.headers["Retry-After"]) <= 20
    await gpusched.submit(**LATER)  # alice's bucket is her own


@pytest.mark.parametrize("policy", [{}])
async def test_a_personal_server_limits_nothing_by_default(gpusched: ApiClient) -> None:
    view = await gpusched.json("GET", "policy")
    assert set(view["limits"]["everyone"].values()) == {None}
    assert "limits per user: none" in view["explanation"]
    for _ in range(5):  # past the lab-wide service's 4 leases at once
        await gpusched.submit(kind="lease", gpus=1, not_before=FAR)
    await gpusched.json("POST", "jobs", body={**LATER, "array": 50}, expect=201)
