"""Through Slurm too, a launch runs its job exactly once, whatever cuts it short.

As in ``test_launching.py`` (the sim), each scenario writes the store as a scheduler killed at
that moment would have left it, then lets a fresh scheduler (on the same launch records) take
over; here the jobs are Slurm jobs on the loopback cluster.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
from _fixtures_scheduler import tick_until
from _fixtures_slurm import NODE, SlurmCluster

from jupyter_gpusched.cluster.slurm import SlurmBackend
from jupyter_gpusched.core.clock import ManualClock, SystemClock
from jupyter_gpusched.core.errors import NodeRefusedError
from jupyter_gpusched.core.models import Job, JobState, Placement, parse_spec
from jupyter_gpusched.core.windows import OPEN_WINDOW, PolicyConfig
from jupyter_gpusched.scheduling.scheduler import Scheduler
from jupyter_gpusched.store.store import Store

pytestmark = [pytest.mark.slurm, pytest.mark.asyncio]
NOW = datetime(2026, 11, 23, 22, 0, tzinfo=UTC)
ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@pytest_asyncio.fixture
async def sched(slurm_cluster: SlurmCluster, tmp_path: Path) -> AsyncIterator[Scheduler]:
    tmp_path.chmod(0o755)
    clock = ManualClock(NOW)
    backend = SlurmBackend(
        clock=SystemClock(),
        state_dir=str(tmp_path / "state"),
        workdir=str(tmp_path / "work"),
        slurm_conf=str(slurm_cluster.conf),
    )
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
    await scheduler.refresh_inventory()
    try:
        yield scheduler
    finally:
        await scheduler.stop()
        slurm_cluster.cancel_all()


def counting_job(sched: Scheduler, tally: Path, seconds: float = 0.2) -> Job:
    """A job that appends one line to ``tally`` per run."""
    code = f"open({str(tally)!r}, 'a').write('run\\n'); import time; time.sleep({seconds})"
    spec = {"kind": "script", "command": [sys.executable, "-c", code], "gpus": 1}
    return sched.submit(parse_spec(spec, user="ann"))


def start_in_store(sched: Scheduler, job: Job, **handle: object) -> Job:
    """Write the job ``starting`` on the Slurm node, as the scheduler does before launching."""
    return sched.store.transition(
        job.id,
        JobState.STARTING,
        placement=Placement(node=NODE, gpu_indices=[0]),
        started_at=NOW,
        handle={"node": NODE, "attempt": job.attempt, **handle},
    )


def runs(tally: Path) -> int:
    return tally.read_text().count("run") if tally.exists() else 0


async def test_a_job_whose_sbatch_never_went_out_runs_once(
    sched: Scheduler, tmp_path: Path
) -> None:
    tally = tmp_path / "tally"
    job = start_in_store(sched, counting_job(sched, tally))
    await tick_until(sched, lambda: sched.get_job(job.id).state in ENDED, timeout_s=30.0)
    assert sched.get_job(job.id).state is JobState.SUCCEEDED
    assert runs(tally) == 1


async def test_a_job_slurm_took_before_the_crash_is_adopted_not_submitted_again(
    sched: Scheduler, tmp_path: Path, slurm_cluster: SlurmCluster
) -> None:
    tally = tmp_path / "tally"
    job = start_in_store(sched, counting_job(sched, tally, seconds=1.0))
    first = await sched.backend.launch(job, job.placement)  # sbatch went out; the id was lost
    await tick_until(sched, lambda: sched.get_job(job.id).state in ENDED, timeout_s=30.0)
    done = sched.get_job(job.id)
    assert (done.state, done.handle["slurm_job_id"]) == (
        JobState.SUCCEEDED,
        first.handle["slurm_job_id"],
    )
    assert runs(tally) == 1


async def test_a_job_cancelled_before_its_launch_never_runs_even_when_sbatch_comes_late(
    sched: Scheduler, tmp_path: Path
) -> None:
    tally = tmp_path / "tally"
    job = start_in_store(
        sched, counting_job(sched, tally), stopping="cancel", stop_reason="cancelled by ann"
    )
    await tick_until(sched, lambda: sched.get_job(job.id).state in ENDED, timeout_s=30.0)
    assert sched.get_job(job.id).state is JobState.CANCELLED
    # a deposed scheduler's launch arriving now submits nothing
    with pytest.raises(NodeRefusedError, match="stopped before it started"):
        await sched.backend.launch(job, job.placement)
    assert runs(tally) == 0


async def test_a_cancel_while_starting_stops_the_slurm_job(
    sched: Scheduler, tmp_path: Path
) -> None:
    tally = tmp_path / "tally"
    job = start_in_store(sched, counting_job(sched, tally, seconds=60))
    ticking = asyncio.ensure_future(
        tick_until(sched, lambda: sched.get_job(job.id).state in ENDED, timeout_s=30.0)
    )
    cancelled = await sched.cancel(job.id, user="ann")
    await ticking
    assert cancelled.state is JobState.CANCELLED
    final = sched.get_job(job.id)
    if final.handle.get("slurm_job_id"):  # it had been submitted: it was stopped
        assert not (await sched.backend.poll(final)).running


async def test_the_placement_follows_the_gpus_slurm_gave_the_job(
    sched: Scheduler, tmp_path: Path
) -> None:
    out = tmp_path / "cuda"
    code = (
        f"import os, time; open({str(out)!r}, 'w').write(os.environ['CUDA_VISIBLE_DEVICES']); "
        "time.sleep(1.5)"
    )
    job = sched.submit(
        parse_spec({"kind": "script", "command": [sys.executable, "-c", code]}, user="ann")
    )
    placed = sched.store.transition(
        job.id,
        JobState.STARTING,
        placement=Placement(node=NODE, gpu_indices=[3]),  # where our packer wanted it
        started_at=NOW,
        handle={"node": NODE, "attempt": 0},
    )
    await tick_until(sched, lambda: sched.get_job(job.id).state in ENDED, timeout_s=30.0)
    done = sched.get_job(job.id)
    assert done.state is JobState.SUCCEEDED
    assert placed.placement is not None and placed.placement.gpu_indices == [3]
    assert done.placement is not None
    assert ",".join(map(str, done.placement.gpu_indices)) == out.read_text() == "0"
