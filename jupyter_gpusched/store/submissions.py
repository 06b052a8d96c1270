"""New jobs into the store: a submit, a bulk submit, and the steps a store writer process shares.

A mixin of :class:`~.store.Store`, as the usage, event and node ledgers are: each method is one
transaction through the store's write sessions, and the jobs written are kept in its job cache,
so the next pass reads them without reading their rows back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy.orm import Session

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.models import Job, JobSpec

from .jobcache import JobCache
from .rows import (
    FIRST_VERSION,
    add_job_row,
    add_job_rows,
    insert_queued_rows,
    job_from_row,
    queued_job,
    queued_values,
)


class Submissions:
    """Queueing jobs; the store's write sessions, clock and job cache underneath."""

    _clock: Clock
    _cache: JobCache

    write_session: Callable[..., AbstractContextManager[Session]]  # the store's

    def add_job(self, spec: JobSpec) -> Job:
        """Queue a new job and log ``submitted``."""
        with self.write_session() as s:
            return job_from_row(add_job_row(s, spec, self._clock.now()))

    def add_jobs(self, specs: Sequence[JobSpec], *, array: bool = False) -> list[Job]:
        """Queue several jobs in one transaction (a bulk submit); ``array``: as one array."""
        if not array:
            values = self.queued_values(specs)
            return self.queued(specs, values, self.insert_queued(values))
        now = self._clock.now()
        with self.write_session() as s:
            rows = add_job_rows(s, specs, now, array=True)
        for row in rows:  # the next pass and the events window read them from here
            self._cache.keep(queued_job(row.id, row.spec, now), row.version, row.spec_json)
        return [queued_job(row.id, row.spec, now) for row in rows]

    # The three steps of :meth:`add_jobs`, apart for a store writer process to do the middle.

    def queued_values(self, specs: Sequence[JobSpec]) -> list[dict[str, Any]]:
        """The new rows' columns of queued jobs submitted now (no I/O)."""
        now = self._clock.now()
        return [queued_values(spec, now) for spec in specs]

    def insert_queued(self, values: Sequence[Mapping[str, Any]]) -> list[int]:
        """Insert :meth:`queued_values` and their events in one transaction; the new ids."""
        with self.write_session() as s:
            return insert_queued_rows(s, values)

    def queued(
        self, specs: Sequence[JobSpec], values: Sequence[Mapping[str, Any]], ids: Sequence[int]
    ) -> list[Job]:
        """The jobs just inserted, kept in the job cache (the next pass reads them there)."""
        jobs = []
        for spec, value, job_id in zip(specs, values, ids, strict=True):
            at = value["submitted_at"]  # the caller gets its own object, not the cache's
            self._cache.keep(queued_job(job_id, spec, at), FIRST_VERSION, value["spec"])
            jobs.append(queued_job(job_id, spec, at))
        return jobs
