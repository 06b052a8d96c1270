"""What a submit costs the store: the same few statements and no job rows read, however long
the queue; and a burst of submits wakes one scheduling pass, not one each."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from _fixtures_polling import wait_for_async
from _fixtures_scheduler import Harness, mem_harness
from sqlalchemy import event

from jupyter_gpusched.core.models import JobState, parse_spec
from jupyter_gpusched.store.orm import JobRow

__all__ = ["mem_harness"]  # the fixture, imported for its tests

pytestmark = pytest.mark.asyncio


@dataclass
class Reads:
    """Statements this thread sent to the store, and job rows it read back."""

    statements: list[str] = field(default_factory=list)
    job_rows: int = 0


@contextmanager
def counting(engine: Any) -> Iterator[Reads]:
    """Count this thread's statements and loaded job rows (the loop's lease thread aside)."""
    reads, me = Reads(), threading.get_ident()

    def on_statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # A pooled connection last used by a worker thread gets the loop's busy timeout back
        # first: connection set-up, not the submit's work.
        if threading.get_ident() == me and not statement.startswith("PRAGMA busy_timeout"):
            reads.statements.append(" ".join(statement.split()))

    def on_load(target: Any, context: Any) -> None:
        if threading.get_ident() == me:
            reads.job_rows += 1

    event.listen(engine, "before_cursor_execute", on_statement)
    event.listen(JobRow, "load", on_load)
    try:
        yield reads
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)
        event.remove(JobRow, "load", on_load)


def one_submit(h: Harness) -> Reads:
    spec = parse_spec({"kind": "script", "command": ["true"], "gpus": 1, "user": "alice"})
    with counting(h.sched.store.engine) as reads:
        h.sched.submit(spec)
    return reads


async def test_a_submit_reads_no_job_rows_and_sends_the_same_statements_with_3000_queued(
    mem_harness: Harness,
) -> None:
    one_submit(mem_harness)  # warm: the admission answer for this shape is kept
    empty = one_submit(mem_harness)

    later = (mem_harness.clock.now() + timedelta(days=365)).isoformat()
    filler = parse_spec({"kind": "script", "command": ["true"], "user": "bob", "not_before": later})
    mem_harness.sched.store.add_jobs([filler] * 3000)
    _, queued = mem_harness.sched.store.list_jobs(states=[JobState.QUEUED], limit=0)
    assert queued >= 3000
    full = one_submit(mem_harness)

    assert full.job_rows == empty.job_rows == 0
    assert full.statements == empty.statements
    selects = [s for s in full.statements if s.startswith("SELECT")]
    assert not any(" FROM jobs" in s for s in selects), selects
    assert len(full.statements) <= 4, full.statements  # BEGIN, job, event (+ lease fence)


async def test_a_burst_of_submits_wakes_one_pass(mem_harness: Harness) -> None:
    passes = 0
    tick = mem_harness.sched.tick

    async def counted(**kw: bool) -> None:
        nonlocal passes
        passes += 1
        await tick(**kw)

    mem_harness.sched.tick = counted  # type: ignore[method-assign]
    await asyncio.sleep(0.2)  # the loop settles after start
    before = passes
    spec = parse_spec({"kind": "script", "command": ["true"], "gpus": 0, "user": "alice"})
    for _ in range(50):
        mem_harness.sched.submit(spec)
    await asyncio.sleep(0.3)
    assert 1 <= passes - before <= 2, passes - before


async def test_a_pass_writes_a_thousand_waiting_reasons_in_one_transaction(
    mem_harness: Harness,
) -> None:
    later = (mem_harness.clock.now() + timedelta(days=365)).isoformat()
    filler = parse_spec({"kind": "script", "command": ["true"], "user": "bob", "not_before": later})
    ids = [job.id for job in mem_harness.sched.store.add_jobs([filler] * 1000)]
    begins: list[str] = []

    def on_statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("BEGIN"):
            begins.append(statement)

    engine = mem_harness.sched.store.engine
    event.listen(engine, "before_cursor_execute", on_statement)
    try:
        await mem_harness.sched.tick()
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)
    jobs, _ = mem_harness.sched.store.list_jobs(states=[JobState.QUEUED], limit=2000)
    waiting = {j.id: j.reason for j in jobs}
    assert all((waiting[i] or "").startswith("waiting: not before") for i in ids), waiting[ids[0]]
    writes = [b for b in begins if "IMMEDIATE" in b.upper()]
    assert 1 <= len(writes) <= 3, begins  # not one write per waiting job


async def test_concurrent_submits_share_commits_and_each_gets_its_own_job(
    mem_harness: Harness,
) -> None:
    commits: list[int] = []
    engine = mem_harness.sched.store.engine

    def on_commit(conn: Any) -> None:
        commits.append(threading.get_ident())

    event.listen(engine, "commit", on_commit)
    try:
        specs = [
            parse_spec({"kind": "script", "command": ["true"], "name": f"s{i}", "user": "alice"})
            for i in range(40)
        ]
        jobs = await asyncio.gather(*(mem_harness.sched.submit_grouped(s) for s in specs))
    finally:
        event.remove(engine, "commit", on_commit)
    names = [job.spec.name for job in jobs]
    assert names == [f"s{i}" for i in range(40)]  # each caller's own job, in arrival order
    assert [job.id for job in jobs] == sorted(job.id for job in jobs)
    stored = mem_harness.sched.store.get_jobs(job.id for job in jobs)
    assert [stored[job.id].spec.name for job in jobs] == names
    loop_thread = threading.get_ident()
    writes = [t for t in commits if t != loop_thread]
    assert 1 <= len(writes) <= 3, len(writes)  # off the loop, and shared: not 40 commits


async def test_a_failed_group_commit_fails_its_submitters_and_the_next_one_works(
    mem_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await mem_harness.drive()  # no pass of the loop places the job before it is looked at
    store = mem_harness.sched.store
    real = store.insert_queued  # the thread's commit (the memory harness has no writer)
    monkeypatch.setattr(
        store, "insert_queued", lambda values, claims: (_ for _ in ()).throw(OSError("disk"))
    )
    spec = parse_spec({"kind": "script", "command": ["true"], "user": "alice"})
    failed = await asyncio.gather(
        *(mem_harness.sched.submit_grouped(spec) for _ in range(3)), return_exceptions=True
    )
    assert [str(x) for x in failed] == ["disk"] * 3
    monkeypatch.setattr(store, "insert_queued", real)
    job = await mem_harness.sched.submit_grouped(spec)
    assert store.get_job(job.id).state is JobState.QUEUED


async def test_a_pass_a_submit_asks_for_places_it_and_leaves_upkeep_to_the_interval(
    mem_harness: Harness,
) -> None:
    sched = mem_harness.sched
    upkeeps: list[bool] = []
    tick = sched.tick

    async def recorded(*, upkeep: bool = True) -> None:
        upkeeps.append(upkeep)
        await tick(upkeep=upkeep)

    sched.tick = recorded  # type: ignore[method-assign]
    await asyncio.sleep(0.2)  # the first pass, with its upkeep, is behind us
    upkeeps.clear()
    job = mem_harness.submit(gpus=1)
    await wait_for_async(lambda: mem_harness.job(job.id).state is JobState.RUNNING)
    assert upkeeps[0] is False  # placed at once, without redoing what was just done
    await wait_for_async(lambda: True in upkeeps, timeout_s=5)  # then the interval's pass
