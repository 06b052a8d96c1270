"""Issue #30's scenario, end to end: a second user's every move, and the first user unhurt.

A real ``jupyter gpusched service`` (tokens it minted, limits on as a lab gets them) on a real
node: Debian's sshd, the Unix users alice and bob, jobs run as their owners through sudo (a
sudoers line naming a group of this module's own). Bob, with the API and a login on the node,
tries what the issue measured: poison values, NUL bytes and colliding paths; a flood of
far-future jobs; leases, websockets and uploads past his limits; ``ps`` on the node and the
store file; a log follow after his token is revoked; a job after he was taken out of the
sudoers group. After each move alice's work goes on as before, and she is shown nothing of
his, nor he of hers.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fixtures_notebooks import write_notebook
from _fixtures_owners import OwnersNode, running_owners_node, skip_reason
from _fixtures_polling import scaled, wait_for
from _fixtures_server import FAR_FUTURE
from _fixtures_service import ServiceProcess
from _fixtures_users import UnixUser, UserPython, unix_users, user_python
from tornado import httpclient, websocket

from jupyter_gpusched.client.api import close_websocket
from jupyter_gpusched.core.clock import SystemClock
from jupyter_gpusched.store import tokens
from jupyter_gpusched.store.store import Store

__all__ = ["unix_users", "user_python"]

pytestmark = [pytest.mark.sshd, pytest.mark.slow]

NB_SECRET, ENV_SECRET = "nb-param-5e0c1b", "env-value-93ad7f"
#: bob's own limits, small enough to reach in a test (everything else: the service defaults)
BOB_LIMITS = {"queued_jobs": 1200, "upload_bytes": "1M"}


class Lab:
    """The service on the node, the store (to mint and revoke tokens as the CLI does)."""

    def __init__(self, service: ServiceProcess, store: Store, node: OwnersNode, db: Path) -> None:
        self.service, self.store, self.node, self.db = service, store, node, db
        self.alice = tokens.mint(store, "alice")
        self.bob = tokens.mint(store, "bob")

    def call(self, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
        """(status, JSON answer, headers) of one request; errors are answers too."""
        return self.service.call(method, path, body, token=token)

    def ok(self, token: str, method: str, path: str, body: Any = None) -> Any:
        status, answer, _ = self.call(token, method, path, body)
        assert status in (200, 201), (status, answer)
        return answer

    def state(self, token: str, job_id: int, *states: str, timeout_s: float = 90) -> Any:
        return wait_for(
            lambda: self.ok(token, "GET", f"jobs/{job_id}"),
            lambda job: job["state"] in states,
            timeout_s=timeout_s,
            what=lambda job: f"job {job_id} to be {states}: {job['state']}, {job['reason']}",
        )

    def alice_runs_a_job(self) -> None:
        """alice's work goes on: a job of hers starts, runs as her and succeeds."""
        job = self.ok(self.alice, "POST", "jobs", {"kind": "script", "command": ["id", "-un"]})
        done = self.state(self.alice, job["id"], "succeeded", "failed")
        assert done["state"] == "succeeded", done
        req = urllib.request.Request(
            f"{self.service.url}gpusched/api/jobs/{job['id']}/log",
            headers={"Authorization": f"token {self.alice}"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.read() == b"alice\n"


@pytest.fixture(scope="module")
def lab(
    unix_users: dict[str, UnixUser],
    user_python: UserPython,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Lab]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    group = f"gpusched-s{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("second-user")
    try:
        with running_owners_node(user_python, unix_users, group=group) as node:
            service = ServiceProcess(
                root,
                nodes=[node.node_entry()],
                run_as="sudo",
                admins=("carol",),
                policy={"windows": [{"name": "all"}], "user_limits": {"bob": BOB_LIMITS}},
            ).start()
            db = root / "gpusched.db"
            store = Store(f"sqlite:///{db}", clock=SystemClock())
            try:
                yield Lab(service, store, node, db)
            finally:
                store.close()
                service.stop()
    finally:
        subprocess.run(["groupdel", group], capture_output=True)


# ------------------------------------------------------------------------------ his moves


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("jobs", {"kind": "script", "command": ["x"], "max_runtime_s": 3e11}, "max_runtime_s"),
        ("jobs", {"kind": "script", "command": ["x"], "max_runtime_s": 1e308}, "max_runtime_s"),
        ("jobs", {"kind": "script", "command": ["x"], "not_before": "9999-12-31T23:00:00Z"},
         "not_before"),
        ("notebooks", {"notebook": "n.ipynb", "content": {"cells": []}, "retries": 1,
                       "retry_backoff_s": 1e308}, "retry_backoff_s"),
        ("jobs", {"kind": "script", "command": ["echo", "a\u0000b"]}, "command"),
        ("jobs", {"kind": "script", "command": ["x"], "uploads": [
            {"name": "d/x", "content_base64": ""}, {"name": "d", "content_base64": ""}]},
         "uploads.1.name"),
    ],
)  # fmt: skip
def test_his_poison_values_get_422_naming_the_field(
    lab: Lab, path: str, body: dict[str, Any], field: str
) -> None:
    status, answer, _ = lab.call(lab.bob, "POST", path, body)
    assert (status, answer["field"]) == (422, field), answer


def test_after_his_poison_and_his_flood_her_jobs_start_and_her_reads_answer(lab: Lab) -> None:
    far = {"kind": "script", "command": ["true"], "not_before": FAR_FUTURE}
    flood = lab.ok(lab.bob, "POST", "jobs", {**far, "array": 1000})  # one record
    assert (len(flood["jobs"]), flood["pending"]) == (1, 999)
    status, answer, headers = lab.call(lab.bob, "POST", "jobs", {**far, "array": 1000})
    assert status == 429 and int(headers["Retry-After"]) > 0, answer
    # his pending tasks count as queued jobs
    assert "bob has 1,000 queued jobs and asks for 1,000 more" in answer["message"]
    assert "queued_jobs) is 1,200" in answer["message"]

    page = lab.ok(lab.alice, "GET", "jobs?limit=20")
    assert [(a["user"], a["pending"]) for a in page["arrays"]] == [("bob", 999)]
    seen = page["jobs"][0]
    assert seen["user"] == "bob" and seen["redacted"] and seen["handle"] == {}
    lab.alice_runs_a_job()


def test_his_leases_websockets_and_uploads_stop_at_his_limits_and_hers_go_on(lab: Lab) -> None:
    lease = {"kind": "lease", "gpus": 0, "not_before": FAR_FUTURE}  # queued: no kernel yet
    leases = [lab.call(lab.bob, "POST", "jobs", lease) for _ in range(5)]
    assert [status for status, _, _ in leases] == [201] * 4 + [429]
    assert "bob holds 4 leases" in leases[-1][1]["message"]

    big = base64.b64encode(b"x" * (1536 << 10)).decode()
    upload = {"kind": "script", "command": ["true"], "uploads": [{"name": "big.bin",
              "content_base64": big}]}  # fmt: skip
    status, answer, headers = lab.call(lab.bob, "POST", "jobs", upload)
    assert status == 429 and "upload_bytes" in answer["message"] and headers["Retry-After"]
    kept = lab.service.root / "service-data" / "users" / "bob" / "uploads"
    assert not kept.exists() or not any(p.is_file() for p in kept.rglob("*"))

    async def sockets() -> None:
        opened = [await _events(lab, lab.bob) for _ in range(16)]
        try:
            with pytest.raises(httpclient.HTTPClientError) as refused:
                await _events(lab, lab.bob)
            assert refused.value.code == 429
            hers = await _events(lab, lab.alice)  # her stream opens, his flood aside
            await close_websocket(hers)
        finally:
            for ws in opened:
                await close_websocket(ws)

    asyncio.run(sockets())
    for _, job, _ in leases[:4]:
        lab.ok(lab.bob, "DELETE", f"jobs/{job['id']}")
    lab.alice_runs_a_job()


def test_on_the_node_ps_and_the_store_file_show_him_nothing_of_hers(
    lab: Lab, tmp_path: Path, unix_users: dict[str, UnixUser]
) -> None:
    flag = Path("/tmp") / f"gpusched-second-{uuid.uuid4().hex[:8]}"
    wait = f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.1)"
    nb = write_notebook(tmp_path / "n.ipynb", [wait, "print(len(TOKEN))"], parameters="TOKEN=''")
    notebook = lab.ok(lab.alice, "POST", "notebooks", {
        "notebook": "n.ipynb", "content": json.loads(nb.read_text()), "gpus": 0,
        "parameters": {"TOKEN": NB_SECRET},
    })["job"]  # fmt: skip
    script = lab.ok(lab.alice, "POST", "jobs", {
        "kind": "script", "gpus": 0, "env": {"API_KEY": ENV_SECRET},
        "command": ["sh", "-c", f'while [ ! -e {flag} ]; do sleep 0.1; done; echo "$API_KEY"'],
    })  # fmt: skip
    try:
        for job in (notebook, script):
            lab.state(lab.alice, job["id"], "running")
        bob = unix_users["bob"]
        ps = bob.run(["ps", "-eo", "user,args"]).stdout
        assert "alice" in ps  # he sees her processes...
        assert NB_SECRET not in ps and ENV_SECRET not in ps  # ...not what she keeps secret
        cat = bob.run(["cat", str(lab.db)], check=False)
        assert cat.returncode != 0 and "Permission denied" in cat.stderr
        assert lab.db.stat().st_mode & 0o077 == 0 and lab.db.parent.stat().st_mode & 0o077 == 0

        theirs = lab.ok(lab.bob, "GET", f"jobs/{notebook['id']}")
        assert theirs["spec"]["parameters"] == {} and theirs["redacted"]
        events = lab.ok(lab.bob, "GET", f"jobs/{notebook['id']}/events")["events"]
        assert NB_SECRET not in json.dumps(events)
        assert all(e["kind"] != "progress" for e in events)
    finally:
        flag.touch()
    for job in (notebook, script):
        assert lab.state(lab.alice, job["id"], "succeeded", "failed")["state"] == "succeeded"
    log = urllib.request.Request(
        f"{lab.service.url}gpusched/api/jobs/{script['id']}/log",
        headers={"Authorization": f"token {lab.alice}"},
    )
    with urllib.request.urlopen(log, timeout=30) as resp:
        assert resp.read() == f"{ENV_SECRET}\n".encode()  # her job got its secret


def test_his_revoked_token_ends_his_follow_and_taken_out_of_sudoers_his_next_job_fails(
    lab: Lab,
) -> None:
    talker = {"kind": "script", "gpus": 0, "command": ["sh", "-c", "echo on; sleep 600"]}
    job = lab.ok(lab.bob, "POST", "jobs", talker)
    lab.state(lab.bob, job["id"], "running")

    async def follow_then_revoke() -> float:
        chunks: list[bytes] = []
        request = httpclient.HTTPRequest(
            f"{lab.service.url}gpusched/api/jobs/{job['id']}/log?follow=1",
            headers={"Authorization": f"token {lab.bob}"},
            streaming_callback=chunks.append,
            request_timeout=600,
        )
        client = httpclient.AsyncHTTPClient(force_instance=True)
        following = asyncio.ensure_future(client.fetch(request))
        try:
            while not chunks:  # the follow is on: the job's first line came
                assert not following.done(), following
                await asyncio.sleep(0.05)
            assert tokens.revoke(lab.store, "bob") == 1
            revoked = time.monotonic()
            await asyncio.wait_for(following, within_s)
            return time.monotonic() - revoked
        finally:
            client.close()

    within_s = scaled(5.0)  # on a quiet box; longer while the machine is loaded
    assert asyncio.run(follow_then_revoke()) < within_s
    assert lab.call(lab.bob, "GET", "jobs?limit=1")[0] == 401  # and the token opens nothing

    bob = tokens.mint(lab.store, "bob")
    lab.ok(bob, "DELETE", f"jobs/{job['id']}")
    lab.node.set_member("bob", False)
    try:
        late = lab.ok(bob, "POST", "jobs", {"kind": "script", "command": ["id", "-un"]})
        failed = lab.state(bob, late["id"], "failed", "succeeded", timeout_s=60)
        assert failed["state"] == "failed" and "sudo" in failed["reason"], failed
        lab.alice_runs_a_job()
    finally:
        lab.node.set_member("bob", True)


async def _events(lab: Lab, token: str) -> websocket.WebSocketClientConnection:
    request = httpclient.HTTPRequest(
        lab.service.url.replace("http", "ws") + "gpusched/api/events?after=-1",
        headers={"Authorization": f"token {token}"},
    )
    return await websocket.websocket_connect(request)
