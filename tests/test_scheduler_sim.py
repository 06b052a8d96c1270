"""The scheduler on the simulated cluster: real SSH, real processes, real restarts.

The integration half of the scheduler's tests: what launching, exit codes, logs, killing,
checkpoint reports, dropped nodes, reattaching and what a restart keeps really do. The policy and
placement decisions are tested on the in-memory cluster in ``test_scheduler.py``.
"""

from __future__ import annotations

import asyncio
import os
from datetime import datetime, timedelta

import pytest
from _fixtures_scheduler import MONDAY_9AM, SATURDAY_NIGHT, Harness, py, sim, sim_harness

from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.core.errors import ConflictError, ForbiddenError
from jupyter_gpusched.core.models import JobState
from jupyter_gpusched.core.preemption import PreemptCandidate, preemption_cost_gpu_s

__all__ = ["sim", "sim_harness"]  # the fixtures, imported for their tests


@pytest.mark.asyncio
async def test_scripts_run_on_gpus_and_report_exit_codes(sim_harness: Harness) -> None:
    ok = sim_harness.submit(
        command=py("import os; print('on', os.environ['CUDA_VISIBLE_DEVICES'])"), gpus=2
    )
    big = sim_harness.submit(command=py("print('eight')"), gpus=8)
    bad = sim_harness.submit(command=py("import sys; print('boom'); sys.exit(3)"), gpus=1)
    await sim_harness.settle(ok.id, big.id, bad.id)

    assert sim_harness.job(ok.id).state is JobState.SUCCEEDED
    assert sim_harness.job(ok.id).exit_code == 0
    assert len(sim_harness.job(big.id).placement.gpu_indices) == 8  # type: ignore[union-attr]
    failed = sim_harness.job(bad.id)
    assert failed.state is JobState.FAILED
    assert failed.exit_code == 3 and failed.reason == "exit code 3"
    log = await sim_harness.sched.read_log(ok.id)
    uuids = sim_harness.job(ok.id).placement.gpu_uuids  # type: ignore[union-attr]
    assert log.decode().strip() == "on " + ",".join(uuids)
    assert b"boom" in await sim_harness.sched.read_log(bad.id)


@pytest.mark.asyncio
async def test_cancel_kills_a_running_job_and_only_its_owner_may(sim_harness: Harness) -> None:
    job = sim_harness.submit(command=py("import time; time.sleep(120)"), gpus=1)
    await sim_harness.settle(job.id, state=JobState.RUNNING)
    pid = sim_harness.job(job.id).handle["pid"]
    with pytest.raises(ForbiddenError, match="belongs to alice"):
        await sim_harness.sched.cancel(job.id, user="mallory")
    cancelled = await sim_harness.sched.cancel(job.id, user="alice")
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.reason == "cancelled by alice"
    assert not _alive(pid)
    with pytest.raises(ConflictError, match="already cancelled"):
        await sim_harness.sched.cancel(job.id, user="alice")


@pytest.mark.asyncio
async def test_restart_reattaches_running_jobs_and_keeps_queued_ones(sim_harness: Harness) -> None:
    runner = sim_harness.submit(
        command=py("import time; time.sleep(5); raise SystemExit(7)"), gpus=1
    )
    await sim_harness.settle(runner.id, state=JobState.RUNNING)
    queued = sim_harness.submit(command=py("pass"), gpus=1, not_before="2030-01-01T00:00:00+00:00")
    await sim_harness.restart()
    assert sim_harness.job(queued.id).state is JobState.QUEUED
    assert sim_harness.job(runner.id).state is JobState.RUNNING
    await sim_harness.settle(runner.id)
    again = sim_harness.job(runner.id)
    assert again.state is JobState.FAILED and again.exit_code == 7
    started = [
        e
        for e in sim_harness.sched.store.list_events(job_id=runner.id)
        if e.to_state is JobState.STARTING
    ]
    assert len(started) == 1  # never started twice


@pytest.mark.asyncio
async def test_a_node_kept_for_a_waiting_job_is_kept_across_a_restart(
    sim_harness: Harness,
) -> None:
    harness = sim_harness
    harness.clock.set(SATURDAY_NIGHT)
    sleep = {"command": py("import time; time.sleep(60)"), "gpu_models": ["A100"]}
    later = (SATURDAY_NIGHT + timedelta(hours=1)).isoformat()
    waiting = harness.submit(gpus=8, not_before=later, **sleep)
    until = (SATURDAY_NIGHT + timedelta(minutes=15)).isoformat()
    harness.sched.store.update_job(
        waiting.id, handle={"kept_node": {"node": "a100-0", "until": until}}
    )
    await harness.restart()  # what keeps the node is in the store, not in the scheduler
    first = harness.submit(gpus=8, **sleep)
    await harness.settle(first.id, state=JobState.RUNNING)
    assert harness.job(first.id).placement.node == "a100-1"  # type: ignore[union-attr]
    second = harness.submit(gpus=8, **sleep)
    await harness.sched.tick()
    assert harness.job(second.id).state is JobState.QUEUED
    harness.clock.advance(16 * 60)  # the claim lapses
    await harness.settle(second.id, state=JobState.RUNNING)
    assert harness.job(second.id).placement.node == "a100-0"  # type: ignore[union-attr]
    for job in (waiting, first, second):
        await harness.sched.cancel(job.id, user="alice")


@pytest.mark.asyncio
async def test_a_running_job_reports_its_checkpoints_to_the_scheduler(sim_harness: Harness) -> None:
    mark = MONDAY_9AM + timedelta(minutes=20)
    code = f"import time, jupyter_gpusched as g\ng.checkpointed({mark.timestamp()})\ntime.sleep(60)"
    job = sim_harness.submit(command=py(code), gpus=1)
    await sim_harness.until(lambda: "checkpoint_at" in sim_harness.job(job.id).handle)
    running = sim_harness.job(job.id)
    assert datetime.fromisoformat(running.handle["checkpoint_at"]) == mark
    sim_harness.clock.advance(30 * 60)
    # Preempting it now loses the 10 minutes since that checkpoint, not the 30 since start.
    cand = PreemptCandidate.from_job(running)
    assert preemption_cost_gpu_s(cand, sim_harness.clock.now()) == pytest.approx(600)
    await sim_harness.sched.cancel(job.id, user="alice")


async def _past_the_grace(h: Harness, node: str) -> None:
    """The node stays unreachable longer than the scheduler's grace (node_down_after_s)."""
    await h.until(lambda: any(n.health != "up" for n in h.sched.cluster_view().nodes))
    h.clock.advance(h.sched.health.down_after_s + 1)


@pytest.mark.asyncio
async def test_dropped_node_requeues_past_the_grace_and_its_running_attempt_is_readopted(
    sim: SimCluster, sim_harness: Harness
) -> None:
    retry = sim_harness.submit(
        command=py("import time; time.sleep(120)"), gpus=2, gpu_models=["T4"], retries=1
    )
    await sim_harness.settle(retry.id, state=JobState.RUNNING)
    old_pid = sim_harness.job(retry.id).handle["pid"]
    await sim.stop_node("t4-0")
    await _past_the_grace(sim_harness, "t4-0")
    await sim_harness.until(lambda: sim_harness.job(retry.id).state is JobState.QUEUED)
    assert sim_harness.job(retry.id).attempt == 1
    events = sim_harness.sched.store.list_events(job_id=retry.id)
    lost = [e for e in events if e.to_state is JobState.LOST]
    assert len(lost) == 1 and "t4-0" in (lost[0].detail.get("reason") or "")
    assert _alive(old_pid)  # the node only dropped off the network
    await sim.start_node("t4-0")
    await sim_harness.until(lambda: sim_harness.job(retry.id).state is JobState.RUNNING)
    # its retry could not start (T4 only): the attempt that ran on is the job again
    assert sim_harness.job(retry.id).handle["pid"] == old_pid and _alive(old_pid)
    assert sim_harness.job(retry.id).attempt == 0
    await sim_harness.sched.cancel(retry.id, user="alice")


@pytest.mark.asyncio
async def test_job_without_retries_becomes_lost_then_reconciled_when_node_returns(
    sim: SimCluster, sim_harness: Harness
) -> None:
    job = sim_harness.submit(
        command=py("import time; time.sleep(1); print('done')"), gpus=1, gpu_models=["T4"]
    )
    await sim_harness.settle(job.id, state=JobState.RUNNING)
    await sim.stop_node("t4-0")
    await _past_the_grace(sim_harness, "t4-0")
    await sim_harness.settle(job.id, state=JobState.LOST)
    await asyncio.sleep(1.2)
    await sim.start_node("t4-0")
    await sim_harness.settle(job.id, state=JobState.SUCCEEDED)
    assert sim_harness.job(job.id).exit_code == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return os.path.exists(f"/proc/{pid}")


@pytest.mark.asyncio
async def test_a_job_whose_process_vanished_without_an_exit_record_is_lost_not_kept_running(
    sim_harness: Harness,
) -> None:
    job = sim_harness.submit(command=py("import time; time.sleep(120)"), gpus=1)
    await sim_harness.settle(job.id, state=JobState.RUNNING)
    handle = sim_harness.job(job.id).handle
    os.killpg(handle["pgid"], 9)  # the job and, below, its wrapper: no exit record is left
    os.kill(handle["pid"], 9)
    await sim_harness.settle(job.id, state=JobState.LOST)
    assert "without an exit record" in str(sim_harness.job(job.id).reason)
