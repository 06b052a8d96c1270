"""A scheduler on a temp store, driven tick by tick, on either kind of cluster.

- ``mem_harness``: the in-memory backend (:mod:`jupyter_gpusched.cluster.memory`) on the same
  :class:`ManualClock` as the scheduler: policy and placement tests run in milliseconds, and
  jobs end when the test says (``finish``) or after the duration it declared (``run=``).
- ``sim_harness``: the embedded simulated cluster over real SSH, with real processes, for the
  integration tests (what launching, killing, logs, lost nodes and reattaching really do).

Import the fixtures into a test module: ``from _fixtures_scheduler import mem_harness, ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest_asyncio
from _fixtures_polling import Deadline, wait_for_async

from jupyter_gpusched.cluster.base import Backend
from jupyter_gpusched.cluster.memory import MemoryBackend, Run
from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.cluster.sim.specs import DEFAULT_SIM_NODES, SimNodeSpec
from jupyter_gpusched.cluster.ssh import SshBackend
from jupyter_gpusched.core import windows
from jupyter_gpusched.core.clock import ManualClock, SystemClock
from jupyter_gpusched.core.models import Job, JobState, parse_spec
from jupyter_gpusched.scheduling.scheduler import Scheduler
from jupyter_gpusched.store.store import Store

MONDAY_9AM = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
SATURDAY_NIGHT = datetime(2026, 11, 28, 23, 0, tzinfo=UTC)
ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def py(code: str) -> list[str]:
    """argv of a Python one-liner job."""
    return [sys.executable, "-c", code]


class Harness:
    """A scheduler on a temp store and a backend, driven tick by tick.

    ``backend`` makes the scheduler's backend; :meth:`restart` asks it again (the sim builds a
    fresh SSH backend, the in-memory cluster hands back the same records: both keep the jobs).
    ``interval_s`` is the real time between ticks while waiting (0 on the in-memory backend,
    where nothing happens between ticks but what the clock and the test do).
    """

    def __init__(
        self,
        backend: Callable[[], Backend],
        db: Path,
        clock: ManualClock,
        config: windows.PolicyConfig | None = None,
        *,
        interval_s: float = 0.05,
        **kwargs: object,
    ) -> None:
        self.backend = backend
        self.db = db
        self.clock = clock
        self.config = config or windows.PolicyConfig()
        self.interval_s = interval_s
        self.kwargs = kwargs
        self.sched = self._make()

    def _make(self) -> Scheduler:
        return Scheduler(
            store=Store(f"sqlite:///{self.db}", clock=self.clock),
            backend=self.backend(),
            policy=self.config,
            clock=self.clock,
            poll_interval_s=0,
            inventory_interval_s=0,
            cancel_grace_s=2,
            **self.kwargs,
        )  # type: ignore[arg-type]

    async def start(self) -> Harness:
        await self.sched.start()
        return self

    async def stop(self) -> None:
        await self.sched.stop()
        self.sched.store.close()

    async def restart(self) -> None:
        await self.stop()
        self.sched = self._make()
        await self.sched.start()

    @property
    def memory(self) -> MemoryBackend:
        """The in-memory backend (on a ``mem_harness``)."""
        assert isinstance(self.sched.backend, MemoryBackend), "not an in-memory harness"
        return self.sched.backend

    def submit(self, user: str = "alice", *, run: Run | None = None, **spec: object) -> Job:
        """Queue a script job; ``run`` declares what it does on the in-memory backend."""
        spec.setdefault("command", ["train"])
        job = self.sched.submit(parse_spec({"kind": "script", **spec}, user=user))
        if run is not None:
            self.memory.plan(job.id, run)
        return job

    def job(self, job_id: int) -> Job:
        return self.sched.get_job(job_id)

    async def until(self, pred: Callable[[], bool], timeout_s: float = 20.0) -> None:
        """Tick until ``pred()`` holds."""

        def states(_: object) -> str:
            jobs, _ = self.sched.list_jobs(limit=100)
            return f"jobs: { ({j.id: (j.state.value, j.reason) for j in jobs}) }"

        await wait_for_async(
            pred,
            step=self.sched.tick,
            timeout_s=timeout_s,
            interval_s=self.interval_s,
            what=states,
        )

    async def drive(self) -> None:
        """Stop the scheduler's own loop: from now on the test runs every pass itself.

        The loop runs a pass whenever a submit or a change wakes it, so a test that counts
        what one pass does would otherwise race the loop's own passes.
        """
        task, self.sched._task = self.sched._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def settle(self, *ids: int, state: JobState | None = None) -> None:
        """Tick until the jobs are in ``state`` (default: succeeded, failed or cancelled)."""
        await self.until(
            lambda: all(
                self.job(i).state is state if state else self.job(i).state in ENDED for i in ids
            )
        )


@contextlib.asynccontextmanager
async def memory_scheduler(
    tmp_path: Path,
    *,
    start: datetime = MONDAY_9AM,
    nodes: Sequence[SimNodeSpec] = DEFAULT_SIM_NODES,
    config: windows.PolicyConfig | None = None,
    **kwargs: object,
) -> AsyncIterator[Harness]:
    """A started scheduler on an in-memory cluster of ``nodes``, its clock at ``start``."""
    clock = ManualClock(start)
    backend = MemoryBackend(nodes, clock=clock)
    h = Harness(lambda: backend, tmp_path / "gpusched.db", clock, config, interval_s=0, **kwargs)
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


@pytest_asyncio.fixture
async def mem_harness(tmp_path: Path) -> AsyncIterator[Harness]:
    """The scheduler on the in-memory default lab (2 x 8 A100, 4 V100, 2 T4), Monday 9:00."""
    async with memory_scheduler(tmp_path) as h:
        yield h


def ssh_backend(sim: SimCluster) -> Callable[[], Backend]:
    """A fresh SSH backend on the sim's nodes, quick to give up on a node that went away."""
    return lambda: SshBackend(
        sim.node_configs(),
        clock=SystemClock(),
        down_after_failures=2,
        backoff_base_s=0.05,
        backoff_max_s=0.2,
    )


@pytest_asyncio.fixture
async def sim(tmp_path: Path) -> AsyncIterator[SimCluster]:
    """The embedded simulated default lab (loopback SSH nodes, real processes)."""
    cluster = SimCluster(base_dir=tmp_path / "sim")
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop(kill_jobs=True)


@pytest_asyncio.fixture
async def sim_harness(sim: SimCluster, tmp_path: Path) -> AsyncIterator[Harness]:
    """The scheduler on the simulated default lab over real SSH, Monday 9:00 (manual clock)."""
    h = await Harness(ssh_backend(sim), tmp_path / "gpusched.db", ManualClock(MONDAY_9AM)).start()
    try:
        yield h
    finally:
        await h.stop()


async def tick_until(sched: Scheduler, done: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Tick ``sched`` until ``done()`` holds; the jobs' states say why when it never does."""
    deadline = Deadline(timeout_s)
    while not done():
        assert not deadline.expired(), [(j.id, j.state, j.reason) for j in sched.list_jobs()[0]]
        await sched.tick()
        await asyncio.sleep(0.05)
