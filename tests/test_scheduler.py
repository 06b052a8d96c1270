"""The scheduler loop end to end: store file, real SSH to simulated nodes, real processes."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import pytest_asyncio

from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.cluster.sim.specs import SimNodeSpec
from jupyter_gpusched.cluster.ssh import SshBackend
from jupyter_gpusched.core import windows
from jupyter_gpusched.core.clock import ManualClock, SystemClock
from jupyter_gpusched.core.errors import ConflictError, ForbiddenError, InfeasibleError
from jupyter_gpusched.core.models import Job, JobKind, JobState, parse_spec
from jupyter_gpusched.core.preemption import PreemptCandidate, preemption_cost_gpu_s
from jupyter_gpusched.scheduling.scheduler import Scheduler
from jupyter_gpusched.store.store import Store

PY = sys.executable
MONDAY_9AM = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
SATURDAY_NIGHT = datetime(2026, 11, 28, 23, 0, tzinfo=UTC)


@pytest_asyncio.fixture
async def sim(tmp_path: Path) -> AsyncIterator[SimCluster]:
    cluster = SimCluster(base_dir=tmp_path / "sim")
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop(kill_jobs=True)


class Harness:
    """A scheduler on a temp store and the sim cluster, driven tick by tick."""

    def __init__(
        self,
        sim: SimCluster,
        db: Path,
        clock: ManualClock,
        config: windows.PolicyConfig,
        **kwargs: object,
    ) -> None:
        self.sim = sim
        self.db = db
        self.clock = clock
        self.config = config
        self.kwargs = kwargs
        self.sched = self._make()

    def _make(self) -> Scheduler:
        store = Store(f"sqlite:///{self.db}", clock=self.clock)
        backend = SshBackend(
            self.sim.node_configs(),
            clock=SystemClock(),
            down_after_failures=2,
            backoff_base_s=0.05,
            backoff_max_s=0.2,
        )
        return Scheduler(
            store=store,
            backend=backend,
            policy=self.config,
            clock=self.clock,
            poll_interval_s=0,
            inventory_interval_s=0,
            cancel_grace_s=2,
            **self.kwargs,
        )  # type: ignore[arg-type]

    async def restart(self) -> None:
        await self.sched.stop()
        self.sched.store.close()
        self.sched = self._make()
        await self.sched.start()

    def submit(self, user: str = "alice", **spec: object) -> Job:
        return self.sched.submit(parse_spec({"kind": "script", **spec}, user=user))

    def job(self, job_id: int) -> Job:
        return self.sched.get_job(job_id)

    async def until(self, pred: Callable[[], bool], timeout_s: float = 20.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not pred():
            if loop.time() > deadline:
                jobs, _ = self.sched.list_jobs(limit=100)
                states = {j.id: (j.state.value, j.reason) for j in jobs}
                raise AssertionError(f"timed out; jobs: {states}")
            await self.sched.tick()
            await asyncio.sleep(0.05)

    async def settle(self, *ids: int, state: JobState | None = None) -> None:
        def done() -> bool:
            return all(
                self.job(i).state is state
                if state
                else self.job(i).state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
                for i in ids
            )

        await self.until(done)


@pytest_asyncio.fixture
async def harness(sim: SimCluster, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(sim, tmp_path / "gpusched.db", ManualClock(MONDAY_9AM), windows.PolicyConfig())
    await h.sched.start()
    try:
        yield h
    finally:
        await h.sched.stop()
        h.sched.store.close()


def py(code: str) -> list[str]:
    return [PY, "-c", code]


@pytest.mark.asyncio
async def test_scripts_run_on_gpus_and_report_exit_codes(harness: Harness) -> None:
    ok = harness.submit(
        command=py("import os; print('on', os.environ['CUDA_VISIBLE_DEVICES'])"), gpus=2
    )
    big = harness.submit(command=py("print('eight')"), gpus=8)
    bad = harness.submit(command=py("import sys; print('boom'); sys.exit(3)"), gpus=1)
    await harness.settle(ok.id, big.id, bad.id)

    assert harness.job(ok.id).state is JobState.SUCCEEDED
    assert harness.job(ok.id).exit_code == 0
    assert len(harness.job(big.id).placement.gpu_indices) == 8  # type: ignore[union-attr]
    failed = harness.job(bad.id)
    assert failed.state is JobState.FAILED
    assert failed.exit_code == 3 and failed.reason == "exit code 3"
    log = await harness.sched.read_log(ok.id)
    uuids = harness.job(ok.id).placement.gpu_uuids  # type: ignore[union-attr]
    assert log.decode().strip() == "on " + ",".join(uuids)
    assert b"boom" in await harness.sched.read_log(bad.id)


@pytest.mark.asyncio
async def test_every_state_change_is_in_the_audit_log(harness: Harness) -> None:
    job = harness.submit(command=py("pass"), gpus=1)
    await harness.settle(job.id)
    moves = [
        (e.from_state, e.to_state)
        for e in harness.sched.store.list_events(job_id=job.id)
        if e.to_state is not None
    ]
    assert moves[-3:] == [
        (JobState.QUEUED, JobState.STARTING),
        (JobState.STARTING, JobState.RUNNING),
        (JobState.RUNNING, JobState.SUCCEEDED),
    ]


@pytest.mark.asyncio
async def test_cancel_kills_a_running_job_and_only_its_owner_may(harness: Harness) -> None:
    job = harness.submit(command=py("import time; time.sleep(120)"), gpus=1)
    await harness.settle(job.id, state=JobState.RUNNING)
    pid = harness.job(job.id).handle["pid"]
    with pytest.raises(ForbiddenError, match="belongs to alice"):
        await harness.sched.cancel(job.id, user="mallory")
    cancelled = await harness.sched.cancel(job.id, user="alice")
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.reason == "cancelled by alice"
    assert not _alive(pid)
    with pytest.raises(ConflictError, match="already cancelled"):
        await harness.sched.cancel(job.id, user="alice")


@pytest.mark.asyncio
async def test_request_that_can_never_fit_is_refused_with_what_would(harness: Harness) -> None:
    with pytest.raises(InfeasibleError, match="8"):
        harness.submit(command=py("pass"), gpus=16)
    with pytest.raises(InfeasibleError, match="A100"):
        harness.submit(command=py("pass"), gpus=1, gpu_models=["H100"])


@pytest.mark.asyncio
async def test_day_window_holds_batch_back_from_the_interactive_reserve(harness: Harness) -> None:
    # 22 GPUs; the day window keeps 25 % (5.5 GPUs) for interactive work.
    sleepers = [harness.submit(command=py("import time; time.sleep(60)"), gpus=8) for _ in range(2)]
    extra = harness.submit(command=py("pass"), gpus=2)
    await harness.until(lambda: all(harness.job(j.id).state is JobState.RUNNING for j in sleepers))
    await harness.sched.tick()
    held = harness.job(extra.id)
    assert held.state is JobState.QUEUED
    assert held.reason is not None and "interactive" in held.reason
    for j in sleepers:
        await harness.sched.cancel(j.id, user="alice")


@pytest.mark.asyncio
async def test_backfill_goes_to_another_node_rather_than_delay_the_reserved_head(
    harness: Harness,
) -> None:
    harness.clock.set(SATURDAY_NIGHT)  # no interactive reserve at night
    sleep = py("import time; time.sleep(60)")
    a100 = {"gpu_models": ["A100"]}
    first = harness.submit(command=sleep, gpus=6, max_runtime_s=3600, **a100)
    await harness.settle(first.id, state=JobState.RUNNING)
    second = harness.submit(command=sleep, gpus=5, max_runtime_s=7200, **a100)
    await harness.settle(second.id, state=JobState.RUNNING)
    head = harness.submit(command=sleep, gpus=8, **a100)  # first's node is free first (1 h)
    # The packer's best fit for 2 GPUs is first's node (2 free), but it would still run when
    # the head is due there; the other A100 node (3 free) cannot delay the head.
    backfill = harness.submit(command=sleep, gpus=2, max_runtime_s=3 * 3600, **a100)
    await harness.settle(backfill.id, state=JobState.RUNNING)
    placed = {j: harness.job(j).placement.node for j in (first.id, second.id, backfill.id)}  # type: ignore[union-attr]
    assert placed[backfill.id] == placed[second.id] != placed[first.id]
    waiting = harness.job(head.id)
    assert waiting.state is JobState.QUEUED and "no room" in (waiting.reason or "")
    for job in (first, second, backfill, head):
        await harness.sched.cancel(job.id, user="alice")


@pytest.mark.asyncio
async def test_foreign_gpu_use_is_avoided(harness: Harness) -> None:
    for g in range(4):
        harness.sim.add_foreign_process("v100-0", g, mem_mb=1000)
    await harness.sched.refresh_inventory()
    job = harness.submit(command=py("pass"), gpus=1, gpu_models=["V100"])
    await harness.sched.tick()
    waiting = harness.job(job.id)
    assert waiting.state is JobState.QUEUED and "no room" in (waiting.reason or "")
    view = harness.sched.cluster_view()
    v100 = next(n for n in view.nodes if n.name == "v100-0")
    assert [g.state for g in v100.gpus] == ["foreign"] * 4
    harness.sim.clear_foreign("v100-0")
    await harness.sched.refresh_inventory()
    await harness.settle(job.id)
    assert harness.job(job.id).placement.node == "v100-0"  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_restart_reattaches_running_jobs_and_keeps_queued_ones(harness: Harness) -> None:
    runner = harness.submit(command=py("import time; time.sleep(5); raise SystemExit(7)"), gpus=1)
    await harness.settle(runner.id, state=JobState.RUNNING)
    queued = harness.submit(command=py("pass"), gpus=1, not_before="2030-01-01T00:00:00+00:00")
    await harness.restart()
    assert harness.job(queued.id).state is JobState.QUEUED
    assert harness.job(runner.id).state is JobState.RUNNING
    await harness.settle(runner.id)
    again = harness.job(runner.id)
    assert again.state is JobState.FAILED and again.exit_code == 7
    started = [
        e
        for e in harness.sched.store.list_events(job_id=runner.id)
        if e.to_state is JobState.STARTING
    ]
    assert len(started) == 1  # never started twice


@pytest.mark.asyncio
async def test_batch_runtime_limit_of_the_day_window_stops_a_job(harness: Harness) -> None:
    job = harness.submit(command=py("import time; time.sleep(120)"), gpus=1)
    await harness.settle(job.id, state=JobState.RUNNING)
    harness.clock.advance(4 * 3600 + 1)  # the day window's batch limit
    await harness.settle(job.id)
    stopped = harness.job(job.id)
    assert stopped.state is JobState.FAILED
    assert stopped.reason == "max runtime 4h reached"


@pytest.mark.asyncio
async def test_interactive_lease_preempts_batch_by_day_and_batch_requeues(
    sim: SimCluster, tmp_path: Path
) -> None:
    h = Harness(
        sim,
        tmp_path / "db.sqlite",
        ManualClock(MONDAY_9AM),
        windows.PolicyConfig(windows=(windows.Window(name="day", preempt_batch=True),)),
        commands={JobKind.LEASE: lambda job: py("import time; time.sleep(120)")},
    )
    await h.sched.start()
    try:
        batch = [
            h.submit(command=py("import time; time.sleep(120)"), gpus=8, gpu_models=["A100"])
            for _ in range(2)
        ]
        await h.until(lambda: all(h.job(j.id).state is JobState.RUNNING for j in batch))
        lease = h.sched.submit(
            parse_spec({"kind": "lease", "gpus": 2, "gpu_models": ["A100"]}, user="bob")
        )
        await h.settle(lease.id, state=JobState.RUNNING)
        states = sorted(h.job(j.id).state.value for j in batch)
        assert states == ["queued", "running"]
        requeued = next(h.job(j.id) for j in batch if h.job(j.id).state is JobState.QUEUED)
        assert requeued.attempt == 1
        assert JobState.PREEMPTED in [
            e.to_state for e in h.sched.store.list_events(job_id=requeued.id)
        ]
    finally:
        await h.sched.stop()
        h.sched.store.close()


@pytest.mark.asyncio
async def test_night_moves_a_small_batch_job_to_open_a_node_for_a_big_one(tmp_path: Path) -> None:
    nodes = (
        SimNodeSpec("big-a", "A100-80GB", 80, 8, cpus=32, mem_gb=256),
        SimNodeSpec("big-b", "A100-80GB", 80, 8, cpus=32, mem_gb=256),
        SimNodeSpec("small", "A100-80GB", 80, 2, cpus=8, mem_gb=64),
    )
    cluster = SimCluster(nodes=nodes, base_dir=tmp_path / "sim")
    await cluster.start()
    h = Harness(
        cluster, tmp_path / "db.sqlite", ManualClock(SATURDAY_NIGHT), windows.PolicyConfig()
    )
    await h.sched.start()
    sleep = {"command": py("import time; time.sleep(120)"), "max_runtime_s": 7200}
    try:
        filler = h.submit(gpus=2, **sleep)  # takes the small node: big nodes stay whole
        await h.settle(filler.id, state=JobState.RUNNING)
        small = h.submit(gpus=2, **sleep)
        await h.settle(small.id, state=JobState.RUNNING)
        wide = h.submit(gpus=7, **sleep)  # the other big node: 1 GPU left there
        await h.settle(wide.id, state=JobState.RUNNING)
        assert h.job(filler.id).placement.node == "small"  # type: ignore[union-attr]
        await h.sched.cancel(filler.id, user="alice")
        await h.settle(filler.id)
        # 8 GPUs free in all, at most 6 on one node: moving `small` (2) opens a big node now,
        # where waiting for the 2 h jobs to end would idle 8 GPUs for 2 h.
        whole = h.submit(gpus=8, **sleep)
        await h.settle(whole.id, small.id, state=JobState.RUNNING)
        opened = h.job(small.id).placement.node  # type: ignore[union-attr]
        assert opened == "small"
        assert h.job(whole.id).placement.node not in ("small", h.job(wide.id).placement.node)  # type: ignore[union-attr]
        assert h.job(small.id).attempt == 1
        events = h.sched.store.list_events(job_id=small.id)
        assert any(
            e.to_state is JobState.PREEMPTED and f"make room for job {whole.id}" in str(e.detail)
            for e in events
        )
    finally:
        await h.sched.stop()
        h.sched.store.close()
        await cluster.stop(kill_jobs=True)


@pytest.mark.asyncio
async def test_a_node_kept_for_a_waiting_job_is_kept_across_a_restart(harness: Harness) -> None:
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
async def test_a_running_job_reports_its_checkpoints_to_the_scheduler(harness: Harness) -> None:
    mark = MONDAY_9AM + timedelta(minutes=20)
    code = f"import time, jupyter_gpusched as g\ng.checkpointed({mark.timestamp()})\ntime.sleep(60)"
    job = harness.submit(command=py(code), gpus=1)
    await harness.until(lambda: "checkpoint_at" in harness.job(job.id).handle)
    running = harness.job(job.id)
    assert datetime.fromisoformat(running.handle["checkpoint_at"]) == mark
    harness.clock.advance(30 * 60)
    # Preempting it now loses the 10 minutes since that checkpoint, not the 30 since start.
    cand = PreemptCandidate.from_job(running)
    assert preemption_cost_gpu_s(cand, harness.clock.now()) == pytest.approx(600)
    await harness.sched.cancel(job.id, user="alice")


@pytest.mark.asyncio
async def test_idle_lease_is_reclaimed_after_the_window_timeout(
    sim: SimCluster, tmp_path: Path
) -> None:
    h = Harness(
        sim,
        tmp_path / "db.sqlite",
        ManualClock(SATURDAY_NIGHT),
        windows.PolicyConfig(),
        commands={JobKind.LEASE: lambda job: py("import time; time.sleep(120)")},
    )
    await h.sched.start()
    try:
        lease = h.sched.submit(parse_spec({"kind": "lease", "gpus": 1}, user="bob"))
        await h.settle(lease.id, state=JobState.RUNNING)
        h.clock.advance(3600)
        h.sched.touch(lease.id)
        h.clock.advance(3600 + 60)
        await h.sched.tick()
        assert h.job(lease.id).state is JobState.RUNNING  # touched an hour ago: not idle
        h.clock.advance(3600)
        await h.settle(lease.id, state=JobState.CANCELLED)
        assert "idle" in (h.job(lease.id).reason or "")
    finally:
        await h.sched.stop()
        h.sched.store.close()


@pytest.mark.asyncio
async def test_dropped_node_requeues_per_retry_setting_and_is_reconciled(
    harness: Harness,
) -> None:
    retry = harness.submit(
        command=py("import time; time.sleep(120)"), gpus=2, gpu_models=["T4"], retries=1
    )
    await harness.settle(retry.id, state=JobState.RUNNING)
    old_pid = harness.job(retry.id).handle["pid"]
    await harness.sim.stop_node("t4-0")
    await harness.until(lambda: harness.job(retry.id).state is JobState.QUEUED)
    assert harness.job(retry.id).attempt == 1
    events = harness.sched.store.list_events(job_id=retry.id)
    lost = [e for e in events if e.to_state is JobState.LOST]
    assert len(lost) == 1 and "t4-0" in (lost[0].detail.get("reason") or "")
    assert _alive(old_pid)  # the node only dropped off the network
    await harness.sim.start_node("t4-0")
    await harness.until(lambda: harness.job(retry.id).state is JobState.RUNNING)
    await harness.until(lambda: not _alive(old_pid))  # the stale copy was stopped
    assert harness.job(retry.id).handle["pid"] != old_pid
    await harness.sched.cancel(retry.id, user="alice")


@pytest.mark.asyncio
async def test_job_without_retries_becomes_lost_then_reconciled_when_node_returns(
    harness: Harness,
) -> None:
    job = harness.submit(
        command=py("import time; time.sleep(1); print('done')"), gpus=1, gpu_models=["T4"]
    )
    await harness.settle(job.id, state=JobState.RUNNING)
    await harness.sim.stop_node("t4-0")
    await harness.settle(job.id, state=JobState.LOST)
    await asyncio.sleep(1.2)
    await harness.sim.start_node("t4-0")
    await harness.settle(job.id, state=JobState.SUCCEEDED)
    assert harness.job(job.id).exit_code == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return os.path.exists(f"/proc/{pid}")


@pytest.mark.asyncio
async def test_subscribers_get_stored_events_then_live_ones_and_cluster_views(
    harness: Harness,
) -> None:
    first = harness.submit(command=py("pass"), gpus=1)
    await harness.settle(first.id)
    last_seen = harness.sched.store.list_events(job_id=first.id)[-1].id

    stream = harness.sched.subscribe(after_id=last_seen, cluster_every_s=0.1)
    second = harness.submit(command=py("pass"), gpus=1)
    kinds: list[tuple[str, int | None]] = []

    async def collect() -> None:
        async for message in stream:
            kinds.append((message.kind, message.job_id))
            if message.kind == "cluster":
                assert message.cluster is not None
                assert {n.name for n in message.cluster.nodes} >= {"a100-0", "t4-0"}
            if message.to_state == "succeeded":
                return

    await asyncio.gather(collect(), harness.settle(second.id))
    assert all(job_id in (None, second.id) for _, job_id in kinds)  # nothing before the resume
    assert ("submitted", second.id) in kinds
    assert ("cluster", None) in kinds
