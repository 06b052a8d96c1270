"""Lease kernels server side: launch on the node, forwarded ports, who may connect, reconnects."""

from __future__ import annotations

import asyncio
import json
import os
from typing import TYPE_CHECKING, Any

from _fixtures_polling import wait_for_async
from _fixtures_server import FAR_FUTURE, conforms
from jupyter_client.asynchronous import AsyncKernelClient

from jupyter_gpusched.core.models import Job, JobSpec
from jupyter_gpusched.leases.bridge import connection_file_name, lease_command
from jupyter_gpusched.node.kernel import PORT_KEYS

if TYPE_CHECKING:
    from _fixtures_server import ApiClient


async def _kernel(gpusched: ApiClient, job_id: int, timeout_s: float = 30.0) -> dict[str, Any]:
    async def ask() -> Any:
        resp = await gpusched.request("GET", "leases", str(job_id), "kernel")
        # 409: not running yet; 502: its node is unreachable (while a test drops it)
        assert resp.code in (200, 409, 502), (resp.code, resp.body)
        return resp

    resp = await wait_for_async(ask, lambda r: r.code == 200, timeout_s=timeout_s, what="kernel")
    return conforms(json.loads(resp.body), "LeaseKernel")


async def _run(info: dict[str, Any], code: str) -> tuple[str, dict[str, Any]]:
    """Execute ``code`` through the forwarded ports; its stdout and the execute reply."""
    kc = AsyncKernelClient()
    kc.load_connection_info(info)
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=30)
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = await kc.execute_interactive(code, output_hook=hook, timeout=30)
        return "".join(out), reply["content"]
    finally:
        kc.stop_channels()


def _refused(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_a_lease_runs_this_module_as_a_kernel_writing_its_connection_file_by_job() -> None:
    job = Job(id=7, attempt=2, spec=JobSpec(kind="lease"), submitted_at="2026-11-23T09:00:00+00:00")
    assert connection_file_name(job) == "kernel-7.2.json"
    assert lease_command(job, "/opt/py/bin/python") == [
        "/opt/py/bin/python",
        "-m",
        "jupyter_gpusched.node.kernel",
        "kernel",
        "--connection-file",
        "kernel-7.2.json",
    ]


async def test_kernel_connection_is_refused_with_409_until_the_lease_runs(gpusched: ApiClient):
    lease = await gpusched.submit(kind="lease", not_before=FAR_FUTURE)
    resp = await gpusched.request("GET", "leases", str(lease["id"]), "kernel")
    assert resp.code == 409
    body = json.loads(resp.body)
    assert body["error"] == "ConflictError"
    assert body["message"].startswith(f"lease {lease['id']} is queued")
    script = await gpusched.submit(kind="script", command=["x"], not_before=FAR_FUTURE)
    resp = await gpusched.request("GET", "leases", str(script["id"]), "kernel")
    assert (resp.code, json.loads(resp.body)["error"]) == (404, "NotFoundError")


async def test_the_kernel_runs_on_the_node_and_only_its_owner_may_connect(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    lease = await gpusched.submit(kind="lease", gpus=1)
    answer = await _kernel(gpusched, lease["id"])
    info = answer["connection"]
    assert info["ip"] == "127.0.0.1" and info["transport"] == "tcp" and info["key"]
    # any local user of a shared node could read plain TCP; CurveZMQ keys close that
    assert info["curve_publickey"] and info["curve_secretkey"]
    assert len({info[k] for k in PORT_KEYS}) == 5
    assert answer["lease"]["id"] == lease["id"] and answer["lease"]["state"] == "running"
    out, reply = await _run(
        info,
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.getpid(), "
        "'JPY_PARENT_PID' in os.environ)",
    )
    assert reply["status"] == "ok"
    cuda, pid, parent_pid = out.split()
    placement = answer["lease"]["placement"]
    assert cuda == ",".join(placement["gpu_uuids"])
    assert int(pid) != os.getpid() and parent_pid == "False"
    # the connection file on the node is private
    job_dir = answer["lease"]["handle"]["job_dir"]
    mode = os.stat(os.path.join(job_dir, f"kernel-{lease['id']}.0.json")).st_mode & 0o777
    assert mode == 0o600
    bob = await gpusched.as_user("bob").request("GET", "leases", str(lease["id"]), "kernel")
    assert (bob.code, json.loads(bob.body)["error"]) == (403, "ForbiddenError")
    admin = await gpusched.as_user("admin").request("GET", "leases", str(lease["id"]), "kernel")
    assert admin.code == 200


async def test_reading_the_kernel_counts_as_activity(gpusched: ApiClient) -> None:
    lease = await gpusched.submit(kind="lease", gpus=1)
    first = (await _kernel(gpusched, lease["id"]))["lease"]["last_activity_at"]
    await asyncio.sleep(0.05)
    second = (await _kernel(gpusched, lease["id"]))["lease"]["last_activity_at"]
    assert second > first


async def test_forwards_come_back_on_the_same_ports_after_the_connection_drops(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    lease = await gpusched.submit(kind="lease", gpus=1)
    before = await _kernel(gpusched, lease["id"])
    out, _ = await _run(before["connection"], "x = 5; print(x)")
    assert out == "5\n"
    sim = jp_serverapp.web_app.settings["gpusched_app"]._sim
    node = before["lease"]["placement"]["node"]
    await sim.stop_node(node)  # the network drops: every SSH connection to the node closes
    await sim.start_node(node)
    after = await wait_for_async(
        lambda: _kernel(gpusched, lease["id"]),
        lambda after: after["generation"] > before["generation"],
        interval_s=0.1,
        what="the forwards to come back",
    )
    assert after["connection"] == before["connection"]
    out, _ = await _run(after["connection"], "print(x + 1)")
    assert out == "6\n"  # the same kernel, reached again


async def test_ending_a_lease_closes_its_forwards_and_stops_its_kernel(
    gpusched: ApiClient,
) -> None:
    lease = await gpusched.submit(kind="lease", gpus=1)
    info = (await _kernel(gpusched, lease["id"]))["connection"]
    assert not _refused(info["shell_port"])
    released = await gpusched.json("DELETE", "leases", str(lease["id"]))
    assert released["state"] == "cancelled"
    await wait_for_async(lambda: all(_refused(info[k]) for k in PORT_KEYS), what="forwards closed")
    resp = await gpusched.request("GET", "leases", str(lease["id"]), "kernel")
    assert resp.code == 409 and "has ended" in json.loads(resp.body)["message"]
