"""GPU kernels: jupyter_client's kernel manager on the provisioner, against live servers.

Most tests run the kernel manager here, as it runs inside a Jupyter server; the provisioner
reaches the test server's gpusched API as it reaches its own server's. The ``*_in_the_server``
tests start kernels through the server's own kernels API, so the provisioner runs in the
server process (culling, activity). The kernel is a lease's remote ipykernel on the embedded
cluster (g0: 4 A100, g1: 2 T4).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import zmq.asyncio
from _fixtures_live_server import api
from _fixtures_polling import Deadline, scaled
from _fixtures_server import ServerProcess
from _fixtures_service import ServiceProcess, client_server
from jupyter_client.manager import AsyncKernelManager
from tornado import httpclient, websocket
from traitlets.config import Config

from jupyter_gpusched.client.provisioner import KERNEL_LABEL, GpuKernelError

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]


def manager(server: ServerProcess, kernel_name: str = "gpusched-1gpu", **kw: Any) -> Any:
    """A kernel manager whose provisioner talks to ``server``."""
    config = Config(
        {"GpuLeaseProvisioner": {"url": server.url, "token": server.token, **kw.pop("cfg", {})}}
    )
    return AsyncKernelManager(kernel_name=kernel_name, config=config, **kw)


async def run(kc: Any, code: str, out: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    """Execute ``code``; what it printed (also appended to ``out`` as it comes) and the reply."""
    out = [] if out is None else out

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(msg["content"]["ename"])

    reply = await kc.execute_interactive(code, output_hook=hook, timeout=scaled(60))
    return "".join(out), reply["content"]


def lease_of(server: ServerProcess, kernel_id: str) -> dict[str, Any]:
    """The newest lease labelled with ``kernel_id``."""
    jobs = api(server, "GET", "jobs?kind=lease&limit=1000")["jobs"]
    mine = [j for j in jobs if j["spec"]["labels"].get(KERNEL_LABEL) == kernel_id]
    assert mine, f"no lease for kernel {kernel_id}"
    return mine[-1]


def live_leases(server: ServerProcess) -> list[dict[str, Any]]:
    return api(server, "GET", "leases")["leases"]


def start_server(root: Path, *, window: dict[str, Any], **config: Any) -> ServerProcess:
    """A server on one policy window (no day/night surprises) and extra config sections."""
    server = ServerProcess(root)
    path = root / "config" / "jupyter_server_config.json"
    settings = json.loads(path.read_text())
    settings["GpuSchedPolicy"] = {"windows": [{"name": "all", **window}]}
    settings.update(config)
    path.write_text(json.dumps(settings))
    return server.start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The server the kernel managers of this module's tests talk to."""
    server = start_server(tmp_path_factory.mktemp("gpu-kernel"), window={})
    yield server
    server.stop()


def write_notebook(path: Path, kernel: dict[str, Any] | None) -> Path:
    """A notebook whose metadata asks its GPU kernel for ``kernel`` (None: nothing)."""
    meta: dict[str, Any] = {"kernelspec": {"name": "gpusched-1gpu", "display_name": "GPU"}}
    if kernel is not None:
        meta["gpusched"] = {"kernel": kernel}
    path.write_text(json.dumps({"cells": [], "metadata": meta, "nbformat": 4, "nbformat_minor": 5}))
    return path


async def start_for(server: ServerProcess, notebook: Path) -> Any:
    """A GPU kernel started for ``notebook`` (as a server starts one for a session)."""
    km = manager(server)
    env = {**os.environ, "JPY_SESSION_NAME": str(notebook)}
    await km.start_kernel(cwd=str(notebook.parent), env=env)
    return km


async def until(check: Any, timeout_s: float = 30.0, what: str = "it") -> Any:
    deadline = Deadline(timeout_s)
    while not deadline.expired():
        if value := check():
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {deadline} waiting for {what}")


@pytest_asyncio.fixture
async def started(server: ServerProcess, tmp_path: Path) -> AsyncIterator[Any]:
    """A started GPU kernel and a client; shut down (and its lease released) afterwards."""
    km = manager(server)
    await km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=scaled(30))
    yield km, kc
    kc.stop_channels()
    if km.has_kernel:
        await km.shutdown_kernel(now=True)
    assert live_leases(server) == []


async def test_the_kernel_is_the_lease_s_remote_kernel_and_keeps_it_across_a_restart(
    started: Any, server: ServerProcess
) -> None:
    km, kc = started
    lease = lease_of(server, km.kernel_id)
    assert (lease["state"], lease["spec"]["gpus"]) == ("running", 1)
    assert lease["spec"]["lease_name"] == f"kernel-{km.kernel_id}"
    out, _ = await run(
        kc, "import os\ngpu_only_name = 41\nprint(os.environ['CUDA_VISIBLE_DEVICES'])"
    )
    assert out.strip() == ",".join(lease["placement"]["gpu_uuids"])
    out, _ = await run(kc, f"print(gpu_only_name + 1, os.getpid() != {os.getpid()})")
    assert out == "42 True\n"
    # IDE features are answered by the kernel that holds the data
    reply = await kc.complete("gpu_only_na", reply=True, timeout=scaled(30))
    assert reply["content"]["matches"] == ["gpu_only_name"]
    pid, _ = await run(kc, "print(os.getpid())")

    spinning: list[str] = []
    spin = asyncio.ensure_future(
        run(kc, "print('spinning', flush=True)\nwhile True: pass", spinning)
    )
    await until(lambda: spinning, what="the cell to spin")
    await km.interrupt_kernel()
    out, reply = await spin
    assert (out, reply["status"], reply["ename"]) == (
        "spinning\nKeyboardInterrupt",
        "error",
        "KeyboardInterrupt",
    )

    await km.restart_kernel()
    await kc.wait_for_ready(timeout=scaled(30))
    out, _ = await run(kc, "import os\nprint('gpu_only_name' in dir(), os.getpid())")
    gone, new_pid = out.split()
    assert gone == "False" and new_pid != pid.strip()
    again = lease_of(server, km.kernel_id)
    assert (again["id"], again["state"]) == (lease["id"], "running")  # the same GPUs

    await km.shutdown_kernel()
    released = lease_of(server, km.kernel_id)
    assert released["state"] in ("succeeded", "cancelled")
    assert live_leases(server) == []


async def test_a_manager_started_again_after_a_shutdown_takes_a_new_lease(
    server: ServerProcess,
) -> None:
    # a manager on a shared context (as a server's are) outlives its kernel's shutdown
    context = zmq.asyncio.Context()
    km = manager(server, context=context)
    try:
        await km.start_kernel()
        first = lease_of(server, km.kernel_id)
        await km.shutdown_kernel(now=True)
        await km.start_kernel()
        second = lease_of(server, km.kernel_id)
        assert second["id"] != first["id"] and second["state"] == "running"
        assert api(server, "GET", f"jobs/{first['id']}")["state"] in ("succeeded", "cancelled")
    finally:
        if km.has_kernel:
            await km.shutdown_kernel(now=True)
        context.destroy(linger=0)
    assert live_leases(server) == []


async def test_the_notebook_picks_its_gpu_and_a_changed_request_takes_a_new_lease_on_restart(
    server: ServerProcess, tmp_path: Path
) -> None:
    notebook = write_notebook(tmp_path / "t4.ipynb", {"gpu_models": ["T4"]})
    km = await start_for(server, notebook)
    try:
        first = lease_of(server, km.kernel_id)
        assert first["placement"]["node"] == "g1"  # the T4 node
        assert first["spec"]["labels"]["gpusched.notebook"] == "t4.ipynb"
        # named after its notebook (the panel's notebook column reads the lease's name)
        assert first["spec"]["lease_name"] == f"{notebook}:kernel"
        assert first["spec"]["name"] == "t4.ipynb · Python 3 (1 GPU)"
        write_notebook(notebook, {"gpu_models": ["A100"], "gpu_mem_gb": "20G"})
        await km.restart_kernel()
        second = lease_of(server, km.kernel_id)
        assert second["id"] != first["id"]
        assert (second["placement"]["node"], second["spec"]["gpu_mem_gb"]) == ("g0", 20.0)
        assert api(server, "GET", f"jobs/{first['id']}")["state"] == "cancelled"
    finally:
        await km.shutdown_kernel()
    assert live_leases(server) == []


async def test_a_waiting_kernel_says_where_it_stands_and_cancelling_its_lease_fails_the_start(
    server: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # every GPU held by batch jobs that may run 10 minutes (this window preempts nothing)
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    specs = [{"kind": "script", "command": sleep, "gpus": n, "max_runtime_s": 600} for n in (4, 2)]
    blockers = [api(server, "POST", "jobs", spec) for spec in specs]
    for blocker in blockers:
        await until(lambda b=blocker: api(server, "GET", f"jobs/{b['id']}")["state"] == "running")
    notebook = write_notebook(tmp_path / "wait.ipynb", None)
    caplog.set_level(logging.INFO)
    starting = asyncio.ensure_future(start_for(server, notebook))
    try:
        waiting = await until(
            lambda: [
                j
                for j in api(server, "GET", "jobs?kind=lease&state=queued")["jobs"]
                if j["spec"]["labels"].get("gpusched.notebook") == "wait.ipynb"
                and j["estimated_start"]
                and j["reason"]  # written apart from the estimate: it may come a pass later
            ],
            what="the kernel's lease to wait with an expected start and a reason",
        )
        (lease,) = waiting
        assert lease["position"] == 1 and lease["reason"].startswith("waiting: needs 1 GPU")
        assert 500 < time_until(lease["estimated_start"]) <= 600  # the blockers' runtime
        assert not starting.done()  # the kernel waits, saying where it stands:
        await until(lambda: f"lease {lease['id']} queued, #1 in the queue" in caplog.text)
        api(server, "DELETE", f"leases/{lease['id']}")
        with pytest.raises(GpuKernelError) as failed:
            await asyncio.wait_for(starting, scaled(30))
        assert str(failed.value).startswith(
            f"GPU kernel not started: lease {lease['id']} cancelled"
        )
    finally:
        starting.cancel()
        for blocker in blockers:
            api(server, "DELETE", f"jobs/{blocker['id']}")
    await until(lambda: live_leases(server) == [], what="the leases to end")


async def test_a_request_no_node_can_hold_fails_the_start_at_once(
    server: ServerProcess, tmp_path: Path
) -> None:
    notebook = write_notebook(tmp_path / "huge.ipynb", {"gpus": 16})
    with pytest.raises(GpuKernelError) as failed:
        await start_for(server, notebook)
    assert str(failed.value).startswith("no GPU kernel: this job can never fit")
    notebook = write_notebook(tmp_path / "typo.ipynb", {"gpu": 2})
    with pytest.raises(Exception, match=r"metadata\.gpusched\.kernel\.gpu: unknown field"):
        await start_for(server, notebook)
    assert live_leases(server) == []


def time_until(iso: str) -> float:
    from datetime import UTC, datetime

    return (datetime.fromisoformat(iso) - datetime.now(UTC)).total_seconds()


# ------------------------------------------------------------------ in the server


def rest(server: ServerProcess, method: str, path: str, body: Any = None) -> Any:
    """A call to the server's own REST API (kernels); None for empty answers."""
    import urllib.request

    req = urllib.request.Request(
        server.url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=scaled(60)) as resp:
        data = resp.read()
        return json.loads(data) if data else None


async def execute_through_the_server(server: ServerProcess, kernel_id: str, code: str) -> str:
    """Run ``code`` over the kernel's websocket, as JupyterLab does; what it printed."""
    url = f"{server.url.replace('http', 'ws')}api/kernels/{kernel_id}/channels"
    req = httpclient.HTTPRequest(url, headers={"Authorization": f"token {server.token}"})
    conn = await websocket.websocket_connect(req)
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "session": uuid.uuid4().hex,
              "username": "test", "version": "5.3", "date": "2026-11-23T09:00:00Z"}  # fmt: skip
    content = {"code": code, "silent": False, "store_history": True, "allow_stdin": False}
    await conn.write_message(
        json.dumps(
            {
                "header": header,
                "parent_header": {},
                "metadata": {},
                "content": content,
                "channel": "shell",
                "buffers": [],
            }
        )  # fmt: skip
    )
    out = []
    try:
        while True:
            msg = json.loads(await asyncio.wait_for(conn.read_message(), scaled(60)))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(out)
    finally:
        conn.close()


def kernel_ids(server: ServerProcess) -> set[str]:
    return {k["id"] for k in rest(server, "GET", "api/kernels")}


#: Leases idle this long are reclaimed: 3 s on a quiet box, stretched with the load (a
#: kernel's start over SSH on a loaded box took longer, and its lease was reclaimed: a 500).
IDLE_S = round(scaled(3.0), 1)


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Leases idle for IDLE_S are reclaimed; the provisioner looks and reports often."""
    server = start_server(
        tmp_path_factory.mktemp("idle"),
        window={"lease_idle_timeout_s": IDLE_S},
        GpuLeaseProvisioner={"watch_interval_s": 0.3, "touch_interval_s": 0.5},
    )
    yield server
    server.stop()


async def test_a_busy_kernel_keeps_its_lease_and_an_idle_one_is_reclaimed_and_culled_in_the_server(
    idle_server: ServerProcess,
) -> None:
    kernel = rest(idle_server, "POST", "api/kernels", {"name": "gpusched-1gpu"})
    lease = lease_of(idle_server, kernel["id"])
    out = await execute_through_the_server(
        idle_server,
        kernel["id"],
        f"import os, time\ntime.sleep({IDLE_S + 2})\nprint(os.environ['CUDA_VISIBLE_DEVICES'])",
    )
    assert out.strip() == ",".join(lease["placement"]["gpu_uuids"])
    # a running cell is use: busy past the idle timeout did not count against it
    assert api(idle_server, "GET", f"jobs/{lease['id']}")["state"] == "running"
    await until(lambda: kernel["id"] not in kernel_ids(idle_server), 30, "the kernel to be culled")
    ended = api(idle_server, "GET", f"jobs/{lease['id']}")
    assert ended["state"] == "cancelled" and "idle" in ended["reason"]
    assert "reclaimed" in idle_server.log_text().split(f"lease {lease['id']} ended (")[1]


@pytest.fixture(scope="module")
def culling_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Jupyter's own culler shuts kernels down after 3 s without use."""
    server = start_server(
        tmp_path_factory.mktemp("cull"),
        window={},
        MappingKernelManager={"cull_idle_timeout": 3, "cull_interval": 1},
    )
    yield server
    server.stop()


async def test_culling_a_gpu_kernel_in_the_server_releases_its_lease(
    culling_server: ServerProcess,
) -> None:
    kernel = rest(culling_server, "POST", "api/kernels", {"name": "gpusched-1gpu-24gb"})
    lease = lease_of(culling_server, kernel["id"])
    assert (lease["state"], lease["spec"]["gpu_mem_gb"]) == ("running", 24.0)
    await until(lambda: kernel["id"] not in kernel_ids(culling_server), 30, "the culler")
    ended = api(culling_server, "GET", f"jobs/{lease['id']}")
    assert ended["state"] in ("cancelled", "succeeded")
    assert live_leases(culling_server) == []


async def block_every_gpu(server: ServerProcess) -> list[dict[str, Any]]:
    """Batch jobs running on every GPU, each allowed 10 minutes (the window preempts nothing)."""
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    specs = [{"kind": "script", "command": sleep, "gpus": n, "max_runtime_s": 600} for n in (4, 2)]
    blockers = [api(server, "POST", "jobs", spec) for spec in specs]
    for blocker in blockers:
        await until(lambda b=blocker: api(server, "GET", f"jobs/{b['id']}")["state"] == "running")
    return blockers


def unblock(server: ServerProcess, blockers: list[dict[str, Any]]) -> None:
    for blocker in blockers:
        if api(server, "GET", f"jobs/{blocker['id']}")["state"] == "running":
            api(server, "DELETE", f"jobs/{blocker['id']}")


async def open_session(server: ServerProcess, path: str) -> Any:
    """``POST api/sessions`` for a GPU notebook, as JupyterLab opens one: the answer, or the
    HTTP error (it blocks while the kernel waits)."""
    import urllib.error

    body = {"path": path, "type": "notebook", "name": path, "kernel": {"name": "gpusched-1gpu"}}
    try:
        return await asyncio.to_thread(rest, server, "POST", "api/sessions", body)
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())["message"]


def queued_lease(server: ServerProcess, notebook: str, query: str = "&state=queued") -> list[Any]:
    """The leases (queued ones by default) of ``notebook``'s GPU kernels."""
    jobs = api(server, "GET", f"jobs?kind=lease{query}")["jobs"]
    return [j for j in jobs if j["spec"]["labels"].get("gpusched.notebook") == notebook]


async def test_cancelling_a_waiting_gpu_kernel_in_the_server_is_a_409_not_a_500(
    server: ServerProcess,
) -> None:
    blockers = await block_every_gpu(server)
    try:
        opening = asyncio.ensure_future(open_session(server, "cancel-me.ipynb"))
        (lease,) = await until(lambda: queued_lease(server, "cancel-me.ipynb"), what="a lease")
        api(server, "DELETE", f"leases/{lease['id']}")
        status, message = await asyncio.wait_for(opening, scaled(60))
        assert status == 409
        assert message.startswith(f"GPU kernel not started: lease {lease['id']} cancelled")
        log = server.log_text()
        assert " 500 POST /api/sessions" not in log and "Traceback" not in log
    finally:
        unblock(server, blockers)
    await until(lambda: live_leases(server) == [], what="the leases to end")


async def test_one_sigterm_stops_the_server_after_gpu_kernel_starts_ended_early(
    tmp_path: Path,
) -> None:
    # a failed start stayed among jupyter_client's pending kernels: at shutdown "HTTP 404 ...
    # Kernel does not exist" stopped the cleanup, and a second SIGTERM was needed
    server = start_server(tmp_path, window={})
    try:
        blockers = await block_every_gpu(server)
        first = asyncio.ensure_future(open_session(server, "stop.ipynb"))
        (lease,) = await until(lambda: queued_lease(server, "stop.ipynb"), what="a lease")
        second = asyncio.ensure_future(open_session(server, "stop.ipynb"))  # a reload
        assert (await asyncio.wait_for(first, scaled(60)))[0] == 409
        unblock(server, blockers)
        assert (await asyncio.wait_for(second, scaled(60)))["kernel"]["id"]  # runs
    finally:
        code = server.stop(timeout_s=scaled(30))
    assert code == 0, "the server did not stop on one SIGTERM"
    assert "Kernel does not exist" not in server.log_text()


async def test_a_notebook_opened_again_while_its_kernel_waits_takes_over_the_waiting_lease(
    server: ServerProcess,
) -> None:
    blockers = await block_every_gpu(server)
    try:
        first = asyncio.ensure_future(open_session(server, "reloaded.ipynb"))
        (lease,) = await until(lambda: queued_lease(server, "reloaded.ipynb"), what="a lease")
        # the page is reloaded: JupyterLab finds no session yet and asks for a kernel again
        second = asyncio.ensure_future(open_session(server, "reloaded.ipynb"))
        status, message = await asyncio.wait_for(first, scaled(60))
        assert status == 409 and "took over lease" in message
        assert [j["id"] for j in queued_lease(server, "reloaded.ipynb")] == [lease["id"]]
        unblock(server, blockers)
        session = await asyncio.wait_for(second, scaled(60))
        assert [s["kernel"]["id"] for s in rest(server, "GET", "api/sessions")] == [
            session["kernel"]["id"]
        ]
        ran = api(server, "GET", f"jobs/{lease['id']}")
        assert ran["state"] == "running"  # the one lease, no second request for GPUs
        assert len(queued_lease(server, "reloaded.ipynb", query="")) == 1
        node, gpu = ran["placement"]["node"], ran["placement"]["gpu_indices"][0]
        await until(lambda: f"ready on {node} GPU {gpu} (lease {lease['id']})" in server.log_text())
        rest(server, "DELETE", f"api/sessions/{session['id']}")
    finally:
        unblock(server, blockers)
    await until(lambda: live_leases(server) == [], what="the leases to end")


# ------------------------------------------------------------------ the lab-wide service


async def test_a_gpu_kernel_through_a_client_mode_server_runs_on_the_service_s_cluster(
    tmp_path: Path,
) -> None:
    service = ServiceProcess(tmp_path / "service").start()
    alice = client_server(tmp_path / "alice", service, service.mint("alice")).start()
    try:
        km = manager(alice)
        await km.start_kernel(cwd=str(alice.root))
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=scaled(30))
        lease = lease_of(alice, km.kernel_id)
        assert lease["user"] == "alice"
        out, _ = await run(kc, "import os\nprint(os.environ['CUDA_VISIBLE_DEVICES'])")
        assert out.strip() == ",".join(lease["placement"]["gpu_uuids"])
        kc.stop_channels()
        await km.shutdown_kernel()
        held = service.api("GET", "leases?user=all", token=service.admin_token)["leases"]
        assert held == []
    finally:
        alice.stop()
        service.stop()
