"""Idempotency keys in the store: written with what they create, read back for a retry.

A client that saw no answer to a create (its connection broke, the server was killed) sends the
same request again with the same ``Idempotency-Key``. The key's row is inserted in the very
transaction that creates the job, array or definition (:func:`add_keys`, called from
:mod:`.rows`, :mod:`.submissions` and the definitions' create): either both committed or
neither did, so no moment exists at which the job is there and its key is not -- a ``kill -9``
anywhere leaves a retry either replayed or done afresh, never done twice.

Keys are scoped per owner (a unique index on (owner, key)): two users' keys never meet. The
leader purges keys older than the keep time in small batches (:meth:`IdempotencyKeys.purge_keys`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import KeyTakenError

from .availability import off_the_loop
from .orm import IdempotencyRow

#: Rows a purge deletes per transaction (the write lock is held that long at most).
PURGE_BATCH = 1000


@dataclass(frozen=True)
class KeyClaim:
    """A create's key, as the server passes it down to the transaction that writes the create."""

    owner: str  # who sent it: keys are per caller
    key: str  # the Idempotency-Key header's value
    fingerprint: str  # SHA-256 hex of the route and the request body


@dataclass(frozen=True)
class KeyRecord:
    """A stored key: what its first request was and what it made."""

    fingerprint: str
    target: str  # "job", "array" or "definition"
    target_id: int
    created_at: datetime


def add_keys(s: Session, made: Sequence[tuple[KeyClaim | None, str, int]], now: datetime) -> None:
    """Insert the keys of what ``s`` creates: (claim, target, target id); None claims skipped.

    Call it before the transaction's event rows (which take the events lock until commit on
    PostgreSQL): a concurrent insert of the same key waits here for the other to commit.
    Raises :class:`KeyTakenError` if any key is there already; the caller's transaction,
    and so its create, is rolled back.
    """
    rows = [
        {
            "owner": claim.owner,
            "key": claim.key,
            "fingerprint": claim.fingerprint,
            "target": target,
            "target_id": target_id,
            "created_at": now,
        }
        for claim, target, target_id in made
        if claim is not None
    ]
    if not rows:
        return
    dialect = postgresql if s.get_bind().dialect.name == "postgresql" else sqlite
    table = IdempotencyRow.__table__
    statement = dialect.insert(table).values(rows).on_conflict_do_nothing()
    # The rows inserted, counted from RETURNING: psycopg reports no rowcount for this insert.
    inserted = s.execute(statement.returning(table.c.id)).all()
    if len(inserted) != len(rows):
        raise KeyTakenError(
            "this Idempotency-Key was used by another request that finished meanwhile"
        )


class IdempotencyKeys:
    """Reading and purging keys; a mixin of :class:`~.store.Store`, whose sessions it uses."""

    _clock: Clock
    read_session: Callable[[], AbstractContextManager[Session]]  # the store's
    write_session: Callable[..., AbstractContextManager[Session]]  # the store's

    def find_key(self, owner: str, key: str) -> KeyRecord | None:
        """``owner``'s key ``key``, or None (never sent, or purged)."""
        query = select(
            IdempotencyRow.fingerprint,
            IdempotencyRow.target,
            IdempotencyRow.target_id,
            IdempotencyRow.created_at,
        ).where(IdempotencyRow.owner == owner, IdempotencyRow.key == key)
        with self.read_session() as s:
            row = s.execute(query).first()
        return None if row is None else KeyRecord(*row)

    def forget_key(self, owner: str, key: str, *, before: datetime) -> None:
        """Delete ``owner``'s key ``key`` if it was made before ``before`` (kept long enough)."""
        with self.write_session(redoable=True) as s:
            s.execute(
                delete(IdempotencyRow).where(
                    IdempotencyRow.owner == owner,
                    IdempotencyRow.key == key,
                    IdempotencyRow.created_at < before,
                )
            )

    def purge_keys(self, before: datetime, *, batch: int = PURGE_BATCH) -> int:
        """Delete the keys made before ``before``, ``batch`` a transaction; how many.

        Oldest first by id, through the created_at index: each batch is a short write, so
        submits go between them. Redoable (no fsync of its own): a lost purge is done again.
        """
        table = IdempotencyRow.__table__
        done = 0
        while True:
            oldest = (
                select(table.c.id)
                .where(table.c.created_at < before)
                .order_by(table.c.id)
                .limit(batch)
            )
            with self.write_session(redoable=True) as s:
                count = s.execute(delete(table).where(table.c.id.in_(oldest))).rowcount or 0
            done += count
            if count < batch:
                return done


class KeyPurge:
    """The leader's upkeep of keys: those past the keep time go, every ``every_s`` at most.

    A tick hook of the scheduler (only the leader runs those); times from its clock.
    """

    def __init__(self, store: IdempotencyKeys, keep_s: float, *, every_s: float = 600.0) -> None:
        self.store = store
        self.keep_s = keep_s
        self.every_s = every_s
        self._last: datetime | None = None

    async def __call__(self, now: datetime) -> None:
        """Purge now if the last purge was ``every_s`` ago (or never ran)."""
        if self._last is not None and (now - self._last).total_seconds() < self.every_s:
            return
        self._last = now
        await off_the_loop(self.store.purge_keys, now - timedelta(seconds=self.keep_s))
