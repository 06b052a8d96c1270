"""An array kept as one record survives ``kill -9`` of a real server: nothing lost or doubled."""

from __future__ import annotations

import signal
import sys
from collections import Counter
from pathlib import Path

from _fixtures_polling import wait_for
from _fixtures_server import FAR_FUTURE, ServerProcess

from jupyter_gpusched.client.api import GpuSchedClient

ENDED = ("succeeded", "failed", "cancelled")


def test_kill_9_keeps_the_pending_range_and_each_task_is_made_once(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path).start()
    try:
        client = GpuSchedClient(server.url, server.token)
        far = {"kind": "script", "command": ["true"], "gpus": 1, "not_before": FAR_FUTURE}
        waiting = client.submit_array(100_000, far).array_id
        client.cancel_array_task(waiting, 7)
        run = {
            "kind": "script",
            "gpus": 1,
            "command": [sys.executable, "-c", "import time; time.sleep(0.2)"],
            "retries": 3,  # a task the kill cuts off runs again
        }
        running = client.submit_array(40, run).array_id
        wait_for(  # killed while it is being made into jobs
            lambda: client.get_array(running),
            lambda a: 0 < a.pending < 39,
            interval_s=0.01,
            what="some of the array's tasks to be made jobs",
        )
        server.stop(sig=signal.SIGKILL)
        server.start()

        after = client.get_array(waiting)
        assert (after.pending, after.pending_range, after.cancelled) == (99_998, "1-6,8-99999", 1)
        assert client.array_task(waiting, 7).state == "cancelled"
        assert client.array_task(waiting, 8).state == "pending"

        def all_ended() -> bool:
            array = client.get_array(running)
            jobs = client.list_jobs(array=running, limit=100).jobs
            return array.pending == 0 and len(jobs) == 40 and all(j.state in ENDED for j in jobs)

        wait_for(all_ended, timeout_s=180, what="every task of the array to end")
        jobs = client.list_jobs(array=running, limit=100).jobs
        made = Counter(int(j.spec.labels["array_index"]) for j in jobs)
        assert made == Counter(range(40))  # each task made exactly once
        assert Counter(j.state for j in jobs)["succeeded"] == 40
    finally:
        server.stop()
