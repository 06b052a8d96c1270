"""The audit log's reads, and the notes in it that are not job state changes.

A job's state change writes its event in the same transaction (:mod:`.rows`); this is the rest
of what touches the events table. :class:`~.store.Store` is an :class:`EventLog`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.models import Event

from .orm import EventRow
from .rows import _event, _get_row, add_event_row


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
