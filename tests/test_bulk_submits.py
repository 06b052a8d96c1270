"""One user's flood costs the others nothing (issue #30, point 3), on the scheduler itself.

A big array is written in chunks others' commits go between, held until all of it is in and
released in one statement: none of it starts unless all was queued, a failed submit cancels
what it wrote, and one cut off by a killed server is cancelled later. Jobs that cannot start
soon (held, a far ``not_before``) are not weighed by full passes once they have their reason.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from _fixtures_scheduler import MONDAY_9AM, memory_scheduler

from jupyter_gpusched.core.models import (
    ARRAY_BEING_QUEUED,
    JobSpec,
    JobState,
    array_task,
)
from jupyter_gpusched.scheduling import actions
from jupyter_gpusched.scheduling.placing import SOON

pytestmark = pytest.mark.asyncio

FAR = MONDAY_9AM + timedelta(days=200)


def spec(user: str = "mallory", **fields: Any) -> JobSpec:
    return JobSpec(kind="script", command=["train"], user=user, **fields)


async def test_a_big_array_is_written_in_chunks_and_released_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actions, "BULK_CHUNK", 40)
    async with memory_scheduler(tmp_path) as h:
        await h.drive()
        chunks: list[int] = []
        real = h.sched._group.write_held

        async def write_held(specs: list[JobSpec], reason: str, values: Any = None) -> Any:
            queued, _ = h.sched.list_jobs(states=[JobState.QUEUED], limit=None)
            assert all(j.held and j.reason == ARRAY_BEING_QUEUED for j in queued)
            chunks.append(len(specs))
            return await real(specs, reason, values)

        monkeypatch.setattr(h.sched._group, "write_held", write_held)
        jobs = await h.sched.submit_bulk([spec(gpus=0)] * 101)

        assert chunks == [40, 40, 20]  # the head went first, alone
        assert [j.spec.labels["array_index"] for j in jobs] == [str(i) for i in range(101)]
        stored, total = h.sched.list_jobs(array_id=jobs[0].id, limit=None)
        assert total == 101 and not any(j.held or j.reason for j in stored)
        await h.sched.tick()
        assert all(h.job(j.id).state is not JobState.QUEUED for j in jobs)  # gpus=0: all start


async def test_a_failed_bulk_submit_cancels_what_it_wrote_and_nothing_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actions, "BULK_CHUNK", 10)
    async with memory_scheduler(tmp_path) as h:
        await h.drive()
        real = h.sched._group.write_held
        calls = 0

        async def flaky(specs: list[JobSpec], reason: str, values: Any = None) -> Any:
            nonlocal calls
            calls += 1
            if calls == 3:
                raise OSError("disk full")
            return await real(specs, reason, values)

        monkeypatch.setattr(h.sched._group, "write_held", flaky)
        mine = h.submit("alice", gpus=1).id
        with pytest.raises(OSError, match="disk full"):
            await h.sched.submit_bulk([spec(gpus=0)] * 50)
        await h.sched.tick()
        theirs, _ = h.sched.list_jobs(user="mallory", limit=None)
        assert len(theirs) == 21 and {j.state for j in theirs} == {JobState.CANCELLED}
        assert all(j.started_at is None for j in theirs)
        assert all("bulk submit failed (OSError)" in (j.reason or "") for j in theirs)
        assert h.job(mine).state in (JobState.STARTING, JobState.RUNNING)


async def test_an_array_cut_off_by_a_killed_server_is_cancelled_later_never_run(
    tmp_path: Path,
) -> None:
    async with memory_scheduler(tmp_path) as h:
        await h.drive()
        head = h.sched.store.add_array_head(spec(gpus=0))
        tasks = [array_task(spec(gpus=0), head.id, i) for i in range(1, 5)]
        await h.sched._group.write_held(tasks, ARRAY_BEING_QUEUED)  # then the server died
        await h.sched.tick()
        cut, _ = h.sched.list_jobs(array_id=head.id, limit=None)
        assert {j.state for j in cut} == {JobState.QUEUED} and all(j.held for j in cut)
        assert h.sched.cancel_cut_arrays() == 0  # it may still be being written elsewhere

        h.clock.advance(actions.CUT_ARRAY_AFTER_S + 1)
        assert h.sched.cancel_cut_arrays() == 5
        cut, _ = h.sched.list_jobs(array_id=head.id, limit=None)
        assert {j.state for j in cut} == {JobState.CANCELLED}
        assert all(j.started_at is None and "cut off" in (j.reason or "") for j in cut)


async def test_full_passes_skip_what_cannot_start_soon_once_it_has_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actions, "BULK_CHUNK", 50)
    async with memory_scheduler(tmp_path) as h:
        await h.drive()
        far = await h.sched.submit_bulk([spec(not_before=FAR)] * 120)
        assert far[0].reason is not None and far[0].reason.startswith("waiting: not before")
        near = h.submit("bob", gpus=8, gpu_models=["A100"], not_before=MONDAY_9AM + SOON)
        held = h.submit("bob", gpus=1, not_before=FAR)
        await h.sched.tick()
        h.sched.update(held.id, user="bob", held=True)
        fresh = h.sched.store.add_job(spec("carol", not_before=FAR))  # no reason yet

        weighed = {j.id for j in h.sched.store.queued_for_pass(MONDAY_9AM + SOON)}
        assert weighed == {near.id, fresh.id}
        assert h.job(held.id).reason == "waiting: held by its owner"
        view = h.sched.job_view(h.job(far[5].id))
        assert view.estimated_start == FAR  # at the earliest, though no pass weighed it

        h.clock.advance((FAR - MONDAY_9AM).total_seconds() - 3600)  # its time comes near
        weighed = {j.id for j in h.sched.store.queued_for_pass(h.clock.now() + SOON)}
        assert {j.id for j in far} <= weighed
