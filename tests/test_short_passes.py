"""Passes woken by submissions weigh only the new jobs, and leave every job as a full pass would.

A full pass over a long queue that fits nowhere took 28-35 ms, once per group commit; a pass
woken only by submissions now weighs the jobs queued since the last full one
(:mod:`jupyter_gpusched.scheduling.increments`) and gives way to a full pass whenever it could
not answer for them.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _fixtures_scheduler import MONDAY_9AM, SATURDAY_NIGHT, Harness, memory_scheduler
from test_scheduler import fragment

from jupyter_gpusched.core import windows
from jupyter_gpusched.core.errors import InfeasibleError
from jupyter_gpusched.core.limits import LimitPolicy
from jupyter_gpusched.core.models import JobState, parse_spec
from jupyter_gpusched.scheduling import waiting

pytestmark = pytest.mark.asyncio


class Weighed:
    """Which jobs the passes weighed, and how many of them were full passes."""

    def __init__(self, h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
        self.jobs: list[int] = []
        self.full = 0
        shapes, place_queue = h.sched._shapes, h.sched._place_queue
        real_of = shapes.of

        def of(job: Any) -> Any:
            self.jobs.append(job.id)
            return real_of(job)

        async def counted(*args: Any) -> None:
            self.full += 1
            await place_queue(*args)

        monkeypatch.setattr(shapes, "of", of)
        monkeypatch.setattr(h.sched, "_place_queue", counted)


def outcome(h: Harness) -> dict[int, tuple[JobState, str | None, int | None]]:
    """Each job's state, waiting reason and place in line."""
    jobs, _ = h.sched.list_jobs(limit=None)
    return {j.id: (j.state, j.reason, h.sched._positions.get(j.id)) for j in jobs}


async def busy_queue(h: Harness, waiting: int, used_s: float = 0.0) -> None:
    """A fragmented cluster and ``waiting`` jobs that fit nowhere, weighed by a full pass.

    No probe falls due meanwhile (the harness probes at every pass): a new inventory is a
    change that asks for a full pass.
    """
    await fragment(h)
    h.clock.advance(used_s)  # the running jobs' owner has used this much since
    h.sched.inventory_interval_s = 3600.0
    for _ in range(waiting):
        h.submit(gpus=8)
    await h.sched.tick()
    await h.drive()


@contextlib.asynccontextmanager
async def busy_lab(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    waiting: int,
    start: datetime = SATURDAY_NIGHT,
    used_s: float = 0.0,
    config: windows.PolicyConfig | None = None,
) -> AsyncIterator[tuple[Harness, Weighed]]:
    """A scheduler at ``start`` with a :func:`busy_queue`, and what its passes weigh next."""
    async with memory_scheduler(tmp_path, start=start, config=config) as h:
        await busy_queue(h, waiting, used_s)
        yield h, Weighed(h, monkeypatch)


async def test_a_pass_after_a_submit_that_fits_nowhere_weighs_only_that_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with busy_lab(tmp_path, monkeypatch, waiting=300) as (h, weighed):
        new = h.submit(gpus=8)
        await h.sched.tick(upkeep=False)
        assert weighed.jobs == [new.id]
        assert weighed.full == 0
        assert (h.job(new.id).reason or "").startswith("waiting: needs 8 GPUs free on one node")
        assert h.sched._positions.get(new.id) == 301
        # the interval's pass too, until the full pass's answers are too old to trust: a
        # second for a pass as quick as this one (no time passes on the test's clock)
        await h.sched.tick()
        assert weighed.full == 0
        h.clock.advance(1.0)
        await h.sched.tick()
        assert weighed.full == 1
        assert len(weighed.jobs) == 1 + 301


async def test_a_long_full_pass_is_trusted_a_hundred_times_as_long_up_to_ten_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with busy_lab(tmp_path, monkeypatch, waiting=3) as (h, weighed):
        real = waiting.expected_starts
        for took_s, trusted_s in ((0.05, 5.0), (0.5, h.sched.full_pass_every_s)):

            def slow(*args: Any, took_s: float = took_s) -> Any:
                h.clock.advance(took_s)  # the full pass took this long
                return real(*args)

            monkeypatch.setattr(waiting, "expected_starts", slow)
            h.sched.wake()
            await h.sched.tick()
            full = weighed.full
            monkeypatch.setattr(waiting, "expected_starts", real)
            h.clock.advance(trusted_s - took_s - 0.01)
            await h.sched.tick()
            assert weighed.full == full
            h.clock.advance(0.01)
            await h.sched.tick()
            assert weighed.full == full + 1


async def test_a_full_pass_runs_when_a_waiting_job_may_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with busy_lab(tmp_path, monkeypatch, waiting=3) as (h, weighed):
        t0 = h.clock.now()

        def fits_in(seconds: float) -> int:
            at = (t0 + timedelta(seconds=seconds)).isoformat()
            return h.submit(gpus=1, max_runtime_s=60, not_before=at).id

        first = fits_in(5)
        h.sched.wake()
        await h.sched.tick()  # a full pass: it learns when the first may start
        second = fits_in(8)
        await h.sched.tick()  # a short one: it learns when the second may
        assert weighed.full == 1
        assert (h.job(second).reason or "").startswith("waiting: not before")
        for at, job in ((5, first), (8, second)):
            h.clock.set(t0 + timedelta(seconds=at))
            await h.sched.tick()
            assert h.job(job).state in (JobState.STARTING, JobState.RUNNING)
        assert weighed.full == 3


async def test_a_submitted_job_that_fits_gets_a_full_pass_and_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with busy_lab(tmp_path, monkeypatch, waiting=3) as (h, weighed):
        small = h.submit(gpus=1, max_runtime_s=60)  # ends before the head could start
        await h.sched.tick(upkeep=False)
        assert weighed.full == 1
        assert h.job(small.id).state in (JobState.STARTING, JobState.RUNNING)


@pytest.mark.parametrize(
    ("start", "used_s", "user", "priority"),
    [
        # Alice's running jobs count against her share: Bob's job goes ahead of hers, and
        # would be the job the queue keeps room for (and moves batch jobs for by night).
        (SATURDAY_NIGHT, 1800, "bob", "batch"),
        # By day interactive work goes first, and may preempt batch jobs.
        (MONDAY_9AM, 0, "alice", "interactive"),
    ],
    ids=["ahead-of-the-job-kept-room-for", "interactive-by-day"],
)
async def test_a_job_that_would_go_first_gets_a_full_pass(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    start: datetime,
    used_s: float,
    user: str,
    priority: str,
) -> None:
    lab = busy_lab(tmp_path, monkeypatch, waiting=3, start=start, used_s=used_s)
    async with lab as (h, weighed):
        h.submit(user, gpus=8, priority=priority)
        await h.sched.tick(upkeep=False)
        assert weighed.full == 1


async def test_a_change_besides_submissions_asks_for_a_full_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with busy_lab(tmp_path, monkeypatch, waiting=3) as (h, weighed):
        head = h.sched.list_jobs(states=[JobState.QUEUED], limit=1)[0][0]
        await h.sched.cancel(head.id, user="alice")
        await h.sched.tick(upkeep=False)
        assert weighed.full == 1
        # a running job that ended without waking this scheduler (another process wrote it)
        running = h.sched.list_jobs(states=[JobState.RUNNING], limit=1)[0][0]
        h.sched.store.transition(running.id, JobState.SUCCEEDED, exit_code=0)
        h.submit(gpus=8)
        await h.sched.tick(upkeep=False)
        assert weighed.full == 2


#: bob may run 1 job at once, carol 2 as a member of 'big' (which her requests said).
LIMITED = windows.PolicyConfig(
    limits=LimitPolicy(users={"bob": {"running_jobs": 1}}, groups={"big": {"running_jobs": 2}})
)


@pytest.mark.parametrize(
    ("start", "config"),
    [(SATURDAY_NIGHT, None), (MONDAY_9AM, None), (SATURDAY_NIGHT, LIMITED)],
    ids=["night", "day", "running-limits"],
)
async def test_short_passes_leave_every_job_as_a_full_pass_would(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    start: datetime,
    config: windows.PolicyConfig | None,
) -> None:
    rng = random.Random(19)
    lab = busy_lab(tmp_path, monkeypatch, waiting=5, start=start, config=config)
    async with lab as (h, weighed):
        if config is not None:
            h.sched.callers["carol"] = (frozenset({"big"}), False)
        short = 0
        for _ in range(25):
            for _ in range(rng.randint(1, 4)):
                spec: dict[str, Any] = {
                    "gpus": rng.choice([1, 2, 3, 4, 8, 8, 8]),
                    "gpu_models": rng.choice([[], ["A100"], ["T4"], ["V100"]]),
                    "max_runtime_s": rng.choice([None, 60, 36_000]),
                }
                if rng.random() < 0.2:
                    spec["priority"] = "interactive"
                if rng.random() < 0.2:
                    spec["not_before"] = (start + timedelta(hours=3)).isoformat()
                with contextlib.suppress(InfeasibleError):  # e.g. 4 T4s: no node has them
                    h.submit(rng.choice(["alice", "bob", "carol"]), **spec)
            full_before = weighed.full
            await h.sched.tick(upkeep=False)
            if weighed.full > full_before:
                continue  # it gave way to a full pass (one that fits, or goes first)
            short += 1
            after_short = outcome(h)
            h.sched.wake()  # the same pass again, weighing the whole queue
            await h.sched.tick(upkeep=False)
            assert outcome(h) == after_short
        assert short >= 5  # the short pass was tried, not always given up
        if config is not None:  # and the running jobs' limits were among its answers
            reasons = {reason or "" for _, reason, _ in outcome(h).values()}
            assert "waiting: limit (bob runs 1 of 1 jobs)" in reasons, reasons
            assert "waiting: limit (carol runs 1 of 1 jobs)" not in reasons  # she is in 'big'


async def test_a_group_committed_submit_wakes_a_short_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The REST path: the group commit wakes the loop once its jobs are written.
    async with busy_lab(tmp_path, monkeypatch, waiting=3) as (h, weighed):
        spec = parse_spec({"kind": "script", "command": ["train"], "gpus": 8}, user="bob")
        job = await h.sched.submit_grouped(spec)
        await h.sched.tick(upkeep=False)
        assert (weighed.full, weighed.jobs) == (0, [job.id])
