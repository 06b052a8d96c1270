"""Why queued jobs wait: each pass's reasons written in one transaction, with their events.

A mixin of :class:`~.store.Store`, as the submissions and the ledgers are. The transaction and
what it changed are apart (:meth:`WaitingReasons.write_reasons`,
:meth:`WaitingReasons.reasons_written`) so the store writer process
(:mod:`.writer`) can run the first while the server keeps its job cache current with the second.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import ConflictError
from jupyter_gpusched.core.models import Job, JobState

from .jobcache import JobCache
from .orm import EventRow, JobRow
from .rows import _get_row, add_event_row, add_event_rows, job_from_row

#: A job whose waiting reason was written: (id, its row's version before, the reason).
ReasonChange = tuple[int, int, str | None]
#: The handle key of a job the scheduler could not handle: how often, the last error, when.
FAULT = "fault"


class WaitingReasons:
    """Queued jobs' reasons; the store's write sessions, clock and job cache underneath."""

    _clock: Clock
    _cache: JobCache

    write_session: Callable[..., AbstractContextManager[Session]]  # the store's

    def set_reasons(self, reasons: Mapping[int, str | None]) -> None:
        """Record why queued jobs wait, in one transaction, each with a ``waiting`` event.

        A job no longer queued (started, cancelled meanwhile) or gone keeps what it has. One
        executemany UPDATE (after a bulk submit every new job gets its first reason), which
        bumps each row's version as the ORM would, so every process's job cache sees it.
        """
        self.reasons_written(self.write_reasons(reasons))

    def reasons_written(self, changes: Sequence[ReasonChange]) -> None:
        """Keep what :meth:`write_reasons` changed (perhaps in the store writer process)."""
        for job_id, version, reason in changes:  # the next read need not rebuild these rows
            self._cache.advance(job_id, version, reason=reason)

    def write_reasons(self, reasons: Mapping[int, str | None]) -> list[ReasonChange]:
        """:meth:`set_reasons`' transaction; what it changed, for :meth:`reasons_written`."""
        now = self._clock.now()
        jobs = JobRow.__table__
        with self.write_session(redoable=True) as s:
            queued = jobs.c.state == JobState.QUEUED.value
            found = s.execute(
                select(jobs.c.id, jobs.c.version, jobs.c.reason).where(
                    jobs.c.id.in_(list(reasons)), queued
                )
            )
            changes = [
                {"b_id": job_id, "b_version": version, "b_reason": reasons[job_id]}
                for job_id, version, reason in found
                if reason != reasons[job_id]
            ]
            if not changes:
                return []
            cas = update(jobs).where(
                jobs.c.id == bindparam("b_id"), jobs.c.version == bindparam("b_version")
            )
            done = s.execute(
                cas.values(reason=bindparam("b_reason"), version=jobs.c.version + 1), changes
            )
            sane = s.get_bind().dialect.supports_sane_multi_rowcount
            if sane and done.rowcount != len(changes):  # another server changed one meanwhile
                raise ConflictError("a job changed meanwhile; reload it and try again")
            add_event_rows(
                s,
                [
                    {
                        "at": now,
                        "job_id": change["b_id"],
                        "kind": "waiting",
                        "from_state": None,
                        "to_state": None,
                        "detail": {"fields": {"reason": change["b_reason"]}},
                    }
                    for change in changes
                ],
            )
        return [(c["b_id"], c["b_version"], c["b_reason"]) for c in changes]

    def hold_faulted(self, job_id: int, error: str, reason: Callable[[int], str]) -> Job | None:
        """Hold a queued job the scheduler's pass failed on, counting the failures.

        ``reason(count)`` words the job's reason for its ``count``-th failure. One
        transaction: the job is held, its handle's ``fault`` counts the failure and keeps the
        error, and a ``fault`` event says why. A job no longer queued is left alone (None).
        """
        now = self._clock.now()
        with self.write_session() as s:
            row = _get_row(s, job_id, for_update=True)
            if row.state != JobState.QUEUED.value:
                return None
            before: dict[str, Any] = dict(row.handle.get(FAULT) or {})
            count = int(before.get("count", 0)) + 1
            fault = {"count": count, "error": error, "at": now.isoformat()}
            row.handle = {**row.handle, FAULT: fault}
            row.held = True
            row.reason = reason(count)
            detail = {"reason": row.reason, "count": count}
            add_event_row(s, EventRow(at=now, job_id=job_id, kind="fault", detail=detail))
            return job_from_row(row)
