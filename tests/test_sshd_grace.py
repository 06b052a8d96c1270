"""A blip of the network to a real OpenSSH node kills no work (issue #31, point 1).

The scheduler reaches Debian's sshd through a loopback forwarder whose line is cut: every SSH
connection resets and new ones are refused, while sshd and the job on the node run on. Cut for
part of the grace, the job goes on untouched; cut for longer, it is requeued, and when the
line returns its first attempt, still running, is re-adopted rather than killed.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from _fixtures_nodes import node_scheduler
from _fixtures_proxy import CuttableProxy
from _fixtures_scheduler import tick_until
from _fixtures_ssh import SSHD, Sshd, _known_hosts_line, gpu_state, running_sshd

from jupyter_gpusched.core.models import JobState, parse_spec
from jupyter_gpusched.scheduling.scheduler import Scheduler

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.sshd,
    pytest.mark.skipif(
        not os.access(SSHD, os.X_OK),
        reason=f"{SSHD} missing: install openssh-server (scripts/system-deps.sh)",
    ),
]
GRACE_S = 300.0


@pytest.fixture
def sshd() -> Iterator[Sshd]:
    with running_sshd() as server:
        server.state_path.write_text(json.dumps(gpu_state(2)))
        server.state_path.chmod(0o644)
        yield server


@pytest_asyncio.fixture
async def line(sshd: Sshd) -> AsyncIterator[CuttableProxy]:
    proxy = CuttableProxy("127.0.0.1", sshd.port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


@pytest_asyncio.fixture
async def sched(sshd: Sshd, line: CuttableProxy, tmp_path: Path) -> AsyncIterator[Scheduler]:
    known = tmp_path / "known_hosts"
    known.write_text(_known_hosts_line(line.port, sshd.host_key))
    s = node_scheduler(
        [sshd.node_config(port=line.port, known_hosts=str(known))],
        tmp_path / "s.db",
        node_down_after_s=GRACE_S,
    )
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


def health(sched: Scheduler) -> str:
    (node,) = sched.cluster_view().nodes
    return node.health


async def returns(sched: Scheduler, line: CuttableProxy) -> None:
    """The line is back; time passes until a probe finds the node."""
    await line.restore()

    def found() -> bool:
        sched.clock.advance(5)  # type: ignore[attr-defined]
        return health(sched) == "up"

    await tick_until(sched, found, timeout_s=60)


def submit(sched: Scheduler, sshd: Sshd, marker: Path) -> int:
    code = (
        "import pathlib, time\n"
        f"while not pathlib.Path({str(marker)!r}).exists(): time.sleep(0.05)\n"
    )
    body = {"kind": "script", "command": [sshd.python, "-c", code], "gpus": 1, "retries": 1}
    return sched.submit(parse_spec(body, user="ann")).id


@pytest.mark.parametrize("cut_s", [GRACE_S / 3, GRACE_S + 1], ids=["within", "past"])
async def test_a_cut_line_to_an_openssh_node_kills_nothing_and_the_job_ends_once(
    sshd: Sshd, line: CuttableProxy, sched: Scheduler, cut_s: float
) -> None:
    marker = sshd.dir / f"done-{cut_s}"
    job_id = submit(sched, sshd, marker)
    await tick_until(sched, lambda: sched.get_job(job_id).state is JobState.RUNNING, 60)
    pid = sched.get_job(job_id).handle["pid"]
    await line.cut()
    await tick_until(sched, lambda: health(sched) == "suspect", 60)
    sched.clock.advance(cut_s)  # type: ignore[attr-defined]
    for _ in range(3):
        await sched.tick()
    expected = JobState.RUNNING if cut_s < GRACE_S else JobState.QUEUED
    assert sched.get_job(job_id).state is expected
    await returns(sched, line)
    await tick_until(sched, lambda: sched.get_job(job_id).state is JobState.RUNNING, 60)
    job = sched.get_job(job_id)
    assert (job.attempt, job.handle["pid"]) == (0, pid)  # the same process, never restarted
    marker.touch()
    await tick_until(sched, lambda: sched.get_job(job_id).state is JobState.SUCCEEDED, 60)
    events = sched.store.list_events(job_id=job_id)
    assert not [e for e in events if e.kind == "kill"]
    starts = [e for e in events if e.kind == "state" and e.to_state is JobState.STARTING]
    assert len(starts) == (1 if cut_s < GRACE_S else 2)  # the second: the re-adoption
