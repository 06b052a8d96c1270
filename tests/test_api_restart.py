"""A server restart loses nothing: queued jobs stay queued, running ones are found again."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from _fixtures_polling import wait_for
from _fixtures_server import FAR_FUTURE

from jupyter_gpusched.client.api import GpuSchedClient
from jupyter_gpusched.core.api import JobView


def wait_state(client: GpuSchedClient, job_id: int, *states: str, timeout_s: float = 30) -> JobView:
    return wait_for(
        lambda: client.get_job(job_id),
        lambda job: job.state in states,
        timeout_s=timeout_s,
        what=f"job {job_id} to be {states}",
    )


@pytest.mark.slow
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "crash"])
def test_restart_keeps_queued_jobs_and_reattaches_running_ones(
    tmp_path: Path, stop_signal: int
) -> None:
    from _fixtures_server import ServerProcess

    go = tmp_path / "go"
    waiter = [
        sys.executable,
        "-c",
        "import os, sys, time\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "print('done', flush=True); sys.exit(7)",
    ]
    sim_dir = str(tmp_path / "sim")  # a kept sim directory: its jobs outlive the server
    first = ServerProcess(tmp_path, sim_dir=sim_dir).start()
    try:
        client = GpuSchedClient(first.url, first.token)
        running = client.submit(kind="script", command=waiter, gpus=2)
        queued = client.submit(kind="script", command=["true"], not_before=FAR_FUTURE)
        before = wait_state(client, running.id, "running")
    finally:
        first.stop(sig=stop_signal)

    second = ServerProcess(tmp_path, sim_dir=sim_dir).start()
    try:
        client = GpuSchedClient(second.url, second.token)
        assert client.get_job(queued.id).state == "queued"
        again = client.get_job(running.id)
        assert again.state == "running"
        assert again.placement == before.placement
        assert client.list_jobs().total == 2

        go.touch()
        done = wait_state(client, running.id, "succeeded", "failed")
        assert (done.state, done.exit_code) == ("failed", 7)
        assert client.read_log(running.id)[0] == b"done\n"
    finally:
        second.stop()
