"""New jobs into the store: a submit, a bulk submit, and the steps a store writer process shares.

A mixin of :class:`~.store.Store`, as the usage, event and node ledgers are: each method is one
transaction through the store's write sessions, and the jobs written are kept in its job cache,
so the next pass reads them without reading their rows back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, delete, func, select, update
from sqlalchemy.orm import Session

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.models import ARRAY_BEING_QUEUED, Job, JobSpec, JobState

from .idempotency import KeyClaim
from .jobcache import JobCache, copy_job
from .orm import IdempotencyRow, JobRow
from .rows import (
    FIRST_VERSION,
    add_event_rows,
    add_job_row,
    add_job_rows,
    insert_queued_rows,
    job_from_row,
    queued_job,
    queued_values,
    task_values,
)


class Submissions:
    """Queueing jobs; the store's write sessions, clock and job cache underneath."""

    _clock: Clock
    _cache: JobCache

    write_session: Callable[..., AbstractContextManager[Session]]  # the store's

    def add_job(self, spec: JobSpec, claim: KeyClaim | None = None) -> Job:
        """Queue a new job and log ``submitted``; ``claim``: its request's idempotency key."""
        with self.write_session() as s:
            return job_from_row(add_job_row(s, spec, self._clock.now(), claim=claim))

    def add_jobs(
        self, specs: Sequence[JobSpec], *, array: bool = False, claim: KeyClaim | None = None
    ) -> list[Job]:
        """Queue several jobs in one transaction (a bulk submit); ``array``: as one array.

        ``claim``: the request's idempotency key, committed with the array.
        """
        if not array:
            assert claim is None, "a key names one thing made: a job, or an array"
            values = self.queued_values(specs)
            return self.queued(specs, values, self.insert_queued(values))
        now = self._clock.now()
        with self.write_session() as s:
            rows = add_job_rows(s, specs, now, array=True, claim=claim)
        for row in rows:  # the next pass and the events window read them from here
            self._cache.keep(queued_job(row.id, row.spec, now), row.version, row.spec_json)
        return [queued_job(row.id, row.spec, now) for row in rows]

    # The three steps of :meth:`add_jobs`, apart for a store writer process to do the middle.

    def queued_values(
        self, specs: Sequence[JobSpec], *, held: bool = False, reason: str | None = None
    ) -> list[dict[str, Any]]:
        """The new rows' columns of queued jobs submitted now (no I/O)."""
        now = self._clock.now()
        return [queued_values(spec, now, held=held, reason=reason) for spec in specs]

    def insert_queued(
        self,
        values: Sequence[Mapping[str, Any]],
        claims: Sequence[KeyClaim | None] | None = None,
    ) -> list[int]:
        """Insert :meth:`queued_values` and their events in one transaction; the new ids.

        ``claims``: each job's idempotency key or None, committed with it.
        """
        with self.write_session() as s:
            return insert_queued_rows(s, values, claims)

    def queued(
        self, specs: Sequence[JobSpec], values: Sequence[Mapping[str, Any]], ids: Sequence[int]
    ) -> list[Job]:
        """The jobs just inserted, kept in the job cache (the next pass reads them there)."""
        jobs = []
        for spec, value, job_id in zip(specs, values, ids, strict=True):
            job = queued_job(job_id, spec, value["submitted_at"], value["held"], value["reason"])
            self._cache.keep(job, FIRST_VERSION, value["spec"])
            jobs.append(copy_job(job))  # the caller gets its own object, not the cache's
        return jobs

    def task_values(
        self, base: JobSpec, array_id: int, indices: range, reason: str
    ) -> tuple[list[JobSpec], list[dict[str, Any]]]:
        """Tasks of array ``array_id`` held with ``reason`` and their rows' columns (no I/O)."""
        return task_values(base, array_id, indices, self._clock.now(), held=True, reason=reason)

    # A big array, in transactions of its own (:meth:`~jupyter_gpusched.scheduling.actions.
    # JobActions.submit_bulk`): its head, its tasks held while they are written, then all
    # released in one statement -- or, if the submit fails, all cancelled.

    def add_array_head(self, spec: JobSpec, claim: KeyClaim | None = None) -> Job:
        """Queue the first task of a big array, held until :meth:`release_array`.

        ``claim``: the request's key, written with the head: a retry while the array is
        written is told to wait, and one after it was cut off finds the key gone with it.
        """
        now = self._clock.now()
        with self.write_session() as s:
            (row,) = add_job_rows(s, [spec], now, array=True, held=ARRAY_BEING_QUEUED, claim=claim)
        job = queued_job(row.id, row.spec, now, True, ARRAY_BEING_QUEUED)
        self._cache.keep(job, row.version, row.spec_json)
        return queued_job(row.id, row.spec, now, True, ARRAY_BEING_QUEUED)

    def release_array(self, array_id: int, jobs: Sequence[Job], reason: str | None) -> int:
        """Release the held tasks of array ``array_id`` in one statement; how many.

        ``jobs``: the tasks as queued (the job cache keeps them released, unread);
        ``reason``: their waiting reason once released (None: for the next pass to find).
        """
        table = JobRow.__table__
        with self.write_session() as s:
            done = s.execute(
                update(table)
                .where(*_being_queued(table), table.c.array_id == array_id)
                .values(held=False, reason=reason, version=table.c.version + 1)
            )
        first = {job.id: FIRST_VERSION for job in jobs}
        first[array_id] = FIRST_VERSION + 1  # the head's spec was written twice
        for job in jobs:
            self._cache.advance(job.id, first[job.id], held=False, reason=reason)
        return int(done.rowcount or 0)

    def cancel_unfinished_arrays(
        self, why: str, *, array_id: int | None = None, before: datetime | None = None
    ) -> int:
        """Cancel the held tasks of arrays whose submit failed or was cut off; how many.

        ``array_id``: that array's (a submit that failed); else every array whose last task
        was written before ``before``, so that an array another server is still writing is
        left alone. The arrays' idempotency keys go with them: a retry queues it afresh.
        """
        table = JobRow.__table__
        now = self._clock.now()
        with self.write_session() as s:
            if array_id is not None:
                arrays = [array_id]
            else:
                cut = select(table.c.array_id).where(*_being_queued(table))
                cut = cut.group_by(table.c.array_id)
                if before is not None:
                    cut = cut.having(func.max(table.c.submitted_at) < before)
                arrays = [a for (a,) in s.execute(cut) if a is not None]
            if not arrays:
                return 0
            victims = (
                s.execute(
                    select(table.c.id).where(*_being_queued(table), table.c.array_id.in_(arrays))
                )
                .scalars()
                .all()
            )
            s.execute(
                update(table)
                .where(table.c.id.in_(victims))
                .values(
                    state=JobState.CANCELLED.value,
                    held=False,
                    reason=why,
                    finished_at=now,
                    version=table.c.version + 1,
                )
            )
            s.execute(
                delete(IdempotencyRow).where(
                    IdempotencyRow.target == "array", IdempotencyRow.target_id.in_(arrays)
                )
            )
            add_event_rows(
                s,
                [
                    {
                        "at": now,
                        "job_id": job_id,
                        "kind": "state",
                        "from_state": JobState.QUEUED.value,
                        "to_state": JobState.CANCELLED.value,
                        "detail": {"reason": why},
                    }
                    for job_id in victims
                ],
            )
        return len(victims)


def _being_queued(table: Any) -> list[ColumnElement[bool]]:
    """The tasks of arrays still being written: queued, held, with that reason."""
    return [
        table.c.state == JobState.QUEUED.value,
        table.c.held.is_(True),
        table.c.reason == ARRAY_BEING_QUEUED,
    ]
