"""The audit log's reads, and the notes in it that are not job state changes.

A job's state change writes its event in the same transaction (:mod:`.rows`); this is the rest
of what touches the events table. :class:`~.store.Store` is an :class:`EventLog`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.models import Event

from .availability import off_the_loop
from .orm import EventRow, JobRow
from .rows import _event, _get_row, add_event_row

#: The events that are a job's running commentary rather than its audit trail: why it waited
#: at each pass, a notebook's cell progress. Dropped once the job ended long enough ago.
COMMENTARY = ("waiting", "progress")
#: Events deleted per transaction while compacting: short writes, submits go between them.
COMPACT_BATCH = 5000


class EventLog:
    """Reads of the events table and notes added to it; the store's sessions underneath."""

    _clock: Clock
    read_session: Callable[[], AbstractContextManager[Session]]  # the store's
    write_session: Callable[..., AbstractContextManager[Session]]  # the store's

    def list_events(
        self, *, after_id: int = 0, job_id: int | None = None, limit: int = 1000
    ) -> list[Event]:
        """Events with id above ``after_id``, oldest first (one job's when ``job_id`` given)."""
        query = select(EventRow).where(EventRow.id > after_id)
        if job_id is not None:
            query = query.where(EventRow.job_id == job_id)
        with self.read_session() as s:
            return [_event(r) for r in s.scalars(query.order_by(EventRow.id).limit(limit))]

    def last_event_id(self) -> int:
        """Id of the newest event, 0 when none: where a live follower starts."""
        with self.read_session() as s:
            return s.scalar(select(func.max(EventRow.id))) or 0

    def compact_events(
        self,
        ended_before: datetime,
        *,
        ended_after: datetime | None = None,
        batch: int = COMPACT_BATCH,
    ) -> int:
        """Drop the commentary (:data:`COMMENTARY`) of jobs ended before ``ended_before``.

        ``ended_after``: only jobs that ended since (those before were compacted already).

        Their ``submitted``, ``state``, ``kill`` and other events stay: what happened to a job
        is kept, and the table grows by a few rows a job rather than one per pass it waited.
        In batches found through the jobs' ``finished_at`` index; redoable (no fsync of its
        own): a lost batch is done again. How many were deleted.
        """
        ended = select(JobRow.id).where(JobRow.finished_at < ended_before)
        if ended_after is not None:
            ended = ended.where(JobRow.finished_at >= ended_after)
        done = 0
        while True:
            victims = (
                select(EventRow.id)
                .where(EventRow.kind.in_(COMMENTARY), EventRow.job_id.in_(ended))
                .limit(batch)
            )
            with self.write_session(redoable=True) as s:
                ids = list(s.scalars(victims))
                if ids:
                    s.execute(delete(EventRow).where(EventRow.id.in_(ids)))
            done += len(ids)
            if len(ids) < batch:
                return done

    def ended_before(self, when: datetime) -> bool:
        """Whether any job ended before ``when`` (one probe of the ``finished_at`` index)."""
        query = select(JobRow.id).where(JobRow.finished_at < when).limit(1)
        with self.read_session() as s:
            return s.scalar(query) is not None

    def add_event(
        self, kind: str, *, job_id: int | None = None, detail: Mapping[str, Any] | None = None
    ) -> Event:
        """Log a notable action that is not a job state change (node down, policy window...)."""
        with self.write_session() as s:
            if job_id is not None:
                _get_row(s, job_id)
            row = EventRow(
                at=self._clock.now(),
                job_id=job_id,
                kind=kind,
                from_state=None,
                to_state=None,
                detail=dict(detail or {}),
            )
            add_event_row(s, row)
            s.flush()
            return _event(row)


class EventCompaction:
    """The leader's upkeep of the event log: commentary of jobs ended ``keep`` ago goes.

    A tick hook of the scheduler (only the leader runs those), at most every ``every_s``;
    times from its clock. Each run compacts the jobs that ended since the last run's cut and
    one more week of older history, walking back until no older job is left: a start never
    walks the whole history at once.
    """

    #: Older history compacted per run, after a start.
    STEP = timedelta(days=7)

    def __init__(self, store: EventLog, keep: timedelta, *, every_s: float = 3600.0) -> None:
        self.store = store
        self.keep = keep
        self.every_s = every_s
        self._last: datetime | None = None
        self._done_before: datetime | None = None  # compacted up to here since the start
        self._back_to: datetime | None = None  # ... and back to here (None: nothing older)

    async def __call__(self, now: datetime) -> None:
        """Compact now if the last compaction was ``every_s`` ago (or never ran)."""
        if self._last is not None and (now - self._last).total_seconds() < self.every_s:
            return
        self._last = now
        cut = now - self.keep
        if self._done_before is None:
            self._done_before = self._back_to = cut
        await off_the_loop(self.store.compact_events, cut, ended_after=self._done_before)
        self._done_before = cut
        if self._back_to is not None:
            older = self._back_to - self.STEP
            await off_the_loop(self.store.compact_events, self._back_to, ended_after=older)
            self._back_to = older if await off_the_loop(self.store.ended_before, older) else None
