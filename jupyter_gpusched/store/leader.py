"""Exactly one scheduler acts on a store: a leader lease with a fencing token.

Every server or service that opens a store competes for one row (``scheduler_leader``): the
holder renews it well inside its time to live; when it lapses (the holder died or lost the
database), another takes it and the row's ``epoch`` grows. The scheduler runs its passes inside
:func:`fenced` with the epoch it holds, and every write transaction it makes checks that epoch
in the same transaction (:func:`check_fence`), so a deposed leader's late writes are refused
with :class:`NotLeaderError` instead of racing the new leader's.

A holder on the same host whose process is gone (``kill -9``, then a restart of the server)
does not make its successor wait out the lease: its pid is checked and the lease is taken at
once. Times come from the injected clock.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from jupyter_gpusched.core.errors import ConflictError

from .orm import LeaderRow

if TYPE_CHECKING:
    from .store import Store

#: The epoch (and holder) the current task writes under; None outside a scheduling pass.
_FENCE: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "gpusched_fence", default=None
)
_ROW_ID = 1


class NotLeaderError(ConflictError):
    """A write of a scheduling pass whose leader lease was taken over by another scheduler."""


@dataclass(frozen=True)
class Leadership:
    """Who leads now, as one :meth:`LeaderLease.hold` saw it."""

    holder: str  # host:pid:nonce of the leader
    epoch: int
    expires_at: datetime
    mine: bool


def new_holder_id() -> str:
    """``host:pid:nonce``: unique per process start, and tells whether the holder is alive."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def fenced(holder: str, epoch: int) -> Iterator[None]:
    """Make every write transaction in this context (and tasks it starts) check the lease."""
    token = _FENCE.set((holder, epoch))
    try:
        yield
    finally:
        _FENCE.reset(token)


def current_fence() -> tuple[str, int] | None:
    """The (holder, epoch) writes in this context are fenced with, None when not fenced."""
    return _FENCE.get()


def check_fence(session: Session, *, for_update: bool) -> None:
    """Refuse the write with :class:`NotLeaderError` when a fenced writer lost the lease.

    Reads the lease row in the writer's own transaction: on PostgreSQL with a share lock, so
    a takeover (which updates the row) waits for this transaction or this one sees it; on
    SQLite the write lock already orders the two.
    """
    fence = _FENCE.get()
    if fence is None:
        return
    stmt = select(LeaderRow).where(LeaderRow.id == _ROW_ID)
    if for_update:
        stmt = stmt.with_for_update(read=True)
    row = session.scalars(stmt).first()
    if row is None or (row.holder, row.epoch) != fence:
        now_holder = "nobody" if row is None else f"{row.holder} (epoch {row.epoch})"
        raise NotLeaderError(
            f"this scheduler (epoch {fence[1]}) is no longer the leader; {now_holder} is"
        )


class LeaderLease:
    """A process's claim on the store's leader row.

    Parameters
    ----------
    store
        The store whose row is competed for (its write sessions and clock are used).
    ttl_s
        How long a lease holds without renewal. Renew every ``ttl_s / 3`` or so.
    holder
        This process's id; default :func:`new_holder_id`.
    """

    def __init__(self, store: Store, *, ttl_s: float = 8.0, holder: str | None = None) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.holder = holder or new_holder_id()

    def hold(self) -> Leadership:
        """Take or renew the lease when it is free, lapsed or ours; say who leads after."""
        now = self.store.clock.now()
        with self.store.write_session() as s:
            stmt = select(LeaderRow).where(LeaderRow.id == _ROW_ID)
            if self.store.dialect != "sqlite":
                stmt = stmt.with_for_update()
            row = s.scalars(stmt).first()
            until = now + timedelta(seconds=self.ttl_s)
            if row is None:
                row = LeaderRow(
                    id=_ROW_ID, holder=self.holder, epoch=1, renewed_at=now, expires_at=until
                )
                s.add(row)
            elif row.holder == self.holder:
                row.renewed_at, row.expires_at = now, until
            elif row.expires_at <= now or _holder_gone(row.holder):
                row.holder, row.epoch = self.holder, row.epoch + 1
                row.renewed_at, row.expires_at = now, until
            return Leadership(row.holder, row.epoch, row.expires_at, row.holder == self.holder)

    def release(self) -> None:
        """Give the lease up now (a clean shutdown), so a standby need not wait it out."""
        now = self.store.clock.now()
        with self.store.write_session() as s:
            row = s.get(LeaderRow, _ROW_ID)
            if row is not None and row.holder == self.holder:
                row.expires_at = now

    def current(self) -> Leadership | None:
        """The lease as stored, without claiming it."""
        with self.store.read_session() as s:
            row = s.get(LeaderRow, _ROW_ID)
            if row is None:
                return None
            return Leadership(row.holder, row.epoch, row.expires_at, row.holder == self.holder)


def _holder_gone(holder: str) -> bool:
    """True when ``holder`` ran on this host and its process no longer lives."""
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False  # this process under another nonce: an earlier scheduler object
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True
    # A killed process can linger as a zombie where nothing reaps it: that is gone too.
    return stat[stat.rindex(")") + 2 :].startswith(("Z", "X"))
