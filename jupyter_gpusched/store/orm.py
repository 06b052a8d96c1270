"""The database tables, as SQLAlchemy 2 typed ORM classes.

Rows stay apart from the pydantic models in :mod:`jupyter_gpusched.core.models`; :mod:`.store`
maps one to the other. Features with tables of their own (recurring notebook definitions)
declare them on the same :class:`Base`, so one metadata describes the whole schema and the
Alembic drift test covers it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware datetimes in, UTC-aware datetimes out, on every backend.

    SQLite has no time zones: values are stored as naive UTC and UTC is re-attached on read.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Convert to UTC; naive UTC for SQLite. Naive input is refused, not guessed."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"{value!r} has no timezone; the store keeps aware UTC times")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Return UTC-aware datetimes whatever the backend hands back."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base; named constraints so migrations can refer to them on every backend."""

    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    type_annotation_map = {datetime: UtcDateTime(), dict[str, Any]: JSON()}


class JobRow(Base):
    """One job: the spec as JSON plus the columns that queries filter and sort on."""

    __tablename__ = "jobs"
    # Each user's live jobs by state and kind, counted without reading a row (the per-user
    # limits ask at every submit): a range of this index, however long the user's history.
    # The reads of every pass and tick, in the size of the live queue whatever the history
    # (migration 0007): the queued jobs that may start soon, those no pass has weighed yet
    # (few: a partial index), and the requeued ones (attempt > 0).
    __table_args__ = (
        Index("ix_jobs_username_state_kind", "username", "state", "kind"),
        Index("ix_jobs_state_held_not_before", "state", "held", "not_before"),
        Index("ix_jobs_state_attempt", "state", "attempt"),
        Index(
            "ix_jobs_unweighed",
            "state",
            sqlite_where=text("reason IS NULL"),
            postgresql_where=text("reason IS NULL"),
        ),
        Index("ix_jobs_array_id_array_index", "array_id", "array_index"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version: Mapped[int] = mapped_column(Integer)  # compare-and-swap on every update
    state: Mapped[str] = mapped_column(String(16), index=True)
    username: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(16), index=True)
    priority_class: Mapped[str] = mapped_column(String(16), index=True)
    submitted_at: Mapped[datetime] = mapped_column(index=True)
    node: Mapped[str | None] = mapped_column(String(200), index=True)
    held: Mapped[bool] = mapped_column(Boolean)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None] = mapped_column(index=True)  # history, catch-up
    last_activity_at: Mapped[datetime | None]
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]]
    placement: Mapped[dict[str, Any] | None]
    handle: Mapped[dict[str, Any]]
    # Copied from the spec, for the queries that must not read every spec: a pass skips jobs
    # that cannot start soon (a far not_before), an array is found by its id.
    not_before: Mapped[datetime | None] = mapped_column(index=True)
    array_id: Mapped[int | None] = mapped_column(Integer, index=True)
    # A task's index in its array: ``ID_7`` is found without reading the array's other rows.
    array_index: Mapped[int | None] = mapped_column(Integer)

    __mapper_args__ = {"version_id_col": version}


class EventRow(Base):
    """One audit-log entry; ``id`` order is the order of the log."""

    __tablename__ = "events"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str | None] = mapped_column(String(16))
    detail: Mapped[dict[str, Any]]


class UsageRow(Base):
    """One stretch of time a job held GPUs; kept across requeues, for fair share and quotas."""

    __tablename__ = "usage"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    username: Mapped[str] = mapped_column(String(200))
    gpus: Mapped[float] = mapped_column(Float)  # share-weighted: 2 GPUs at 0.5 = 1.0
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None] = mapped_column(index=True)


class NodeRow(Base):
    """Health of one node as the scheduler last saw it."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    up: Mapped[bool] = mapped_column(Boolean)
    failures: Mapped[int] = mapped_column(Integer)
    detail: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime]


class ProgressRow(Base):
    """How far a notebook job's log has been turned into progress events.

    Every server sharing the store may follow the same log; a line becomes an event only in
    the transaction that moves ``log_offset`` past it (compare-and-swap), so each progress
    line is stored once and in order.
    """

    __tablename__ = "notebook_progress"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    log_offset: Mapped[int] = mapped_column(Integer)  # bytes of the log already read
    updated_at: Mapped[datetime]


class DefinitionRow(Base):
    """One recurring definition."""

    __tablename__ = "job_definitions"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version: Mapped[int] = mapped_column(Integer)  # compare-and-swap on every change
    name: Mapped[str | None] = mapped_column(String(200))
    username: Mapped[str] = mapped_column(String(200), index=True)
    schedule: Mapped[str] = mapped_column(String(200))
    timezone: Mapped[str] = mapped_column(String(64))
    catch_up: Mapped[str] = mapped_column(String(8))
    paused: Mapped[bool] = mapped_column(Boolean)
    spec: Mapped[dict[str, Any]]
    next_fire_at: Mapped[datetime | None] = mapped_column(index=True)
    last_fired_at: Mapped[datetime | None]
    last_job_id: Mapped[int | None] = mapped_column(Integer)
    fire_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class DefinitionRunRow(Base):
    """One firing of a definition and the job it made; unique per (definition, time)."""

    __tablename__ = "definition_runs"
    __table_args__ = (
        UniqueConstraint("definition_id", "fire_at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    definition_id: Mapped[int] = mapped_column(ForeignKey("job_definitions.id"), index=True)
    fire_at: Mapped[datetime]
    fired_at: Mapped[datetime]
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    caught_up: Mapped[bool] = mapped_column(Boolean)  # a late run standing for missed ones


class ApiTokenRow(Base):
    """A token the lab-wide service accepts for a user (no JupyterHub); only its digest is kept."""

    __tablename__ = "api_tokens"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    username: Mapped[str] = mapped_column(String(200), index=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # SHA-256 hex of the token
    prefix: Mapped[str] = mapped_column(String(8))  # its first characters, to tell tokens apart
    note: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime]


class LeaderRow(Base):
    """The one scheduler allowed to act on this store, and until when (a single row, id 1).

    ``epoch`` grows with every change of holder: it is the fencing token every write of the
    leader's scheduling pass is checked against, so a deposed leader's writes are refused.
    """

    __tablename__ = "scheduler_leader"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    holder: Mapped[str] = mapped_column(String(300))
    epoch: Mapped[int] = mapped_column(Integer)
    renewed_at: Mapped[datetime]
    expires_at: Mapped[datetime]


class IdempotencyRow(Base):
    """An ``Idempotency-Key`` a caller sent with a create, and what that create made.

    Written in the create's own transaction (:mod:`.idempotency`), so the key exists exactly
    when what it made does; kept ``GpuSchedApp.idempotency_keep_s``, then purged.
    """

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("owner", "key"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(200))  # keys are the caller's own
    key: Mapped[str] = mapped_column(String(255))
    fingerprint: Mapped[str] = mapped_column(String(64))  # SHA-256 hex of route and body
    target: Mapped[str] = mapped_column(String(16))  # what it made: job, array or definition
    target_id: Mapped[int] = mapped_column(Integer)  # its id (an array's: its first job's)
    created_at: Mapped[datetime] = mapped_column(index=True)


class JobArrayRow(Base):
    """An ``array: N`` submit, one row until its tasks start (:mod:`.arrays`).

    Its id is its task 0's job id (written as a job at submit), so arrays and jobs share one
    id space. The scheduler makes tasks ``next_index`` onwards into job rows as it can place
    them, advancing ``next_index`` in the same transaction: no task made twice or lost.
    """

    __tablename__ = "job_arrays"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(Integer)  # bumped by every change
    username: Mapped[str] = mapped_column(String(200), index=True)
    spec: Mapped[dict[str, Any]]  # the tasks' spec, without their array labels
    size: Mapped[int] = mapped_column(Integer)
    next_index: Mapped[int] = mapped_column(Integer)  # the first task not yet made a job
    # Tasks from next_index on, neither made nor cancelled: > 0 while the array has pending
    # tasks (what a pass looks for, and what the queued-job limits count).
    pending: Mapped[int] = mapped_column(Integer, index=True)
    cancelled: Mapped[list[int]] = mapped_column(JSON)  # pending tasks cancelled one by one
    cancelled_rest: Mapped[bool] = mapped_column(Boolean)  # all not yet made: cancelled
    submitted_at: Mapped[datetime]
