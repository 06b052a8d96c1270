"""Job arrays as one record until their tasks start, as Slurm keeps them.

An ``array: N`` submit writes its task 0 as a queued job and one ``job_arrays`` row holding
the rest as a range (:class:`~.orm.JobArrayRow`): O(1) rows whatever N. The scheduler makes
the pending tasks into job rows a few at a time, as it can place them
(:meth:`Arrays.expand_array`): the new rows and the array's advanced ``next_index`` commit
together, so a killed server neither loses a task nor makes one twice. Cancelling a pending
task or the whole pending remainder changes the array row alone.

A mixin of :class:`~.store.Store`, as :mod:`.submissions` is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.models import Job, JobSpec, JobState, stored_spec

from .idempotency import KeyClaim
from .jobcache import JobCache
from .orm import JobArrayRow, JobRow
from .rows import (
    FIRST_VERSION,
    _spec_json,
    add_job_rows,
    insert_queued_rows,
    queued_job,
    task_values,
)


@dataclass(frozen=True)
class ArrayRecord:
    """A stored array: its tasks ``next_index`` onwards are not jobs yet."""

    id: int  # its task 0's job id
    user: str
    spec: JobSpec  # the tasks' spec, without their array labels
    size: int
    next_index: int  # the first task not yet made a job
    pending: int  # tasks from next_index on, neither made nor cancelled
    cancelled: frozenset[int]  # pending tasks cancelled one by one
    cancelled_rest: bool  # every task not yet made was cancelled
    submitted_at: datetime

    def task_pending(self, index: int) -> bool:
        """Whether task ``index`` is neither a job yet nor cancelled."""
        return (
            self.next_index <= index < self.size
            and not self.cancelled_rest
            and index not in self.cancelled
        )

    def task_cancelled(self, index: int) -> bool:
        """Whether task ``index`` was cancelled before it became a job."""
        if not 0 <= index < self.size:
            return False
        return index in self.cancelled or (self.cancelled_rest and index >= self.next_index)

    def pending_indices(self, limit: int | None = None) -> list[tuple[int, int]]:
        """The pending tasks as (first, last) runs, in order; at most ``limit`` runs."""
        if self.cancelled_rest or self.pending == 0:
            return []
        runs: list[tuple[int, int]] = []
        start = self.next_index
        for gap in sorted(i for i in self.cancelled if i >= self.next_index):
            if gap > start:
                runs.append((start, gap - 1))
            start = gap + 1
            if limit is not None and len(runs) >= limit:
                return runs
        if start < self.size:
            runs.append((start, self.size - 1))
        return runs[:limit] if limit is not None else runs


def range_label(runs: Sequence[tuple[int, int]]) -> str:
    """Slurm's spelling of index runs: ``8-99999``, ``3,9-20``."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


class Arrays:
    """Arrays kept as one row; the store's sessions, clock and job cache underneath."""

    _clock: Clock
    _cache: JobCache

    write_session: Callable[..., AbstractContextManager[Session]]  # the store's
    read_session: Callable[..., AbstractContextManager[Session]]
    queued: Callable[..., list[Job]]  # Submissions'

    #: Guards each store's parsed array specs (an array's spec never changes; passes read it).
    _array_specs_lock = threading.Lock()

    def add_array(
        self, spec: JobSpec, size: int, claim: KeyClaim | None = None
    ) -> tuple[ArrayRecord, Job]:
        """Queue an array of ``size`` copies of ``spec``: its task 0 and one array row.

        ``claim``: the request's idempotency key, committed with both.
        """
        now = self._clock.now()
        with self.write_session() as s:
            (head,) = add_job_rows(s, [spec], now, array=True, claim=claim)
            s.add(
                JobArrayRow(
                    id=head.id,
                    version=FIRST_VERSION,
                    username=spec.user,
                    spec=_spec_json(spec),
                    size=size,
                    next_index=1,
                    pending=size - 1,
                    cancelled=[],
                    cancelled_rest=False,
                    submitted_at=now,
                )
            )
        job = queued_job(head.id, head.spec, now)
        self._cache.keep(job, head.version, head.spec_json)
        record = ArrayRecord(head.id, spec.user, spec, size, 1, size - 1, frozenset(), False, now)
        return record, queued_job(head.id, head.spec, now)

    def get_array(self, array_id: int) -> ArrayRecord | None:
        """The array with this id, or None (a job submitted alone, or a list's)."""
        with self.read_session() as s:
            row = s.get(JobArrayRow, array_id)
            return None if row is None else self._record(row)

    def list_arrays(
        self,
        *,
        user: str | None = None,
        ids: Iterable[int] | None = None,
        pending_only: bool = True,
        limit: int = 1000,
    ) -> list[ArrayRecord]:
        """Arrays (by default only those with pending tasks), oldest first."""
        query = select(JobArrayRow).order_by(JobArrayRow.id).limit(limit)
        if pending_only:
            query = query.where(JobArrayRow.pending > 0)
        if user is not None:
            query = query.where(JobArrayRow.username == user)
        if ids is not None:
            query = query.where(JobArrayRow.id.in_(sorted(set(ids))))
        with self.read_session() as s:
            return [self._record(row) for row in s.scalars(query)]

    def pending_tasks(self, user: str) -> int:
        """``user``'s array tasks not yet jobs: they count as queued jobs (Slurm's way)."""
        query = select(func.coalesce(func.sum(JobArrayRow.pending), 0)).where(
            JobArrayRow.username == user, JobArrayRow.pending > 0
        )
        with self.read_session() as s:
            return int(s.execute(query).scalar_one())

    def array_counts(self, array_ids: Sequence[int]) -> dict[int, dict[str, int]]:
        """Each array's tasks made into jobs, by state."""
        out: dict[int, dict[str, int]] = {array_id: {} for array_id in array_ids}
        if not array_ids:
            return out
        query = (
            select(JobRow.array_id, JobRow.state, func.count())
            .where(JobRow.array_id.in_(sorted(set(array_ids))))
            .group_by(JobRow.array_id, JobRow.state)
        )
        with self.read_session() as s:
            for array_id, state, count in s.execute(query):
                out[array_id][state] = int(count)
        return out

    def queued_tasks(self, array_ids: Sequence[int]) -> dict[int, int]:
        """How many tasks of each array are queued jobs now (made, not yet started)."""
        out = dict.fromkeys(array_ids, 0)
        if not array_ids:
            return out
        query = (
            select(JobRow.array_id, func.count())
            .where(JobRow.state == JobState.QUEUED.value, JobRow.array_id.in_(sorted(array_ids)))
            .group_by(JobRow.array_id)
        )
        with self.read_session() as s:
            for array_id, count in s.execute(query):
                out[array_id] = int(count)
        return out

    def array_task_id(self, array_id: int, index: int) -> int | None:
        """The job id of task ``index`` of array ``array_id``, once it was made a job."""
        query = select(JobRow.id).where(JobRow.array_id == array_id, JobRow.array_index == index)
        with self.read_session() as s:
            return s.execute(query.limit(1)).scalar_one_or_none()

    def expand_array(self, array_id: int, count: int) -> list[Job]:
        """Make the next ``count`` pending tasks of the array queued jobs; the jobs made.

        The rows and the array's new ``next_index`` commit in one transaction (the array row
        is locked first): each task is made exactly once, whoever else writes meanwhile.
        """
        if count <= 0:
            return []
        with self.write_session() as s:
            row = s.execute(
                select(JobArrayRow).where(JobArrayRow.id == array_id).with_for_update()
            ).scalar_one_or_none()
            if row is None or row.pending <= 0 or row.cancelled_rest or count <= 0:
                return []
            record = self._record(row)
            indices: list[int] = []
            index = record.next_index
            while index < record.size and len(indices) < count:
                if index not in record.cancelled:
                    indices.append(index)
                index += 1
            while index < record.size and index in record.cancelled:
                index += 1  # cancelled tasks right after the last made are passed too
            # submitted when the array was, as Slurm's array tasks are: they keep its place
            # in first-come order against jobs submitted since
            specs, values = task_values(record.spec, array_id, indices, record.submitted_at)
            ids = insert_queued_rows(s, values) if values else []
            s.execute(
                update(JobArrayRow)
                .where(JobArrayRow.id == array_id)
                .values(
                    next_index=index,
                    pending=row.pending - len(indices),
                    version=JobArrayRow.version + 1,
                )
            )
        return self.queued(specs, values, ids)

    def cancel_pending_task(self, array_id: int, index: int) -> bool:
        """Cancel task ``index`` if it is pending (not yet a job); whether it was."""
        with self.write_session() as s:
            row = s.execute(
                select(JobArrayRow).where(JobArrayRow.id == array_id).with_for_update()
            ).scalar_one_or_none()
            if row is None or not self._record(row).task_pending(index):
                return False
            s.execute(
                update(JobArrayRow)
                .where(JobArrayRow.id == array_id)
                .values(
                    cancelled=sorted({*row.cancelled, index}),
                    pending=row.pending - 1,
                    version=JobArrayRow.version + 1,
                )
            )
        return True

    def cancel_pending_rest(self, array_id: int) -> int:
        """Cancel every task of the array not yet a job, in one statement; how many."""
        with self.write_session() as s:
            pending = s.execute(
                select(JobArrayRow.pending).where(JobArrayRow.id == array_id).with_for_update()
            ).scalar_one_or_none()
            if not pending:
                return 0
            s.execute(
                update(JobArrayRow)
                .where(JobArrayRow.id == array_id)
                .values(pending=0, cancelled_rest=True, version=JobArrayRow.version + 1)
            )
        return int(pending)

    def _record(self, row: JobArrayRow) -> ArrayRecord:
        return ArrayRecord(
            id=row.id,
            user=row.username,
            spec=self._array_spec(row.id, row.spec),
            size=row.size,
            next_index=row.next_index,
            pending=row.pending,
            cancelled=frozenset(row.cancelled),
            cancelled_rest=row.cancelled_rest,
            submitted_at=row.submitted_at,
        )

    def _array_spec(self, array_id: int, stored: dict[str, Any]) -> JobSpec:
        specs: dict[int, JobSpec] = self.__dict__.setdefault("_array_specs", {})
        with self._array_specs_lock:
            spec = specs.get(array_id)
        if spec is None:
            spec = stored_spec(stored)
            with self._array_specs_lock:
                if len(specs) > 10_000:
                    specs.clear()
                specs[array_id] = spec
        return spec
