"""A launch runs its job exactly once, whatever cuts it short (real processes on the sim nodes).

Each scenario writes the store as a scheduler killed at that moment would have left it, then
lets a fresh scheduler take over.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
from _fixtures_scheduler import sim  # noqa: F401  (the fixture)

from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.cluster.ssh import SshBackend
from jupyter_gpusched.core.clock import ManualClock, SystemClock
from jupyter_gpusched.core.errors import NodeRefusedError
from jupyter_gpusched.core.models import Job, JobState, Placement, parse_spec
from jupyter_gpusched.core.windows import OPEN_WINDOW, PolicyConfig
from jupyter_gpusched.scheduling.scheduler import Scheduler
from jupyter_gpusched.store.store import Store

pytestmark = pytest.mark.asyncio
NOW = datetime(2026, 11, 23, 22, 0, tzinfo=UTC)
ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@pytest_asyncio.fixture
async def sched(sim: SimCluster, tmp_path: Path) -> AsyncIterator[Scheduler]:  # noqa: F811
    clock = ManualClock(NOW)
    backend = SshBackend(sim.node_configs(), clock=SystemClock())
    scheduler = Scheduler(
        store=Store(f"sqlite:///{tmp_path / 'store.db'}", clock=clock),
        backend=backend,
        policy=PolicyConfig(windows=(OPEN_WINDOW,)),
        clock=clock,
        poll_interval_s=0,
        inventory_interval_s=0,
        cancel_grace_s=2,
    )
    scheduler.store.migrate()
    await backend.start()
    try:
        yield scheduler
    finally:
        await scheduler.stop()


def counting_job(sched: Scheduler, tally: Path, seconds: float = 0.2, **spec: object) -> Job:
    """A job that appends one line to ``tally`` per run."""
    code = f"open({str(tally)!r}, 'a').write('run\\n'); import time; time.sleep({seconds})"
    return sched.submit(parse_spec({"kind": "script", "command": [sys.executable, "-c", code],
                                    "gpus": 1, **spec}, user="ann"))  # fmt: skip


def start_in_store(sched: Scheduler, job: Job, node: str = "t4-0", **handle: object) -> Job:
    """Write the job ``starting`` on ``node`` as the scheduler does just before launching."""
    placement = Placement(node=node, gpu_indices=[0])
    return sched.store.transition(
        job.id,
        JobState.STARTING,
        placement=placement,
        started_at=NOW,
        handle={"node": node, "attempt": job.attempt, **handle},
    )


async def until(sched: Scheduler, done: Callable[[], bool], timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done():
        assert loop.time() < deadline, [(j.id, j.state, j.reason) for j in sched.list_jobs()[0]]
        await sched.tick()
        await asyncio.sleep(0.05)


def runs(tally: Path) -> int:
    return tally.read_text().count("run") if tally.exists() else 0


async def test_a_job_whose_launch_never_reached_its_node_runs_once(
    sched: Scheduler, tmp_path: Path
) -> None:
    tally = tmp_path / "tally"
    job = start_in_store(sched, counting_job(sched, tally))
    await until(sched, lambda: sched.get_job(job.id).state in ENDED)
    assert sched.get_job(job.id).state is JobState.SUCCEEDED
    assert runs(tally) == 1


async def test_a_job_its_node_started_before_the_crash_is_adopted_not_started_again(
    sched: Scheduler, tmp_path: Path
) -> None:
    tally = tmp_path / "tally"
    job = start_in_store(sched, counting_job(sched, tally, seconds=1.0))
    await sched.backend.launch(job, job.placement)  # the node started it; the pid was lost
    await until(sched, lambda: sched.get_job(job.id).state is JobState.RUNNING)
    await until(sched, lambda: sched.get_job(job.id).state in ENDED)
    assert sched.get_job(job.id).state is JobState.SUCCEEDED
    assert runs(tally) == 1


async def test_a_job_cancelled_while_starting_is_stopped_where_it_started(
    sched: Scheduler, tmp_path: Path
) -> None:
    tally = tmp_path / "tally"
    job = start_in_store(
        sched, counting_job(sched, tally, seconds=60), stopping="cancel", stop_reason="cancelled"
    )
    launched = await sched.backend.launch(job, job.placement)
    await until(sched, lambda: sched.get_job(job.id).state in ENDED)
    assert sched.get_job(job.id).state is JobState.CANCELLED
    status = await sched.backend.poll(job.model_copy(update={"handle": launched.handle}))
    assert not status.running


async def test_a_job_cancelled_before_its_launch_never_starts_even_late(
    sched: Scheduler, tmp_path: Path
) -> None:
    tally = tmp_path / "tally"
    job = start_in_store(
        sched, counting_job(sched, tally), stopping="cancel", stop_reason="cancelled by ann"
    )
    await until(sched, lambda: sched.get_job(job.id).state in ENDED)
    assert sched.get_job(job.id).state is JobState.CANCELLED
    # a deposed scheduler's launch arriving now starts nothing
    with pytest.raises(NodeRefusedError, match="never finished starting"):
        await sched.backend.launch(job, job.placement)
    assert runs(tally) == 0


async def test_a_cancel_while_starting_waits_for_the_launch_and_stops_it(
    sched: Scheduler, tmp_path: Path
) -> None:
    tally = tmp_path / "tally"
    job = start_in_store(sched, counting_job(sched, tally, seconds=60))
    ticking = asyncio.ensure_future(until(sched, lambda: sched.get_job(job.id).state in ENDED))
    cancelled = await sched.cancel(job.id, user="ann")
    await ticking
    assert cancelled.state is JobState.CANCELLED
    final = sched.get_job(job.id)
    if final.handle.get("pid"):  # it had started: it was stopped
        status = await sched.backend.poll(final)
        assert not status.running


async def test_a_launch_the_node_refuses_backs_off_then_fails_with_the_nodes_words(
    sched: Scheduler,
) -> None:
    clock = sched.clock
    assert isinstance(clock, ManualClock)
    job = sched.submit(parse_spec(
        {"kind": "script", "command": ["true"], "gpus": 1, "workdir": "/no/such/dir"}, user="ann"
    ))  # fmt: skip
    for attempt in (1, 2):
        await sched.tick()  # the node refuses
        refused = sched.get_job(job.id)
        assert refused.state is JobState.QUEUED
        assert f"could not start on t4-0 (try {attempt} of 3)" in str(refused.reason)
        assert f"trying again in {5 * 2 ** (attempt - 1)}s" in str(refused.reason)
        await sched.tick()  # within the pause: not tried again
        assert sched.get_job(job.id).handle["launch_failures"] == attempt
        clock.advance(60)
    await sched.tick()
    final = sched.get_job(job.id)
    assert final.state is JobState.FAILED
    assert "(3 tries)" in str(final.reason) and "/no/such/dir does not exist" in str(final.reason)
