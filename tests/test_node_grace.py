"""A node that drops off the network is suspect before it is down (issue #31, point 1).

Measured before: with a node's SSH connection cut for a few seconds mid-job, a job with
``retries: 1`` was requeued 6 s later; when the node came back its first attempt, still
running, was killed and a second attempt started from scratch, and the job's events did not
record the kill. Here the network cut is real (the simulated node stops listening and drops
every SSH connection; its processes run on) and time past the grace is the scheduler's clock.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from _fixtures_nodes import node_scheduler
from _fixtures_scheduler import tick_until

from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.core.models import Job, JobState, parse_spec
from jupyter_gpusched.scheduling.scheduler import Scheduler

pytestmark = pytest.mark.asyncio


@pytest.fixture
def sim(two_nodes: SimCluster) -> SimCluster:
    """A T4 node and a V100 node (``_fixtures_nodes``)."""
    return two_nodes


GRACE_S = 300.0


@pytest_asyncio.fixture
async def sched(sim: SimCluster, tmp_path: Path) -> AsyncIterator[Scheduler]:
    s = node_scheduler(sim.node_configs(), tmp_path / "s.db", node_down_after_s=GRACE_S)
    await s.start()
    try:
        yield s
    finally:
        for job in s.list_jobs()[0]:
            if job.state in (JobState.QUEUED, JobState.STARTING, JobState.RUNNING):
                try:
                    await s.cancel(job.id, user="ann")
                except Exception:  # noqa: BLE001 - a node still away; the sim kills its jobs
                    pass
        await s.stop()


def submit_waiting(sched: Scheduler, marker: Path, **spec: object) -> int:
    """A job that runs until ``marker`` exists, then succeeds: its end is the test's to say."""
    code = (
        "import pathlib, time\n"
        f"while not pathlib.Path({str(marker)!r}).exists(): time.sleep(0.05)\n"
    )
    body = {"kind": "script", "command": [sys.executable, "-c", code], "gpus": 1, **spec}
    return sched.submit(parse_spec(body, user="ann")).id


def node_view(sched: Scheduler, name: str) -> object:
    return next(n for n in sched.cluster_view().nodes if n.name == name)


def kinds(sched: Scheduler, job_id: int) -> list[str]:
    return [e.kind for e in sched.store.list_events(job_id=job_id)]


async def running(sched: Scheduler, job_id: int) -> Job:
    await tick_until(sched, lambda: sched.get_job(job_id).state is JobState.RUNNING)
    return sched.get_job(job_id)


async def cut(sched: Scheduler, sim: SimCluster, name: str) -> None:
    """Take the node off the network until the scheduler counts it unreachable."""
    await sim.stop_node(name)
    await tick_until(sched, lambda: node_view(sched, name).health != "up")  # type: ignore[attr-defined]


async def back(sched: Scheduler, sim: SimCluster, name: str) -> None:
    """Put the node back on the network; time passes until a probe of the nodes finds it."""
    await sim.start_node(name)

    def found() -> bool:
        sched.clock.advance(5)  # type: ignore[attr-defined]
        return node_view(sched, name).health == "up"  # type: ignore[attr-defined]

    await tick_until(sched, found)


async def test_a_blip_within_the_grace_kills_nothing_and_the_job_goes_on(
    sim: SimCluster, sched: Scheduler, tmp_path: Path
) -> None:
    marker = tmp_path / "done"
    job_id = submit_waiting(sched, marker, gpu_models=["T4"], retries=1)
    first = await running(sched, job_id)
    await cut(sched, sim, "t4-0")
    t4 = node_view(sched, "t4-0")
    assert (t4.health, t4.up) == ("suspect", False)  # type: ignore[attr-defined]
    job = sched.get_job(job_id)
    assert job.state is JobState.RUNNING and "t4-0 unreachable since" in str(job.reason)
    assert "requeued if the node is not back by 22:05:00" in str(job.reason)
    # the GPU stays the job's: nothing else is placed on a suspect node
    other = submit_waiting(sched, marker, gpu_models=["T4"])
    sched.clock.advance(GRACE_S - 10)  # type: ignore[attr-defined]
    for _ in range(3):
        await sched.tick()
    assert sched.get_job(job_id).state is JobState.RUNNING
    assert sched.get_job(other).state is JobState.QUEUED
    await back(sched, sim, "t4-0")
    await tick_until(sched, lambda: sched.get_job(job_id).reason is None)
    marker.touch()
    await tick_until(sched, lambda: sched.get_job(job_id).state is JobState.SUCCEEDED)
    done = sched.get_job(job_id)
    assert done.attempt == 0 and done.handle["pid"] == first.handle["pid"]
    assert "kill" not in kinds(sched, job_id)
    assert {"unreachable", "reachable"} <= set(kinds(sched, job_id))


async def test_past_the_grace_the_job_requeues_and_a_returning_node_has_it_readopted(
    sim: SimCluster, sched: Scheduler, tmp_path: Path
) -> None:
    marker = tmp_path / "done"
    job_id = submit_waiting(sched, marker, gpu_models=["T4"], retries=1)
    first = await running(sched, job_id)
    await cut(sched, sim, "t4-0")
    sched.clock.advance(GRACE_S + 1)  # type: ignore[attr-defined]
    await tick_until(sched, lambda: sched.get_job(job_id).state is JobState.QUEUED)
    assert node_view(sched, "t4-0").health == "down"  # type: ignore[attr-defined]
    assert sched.get_job(job_id).attempt == 1
    await back(sched, sim, "t4-0")
    await tick_until(sched, lambda: sched.get_job(job_id).state is JobState.RUNNING)
    again = sched.get_job(job_id)
    assert again.attempt == 0 and again.handle["pid"] == first.handle["pid"]
    assert "re-adopted" in str(again.reason) and again.started_at == first.started_at
    marker.touch()
    await tick_until(sched, lambda: sched.get_job(job_id).state is JobState.SUCCEEDED)
    assert "kill" not in kinds(sched, job_id)


async def test_a_returning_node_stops_an_earlier_attempt_whose_retry_runs_with_an_event(
    sim: SimCluster, sched: Scheduler, tmp_path: Path
) -> None:
    marker = tmp_path / "done"
    job_id = submit_waiting(sched, marker, gpu_models=["T4", "V100-32GB"], retries=1)
    first = await running(sched, job_id)
    gone_node = first.placement.node  # type: ignore[union-attr]
    await cut(sched, sim, gone_node)
    sched.clock.advance(GRACE_S + 1)  # type: ignore[attr-defined]

    def retried_elsewhere() -> bool:
        job = sched.get_job(job_id)
        return job.state is JobState.RUNNING and job.attempt == 1

    await tick_until(sched, retried_elsewhere)
    assert sched.get_job(job_id).placement.node != gone_node  # type: ignore[union-attr]
    await back(sched, sim, gone_node)
    await tick_until(sched, lambda: "kill" in kinds(sched, job_id))
    (kill,) = [e for e in sched.store.list_events(job_id=job_id) if e.kind == "kill"]
    assert kill.detail["node"] == gone_node and kill.detail["attempt"] == 0
    assert "earlier attempt (0)" in kill.detail["why"]
    assert sched.get_job(job_id).state is JobState.RUNNING  # the retry goes on
    marker.touch()
    await tick_until(sched, lambda: sched.get_job(job_id).state is JobState.SUCCEEDED)


async def test_a_cancel_that_cannot_reach_a_suspect_node_is_sent_when_it_answers(
    sim: SimCluster, sched: Scheduler, tmp_path: Path
) -> None:
    job_id = submit_waiting(sched, tmp_path / "never", gpu_models=["T4"], retries=1)
    first = await running(sched, job_id)
    await cut(sched, sim, "t4-0")
    answered = await sched.cancel(job_id, user="ann")
    assert answered.state is JobState.RUNNING  # recorded; the node cannot be told yet
    assert str(answered.reason).startswith("cancelling:") and "t4-0" in str(answered.reason)
    await back(sched, sim, "t4-0")
    await tick_until(sched, lambda: sched.get_job(job_id).state is JobState.CANCELLED)
    (kill,) = [e for e in sched.store.list_events(job_id=job_id) if e.kind == "kill"][-1:]
    assert kill.detail["node"] == "t4-0" and kill.detail["why"] == "cancelled by ann"
    assert sched.get_job(job_id).attempt == first.attempt  # stopped, never requeued
