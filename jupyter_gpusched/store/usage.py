"""GPU usage stretches: one opened when a job starts holding GPUs, closed when it lets go.

Fair share and per-day quotas weigh them (:mod:`jupyter_gpusched.core.usage`); every attempt
of a requeued job is a stretch of its own. Written in the job's own transition
(:func:`account_usage`), read by :class:`UsageLedger`, which :class:`~.store.Store` is.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.models import ACTIVE_STATES, JobState
from jupyter_gpusched.core.policy import UsageRecord

from .orm import JobRow, UsageRow
from .rows import IN_CHUNK, _gpu_weight


class UsageLedger:
    """Reads of the usage table; the store's read sessions and clock underneath."""

    _clock: Clock
    # Finished stretches read before, by id: they never change once closed.
    _usage_kept: dict[int, UsageRecord]

    read_session: Callable[[], AbstractContextManager[Session]]  # the store's

    def usage_stretches(self, *, since: datetime) -> dict[int, UsageRecord]:
        """GPU holdings overlapping ``since``..now, by row id, oldest first.

        Each is ``(user, gpus, started_at, finished_at)``: ``gpus`` share-weighted,
        ``finished_at`` None while the job still holds them; every attempt of a requeued job
        is one (a stretch's id never changes).

        Every pass asks, over a fortnight of a busy lab's jobs: a finished stretch never
        changes, so it is read once and kept; each call reads the ids in the window and only
        the rows it has not kept (new ones, and those still open).
        """
        usage = UsageRow.__table__
        in_window = or_(usage.c.finished_at.is_(None), usage.c.finished_at >= since)
        columns = (usage.c.username, usage.c.gpus, usage.c.started_at, usage.c.finished_at)
        kept = self._usage_kept
        with self.read_session() as s:
            ids = s.scalars(select(usage.c.id).where(in_window).order_by(usage.c.id)).all()
            missing = [i for i in ids if i not in kept]
            read: dict[int, UsageRecord] = {}
            for n in range(0, len(missing), IN_CHUNK):
                chunk = missing[n : n + IN_CHUNK]
                for usage_id, *record in s.execute(
                    select(usage.c.id, *columns).where(usage.c.id.in_(chunk))
                ):
                    read[usage_id] = UsageRecord(*record)
        for usage_id, record in read.items():
            if record[3] is not None:
                kept[usage_id] = record
        if len(kept) > 2 * len(ids) + 1000:  # stretches that left the window go
            self._usage_kept = {i: kept[i] for i in ids if i in kept}
        return {i: read.get(i) or kept[i] for i in ids}

    def usage_by_user(self, *, since: datetime) -> dict[str, float]:
        """Share-weighted GPU-seconds per user between ``since`` and now."""
        now = self._clock.now()
        totals: dict[str, float] = {}
        for user, gpus, started, finished in self.usage_stretches(since=since).values():
            seconds = ((finished or now) - max(started, since)).total_seconds()
            totals[user] = totals.get(user, 0.0) + gpus * max(0.0, seconds)
        return totals


def account_usage(
    s: Session,
    row: JobRow,
    current: JobState,
    to_state: JobState,
    now: datetime,
    finished_at: datetime | None,
) -> None:
    """Open a usage stretch when a job starts holding GPUs, close it when it lets go."""
    holds, will_hold = current in ACTIVE_STATES, to_state in ACTIVE_STATES
    if will_hold and not holds:
        s.add(
            UsageRow(
                job_id=row.id,
                username=row.username,
                gpus=_gpu_weight(row),
                started_at=now,
                finished_at=None,
            )
        )
    elif holds and not will_hold:
        s.execute(
            update(UsageRow)
            .where(UsageRow.job_id == row.id, UsageRow.finished_at.is_(None))
            .values(finished_at=finished_at or now)
        )
