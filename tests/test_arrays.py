"""Arrays as one record (issue #37): O(1) rows at submit, tasks made jobs as they can start.

Store-level on SQLite and PostgreSQL; the scheduler on the in-memory cluster (its clock
driven by the test) and on the simulated cluster over real SSH with real processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fixtures_postgres import store_url
from _fixtures_scheduler import (
    MONDAY_9AM,
    SATURDAY_NIGHT,
    Harness,
    memory_scheduler,
    py,
    ssh_backend,
)
from sqlalchemy import func, select

from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.cluster.sim.specs import SimNodeSpec
from jupyter_gpusched.core.clock import ManualClock
from jupyter_gpusched.core.models import JobSpec, JobState
from jupyter_gpusched.store.orm import JobArrayRow, JobRow
from jupyter_gpusched.store.store import Store

__all__ = ["store_url"]  # fixtures, imported for the tests

#: A small cluster: 4 GPUs in all.
SMALL = (
    SimNodeSpec("n1", "A100-80GB", 80.0, 2, 16, 64.0),
    SimNodeSpec("n2", "A100-80GB", 80.0, 2, 16, 64.0),
)


def spec(user: str = "alice", **fields: Any) -> JobSpec:
    fields.setdefault("command", ["train"])
    return JobSpec(kind="script", user=user, **fields)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    st = Store(store_url, clock=ManualClock(MONDAY_9AM))
    st.migrate()
    try:
        yield st
    finally:
        st.close()


def rows(store: Store) -> tuple[int, int]:
    with store.read_session() as s:
        jobs = s.execute(select(func.count()).select_from(JobRow)).scalar_one()
        arrays = s.execute(select(func.count()).select_from(JobArrayRow)).scalar_one()
    return int(jobs), int(arrays)


def test_an_array_of_100000_is_two_rows_task_0_and_the_array(store: Store) -> None:
    record, head = store.add_array(spec(gpus=1), 100_000)

    assert rows(store) == (1, 1)
    assert record.id == head.id and head.spec.labels["array_index"] == "0"
    got = store.get_array(record.id)
    assert got is not None and (got.size, got.next_index, got.pending) == (100_000, 1, 99_999)
    assert store.pending_tasks("alice") == 99_999
    assert store.array_task_id(record.id, 0) == head.id


def test_expanding_makes_the_next_tasks_jobs_and_advances_the_array_together(
    store: Store,
) -> None:
    record, _ = store.add_array(spec(gpus=1), 10)
    assert store.cancel_pending_task(record.id, 2)
    assert not store.cancel_pending_task(record.id, 0)  # a job already: cancelled as one
    store._clock.advance(600)  # type: ignore[attr-defined]

    made = store.expand_array(record.id, 3)

    assert [j.spec.labels["array_index"] for j in made] == ["1", "3", "4"]  # 2 was cancelled
    assert all(j.spec.env["GPUSCHED_ARRAY_ID"] == str(record.id) for j in made)
    # submitted when the array was: they keep its place in first-come order
    assert {j.submitted_at for j in store.get_jobs(j.id for j in made).values()} == {MONDAY_9AM}
    got = store.get_array(record.id)
    assert got is not None and (got.next_index, got.pending) == (5, 5)
    assert store.array_task_id(record.id, 4) == made[-1].id
    assert store.array_task_id(record.id, 5) is None
    assert rows(store) == (4, 1)


def test_cancelling_the_pending_rest_is_one_change_and_nothing_more_is_made(
    store: Store,
) -> None:
    record, _ = store.add_array(spec(gpus=1), 50_000)
    store.expand_array(record.id, 2)

    assert store.cancel_pending_rest(record.id) == 49_997
    assert store.expand_array(record.id, 10) == []
    got = store.get_array(record.id)
    assert got is not None and got.pending == 0 and got.task_cancelled(40_000)
    assert not got.task_cancelled(1) and store.pending_tasks("alice") == 0


def test_a_reopened_store_has_the_pending_range(store_url: str) -> None:
    first = Store(store_url, clock=ManualClock(MONDAY_9AM))
    first.migrate()
    record, _ = first.add_array(spec(gpus=1), 1000)
    first.expand_array(record.id, 9)
    first.cancel_pending_task(record.id, 500)
    first.close()

    again = Store(store_url, clock=ManualClock(MONDAY_9AM))
    try:
        got = again.get_array(record.id)
        assert got is not None
        assert (got.next_index, got.pending, got.cancelled) == (10, 989, frozenset({500}))
        assert got.pending_indices() == [(10, 499), (501, 999)]
    finally:
        again.close()


# ---------------------------------------------------------------------- the scheduler


@pytest.mark.asyncio
async def test_an_array_is_made_jobs_as_the_cluster_can_hold_them_and_all_run(
    tmp_path: Path,
) -> None:
    async with memory_scheduler(tmp_path, nodes=SMALL, start=SATURDAY_NIGHT) as h:
        await h.drive()
        record, _ = await h.sched.submit_array(spec(gpus=1), 50)
        made_after: list[int] = []
        for _ in range(3):
            await h.sched.tick()
            made_after.append(len(h.sched.list_jobs(array_id=record.id, limit=None)[0]))
        # 4 GPUs: 4 tasks start, one waits in line for the rest; no more until one ends
        assert made_after == [5, 5, 5]
        running = [j for j in h.sched.list_jobs(array_id=record.id, limit=None)[0]]
        assert sum(j.state in (JobState.STARTING, JobState.RUNNING) for j in running) == 4

        async def all_done() -> bool:
            for job in h.sched.list_jobs(states=[JobState.RUNNING], limit=None)[0]:
                h.memory.finish(job.id)
            got = h.sched.store.get_array(record.id)
            jobs, total = h.sched.list_jobs(array_id=record.id, limit=None)
            return (
                got is not None
                and got.pending == 0
                and total == 50
                and all(j.state is JobState.SUCCEEDED for j in jobs)
            )

        for _ in range(200):
            await h.sched.tick()
            if await all_done():
                break
        jobs, total = h.sched.list_jobs(array_id=record.id, limit=None)
        assert total == 50 and {j.state for j in jobs} == {JobState.SUCCEEDED}
        indices = sorted(int(j.spec.labels["array_index"]) for j in jobs)
        assert indices == list(range(50))  # each task made exactly once


@pytest.mark.asyncio
async def test_two_users_arrays_each_get_tasks_in_line_for_fair_share_to_choose(
    tmp_path: Path,
) -> None:
    async with memory_scheduler(tmp_path, nodes=SMALL, start=SATURDAY_NIGHT) as h:
        await h.drive()
        # CPUs asked too: each task is packed as the pass would (not counted by free GPUs)
        first, _ = await h.sched.submit_array(spec("alice", gpus=1, cpus=2), 20)
        second, _ = await h.sched.submit_array(spec("bob", gpus=1, cpus=2), 20)
        await h.sched.tick()
        made = {r.id: h.sched.list_jobs(array_id=r.id, limit=None)[1] for r in (first, second)}
        # each weighed against the 4 free GPUs (not what the older array would take): both
        # have 4 + 1 tasks in line, and the pass's fair-share order chose among them
        assert made == {first.id: 5, second.id: 5}
        running, _ = h.sched.list_jobs(states=[JobState.STARTING, JobState.RUNNING], limit=None)
        assert len(running) == 4


@pytest.mark.asyncio
async def test_cancel_one_pending_task_and_then_the_whole_array(tmp_path: Path) -> None:
    async with memory_scheduler(tmp_path, nodes=SMALL, start=SATURDAY_NIGHT) as h:
        await h.drive()
        record, head = await h.sched.submit_array(spec(gpus=1), 30)
        await h.sched.tick()

        task = await h.sched.cancel_array_task(record.id, 20, user="alice")
        assert task.state == "cancelled" and task.job is None
        assert "cancelled before it started" in task.detail
        pending = h.sched.array_task(record.id, 21)
        assert pending.state == "pending" and "has not started" in pending.detail
        made = h.sched.array_task(record.id, 0)
        assert made.job is not None and made.job.id == head.id

        cancelled, jobs = await h.sched.cancel_array(record.id, user="alice")
        assert cancelled == 30 - 5 - 1  # 5 made (4 run, 1 waits), 20 cancelled before
        assert len(jobs) == 5
        await h.sched.tick()
        left, total = h.sched.list_jobs(array_id=record.id, limit=None)
        assert total == 5 and {j.state for j in left} == {JobState.CANCELLED}
        got = h.sched.store.get_array(record.id)
        assert got is not None and got.pending == 0


@pytest.mark.asyncio
async def test_another_user_cannot_cancel_an_array(tmp_path: Path) -> None:
    from jupyter_gpusched.core.errors import ForbiddenError

    async with memory_scheduler(tmp_path, nodes=SMALL, start=SATURDAY_NIGHT) as h:
        await h.drive()
        record, _ = await h.sched.submit_array(spec(gpus=1), 10)
        with pytest.raises(ForbiddenError, match="belongs to alice"):
            await h.sched.cancel_array(record.id, user="mallory")


@pytest.mark.asyncio
async def test_a_restarted_scheduler_goes_on_with_the_pending_range(tmp_path: Path) -> None:
    async with memory_scheduler(tmp_path, nodes=SMALL, start=SATURDAY_NIGHT) as h:
        await h.drive()
        record, _ = await h.sched.submit_array(spec(gpus=1), 40)
        await h.sched.tick()
        await h.restart()
        await h.drive()
        got = h.sched.store.get_array(record.id)
        assert got is not None and (got.next_index, got.pending) == (5, 35)
        for job in h.sched.list_jobs(states=[JobState.RUNNING], limit=None)[0]:
            h.memory.finish(job.id)
        for _ in range(5):
            await h.sched.tick()
        got = h.sched.store.get_array(record.id)
        assert got is not None and got.next_index > 5


@pytest.mark.asyncio
async def test_sim_cluster_runs_an_array_of_50_one_gpu_tasks_progressively(
    tmp_path: Path,
) -> None:
    sim = SimCluster(SMALL, base_dir=tmp_path / "sim")
    await sim.start()
    clock = ManualClock(SATURDAY_NIGHT)
    h = await Harness(ssh_backend(sim), tmp_path / "gpusched.db", clock).start()
    try:
        await h.drive()
        record, _ = await h.sched.submit_array(
            spec(gpus=1, command=py("import os; print(os.environ['GPUSCHED_ARRAY_INDEX'])")),
            50,
        )
        most_made = 0
        total_gpus = sum(len(n.gpus) for n in h.sched._inventory)

        def done() -> bool:
            nonlocal most_made
            jobs, total = h.sched.list_jobs(array_id=record.id, limit=None)
            live = [j for j in jobs if j.state is not JobState.SUCCEEDED]
            most_made = max(most_made, len(live))
            return total == 50 and not live

        await h.until(done, timeout_s=240)
        # never more made than could run at once, plus the one waiting for the rest
        assert most_made <= total_gpus + 1 < 50
        jobs, _ = h.sched.list_jobs(array_id=record.id, limit=None)
        outputs = {int((await h.sched.read_log(j.id)).decode().strip()) for j in jobs}
        assert outputs == set(range(50))
    finally:
        await h.stop()
        await sim.stop(kill_jobs=True)
