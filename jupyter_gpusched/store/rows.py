"""Rows <-> models: insert and read job and event rows inside a caller's open session.

The store's methods and the batch features' own transactions (a definition firing, notebook
progress) write through these, so a job row and its event are always written the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    insert,
    text,
    update,
)
from sqlalchemy.orm import Session

from jupyter_gpusched.core.errors import NotFoundError
from jupyter_gpusched.core.models import (
    Event,
    Job,
    JobSpec,
    JobState,
    Placement,
    array_of,
    array_task,
    replaced,
    stored_spec,
)

from .idempotency import KeyClaim, add_keys
from .orm import EventRow, JobRow

#: Key of the PostgreSQL advisory lock held from an event's insert to its commit.
_EVENTS_LOCK_KEY = 0x67707573636865
#: ``version`` of a new job row: where the ORM's counter (``version_id_col``) starts.
FIRST_VERSION = 1
#: Ids per ``IN (...)`` when reading rows: far below every backend's limit on parameters.
IN_CHUNK = 900


def add_job_row(
    s: Session,
    spec: JobSpec,
    now: datetime,
    *,
    detail: Mapping[str, Any] | None = None,
    claim: KeyClaim | None = None,
) -> JobRow:
    """Insert a queued job and its ``submitted`` event in an open session.

    For callers that write more in the same transaction, e.g. a definition's firing.
    ``claim``: the request's idempotency key, written with the job (:mod:`.idempotency`).
    """
    row = JobRow(**queued_values(spec, now))
    s.add(row)
    s.flush()
    add_keys(s, [(claim, "job", row.id)], now)
    event = EventRow(
        at=now,
        job_id=row.id,
        kind="submitted",
        from_state=None,
        to_state=JobState.QUEUED.value,
        detail={"user": spec.user, **(detail or {})},
    )
    add_event_row(s, event)
    return row


def add_job_rows(
    s: Session,
    specs: Sequence[JobSpec],
    now: datetime,
    *,
    array: bool,
    held: str | None = None,
    claim: KeyClaim | None = None,
) -> list[QueuedRow]:
    """Insert queued jobs and their ``submitted`` events in an open session, in few statements.

    With ``array`` each becomes a task of one array (:func:`~jupyter_gpusched.core.models.
    array_task`) whose id is the first job's: that row goes first to learn it, the rest in one
    batch. Core inserts, not ORM objects: building and flushing thousands of those was most of
    a bulk submit. Returns what the job cache keeps of each row (so no caller reads it back).
    ``held``: queue them held, with this reason (the first tasks of a big array).
    ``claim``: the request's idempotency key, written for the array (``array`` only).
    """
    assert claim is None or array, "a key names one thing made: a job, or an array"
    hold = {"held": held is not None, "reason": held}
    if not specs:
        return []
    if array:
        (head,) = _insert_jobs(s, [queued_values(specs[0], now, **hold)])
        specs = [array_task(spec, head, i) for i, spec in enumerate(specs)]
        jobs = JobRow.__table__
        head_json = _spec_json(specs[0])
        # Bumped like every change of a row (as the ORM did here), though no one saw the first.
        s.execute(
            update(jobs)
            .where(jobs.c.id == head)
            .values(spec=head_json, array_id=head, array_index=0, version=jobs.c.version + 1)
        )
        values = [queued_values(spec, now, **hold) for spec in specs[1:]]
        ids = [head, *_insert_jobs(s, values)]
        versions = [FIRST_VERSION + 1] + [FIRST_VERSION] * len(values)
        spec_jsons = [head_json, *(v["spec"] for v in values)]
        add_keys(s, [(claim, "array", head)], now)
        add_event_rows(s, _submitted_events(ids, [(spec.user, now) for spec in specs]))
    else:
        values = [queued_values(spec, now, **hold) for spec in specs]
        ids = insert_queued_rows(s, values)
        versions = [FIRST_VERSION] * len(values)
        spec_jsons = [v["spec"] for v in values]
    return [QueuedRow(*row) for row in zip(ids, versions, specs, spec_jsons, strict=True)]


def insert_queued_rows(
    s: Session,
    values: Sequence[Mapping[str, Any]],
    claims: Sequence[KeyClaim | None] | None = None,
) -> list[int]:
    """Insert queued jobs' rows (:func:`queued_values`) and their ``submitted`` events.

    Their ids, in order. A store writer process does this with the values a server sends it.
    ``claims``: each job's idempotency key (or None), written with it.
    """
    ids = _insert_jobs(s, list(values))
    if claims:
        made = [(claim, "job", job_id) for claim, job_id in zip(claims, ids, strict=True)]
        add_keys(s, made, values[0]["submitted_at"])
    add_event_rows(
        s,
        _submitted_events(ids, [(v["username"], v["submitted_at"]) for v in values]),
    )
    return ids


def _submitted_events(
    ids: Sequence[int], whose: Sequence[tuple[str, datetime]]
) -> list[dict[str, Any]]:
    """The ``submitted`` event of each new job, given its (owner, submit time)."""
    return [
        {
            "at": at,
            "job_id": job_id,
            "kind": "submitted",
            "from_state": None,
            "to_state": JobState.QUEUED.value,
            "detail": {"user": user},
        }
        for job_id, (user, at) in zip(ids, whose, strict=True)
    ]


class QueuedRow(NamedTuple):
    """A job row just inserted: its id and version, its spec and the JSON stored for it."""

    id: int
    version: int
    spec: JobSpec
    spec_json: dict[str, Any]


def _insert_jobs(s: Session, values: list[dict[str, Any]]) -> list[int]:
    """Insert job rows in batched statements; their ids, in the order of ``values``.

    PostgreSQL orders ``RETURNING`` by parameter (SQLAlchemy's sentinel). SQLite cannot, and
    SQLAlchemy would then insert row by row; there the writer holds the database's only write
    lock and ``AUTOINCREMENT`` gives each row a larger id than the one before, so the ids sorted
    are in insertion order.
    """
    if not values:
        return []
    jobs = JobRow.__table__
    if s.get_bind().dialect.name == "sqlite":
        return sorted(s.scalars(insert(jobs).returning(jobs.c.id), values))
    ordered = insert(jobs).returning(jobs.c.id, sort_by_parameter_order=True)
    return list(s.scalars(ordered, values))


def task_values(
    base: JobSpec, array_id: int, indices: range, now: datetime, **hold: Any
) -> tuple[list[JobSpec], list[dict[str, Any]]]:
    """Tasks ``indices`` of array ``array_id`` of copies of ``base``, and their new rows' columns.

    What ``array_task`` and :func:`queued_values` make of each, for a fraction of the cost:
    the spec's JSON is made once and each task's differs only in its labels and environment.
    ``hold``: ``held`` and ``reason``, as :func:`queued_values` takes them.
    """
    base_json = _spec_json(base)
    specs, values = [], []
    for index in indices:
        task = array_task(base, array_id, index)
        specs.append(task)
        spec_json = {**base_json, "labels": dict(task.labels), "env": dict(task.env)}
        values.append(queued_values(task, now, spec_json=spec_json, **hold))
    return specs, values


def queued_values(
    spec: JobSpec,
    now: datetime,
    *,
    held: bool = False,
    reason: str | None = None,
    spec_json: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The columns of a queued job's new row; those left out are NULL (fewer binds per row).

    ``placement`` is given: None in a JSON column is stored as JSON ``null``, as it always was.
    ``held`` and ``reason``: for the tasks of an array still being queued (:mod:`.submissions`);
    ``spec_json``: the spec as stored, when the caller made it already.
    """
    return {
        "version": FIRST_VERSION,
        "state": JobState.QUEUED.value,
        "username": spec.user,
        "kind": spec.kind.value,
        "priority_class": spec.priority_class.value,
        "submitted_at": now,
        "held": held,
        "attempt": 0,
        "spec": _spec_json(spec) if spec_json is None else spec_json,
        "placement": None,
        "handle": {},
        "reason": reason,
        **spec_columns(spec),
    }


def spec_columns(spec: JobSpec) -> dict[str, Any]:
    """The columns copied from a spec, for queries that must not read every spec.

    Always both (every new row names the same columns: one batched statement).
    """
    array_id, index = array_of(spec) or (None, None)
    return {"not_before": spec.not_before, "array_id": array_id, "array_index": index}


def queued_job(
    job_id: int, spec: JobSpec, now: datetime, held: bool = False, reason: str | None = None
) -> Job:
    """The model of a row just inserted, from the spec it was made of (nothing re-validated).

    A copy of one model made once, with the fields that differ replaced: a big array makes
    thousands, and building each afresh was most of the time it held the server's GIL.
    """
    return replaced(
        _QUEUED, id=job_id, spec=spec, submitted_at=now, held=held, reason=reason, handle={}
    )


#: What every new job's model starts from (see :func:`queued_job`).
_QUEUED = Job.model_construct(
    id=0,
    spec=JobSpec(kind="lease"),
    state=JobState.QUEUED,
    held=False,
    submitted_at=datetime(1970, 1, 1, tzinfo=UTC),
    started_at=None,
    finished_at=None,
    last_activity_at=None,
    placement=None,
    exit_code=None,
    reason=None,
    attempt=0,
    handle={},
)


def add_event_row(s: Session, row: EventRow) -> None:
    """Add an event row, last thing before commit.

    On PostgreSQL, ids come from a sequence when inserted, so two transactions could commit
    ids out of order and a follower reading ``after_id`` would skip one. Holding a lock from
    the insert to the commit makes ids commit in order. (SQLite writers are serial anyway.)
    """
    _lock_events(s)
    s.add(row)


def add_event_rows(s: Session, values: Sequence[Mapping[str, Any]]) -> None:
    """Insert event rows, given as column values, in one executemany; last thing before commit.

    Thousands of events at once (a bulk submit, a pass's waiting reasons) cost more as ORM
    objects than the rest of their transaction. Ordered as :func:`add_event_row` orders them.
    """
    if values:
        _lock_events(s)
        s.execute(insert(EventRow.__table__), list(values))


def _lock_events(s: Session) -> None:
    """Take the events lock, held until commit, on PostgreSQL (see :func:`add_event_row`)."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _EVENTS_LOCK_KEY})


def _get_row(s: Session, job_id: int, *, for_update: bool = False) -> JobRow:
    lock = for_update and s.get_bind().dialect.name != "sqlite"
    row = s.get(JobRow, job_id, with_for_update=lock)
    if row is None:
        raise NotFoundError(f"job {job_id} does not exist")
    return row


def _check_fields(method: str, fields: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise TypeError(f"{method}() cannot set {unknown}; it sets {sorted(allowed)}")


def _apply(row: JobRow, fields: Mapping[str, Any]) -> None:
    for key, value in fields.items():
        if key == "placement":
            placement = None if value is None else Placement.model_validate(value)
            row.placement = None if placement is None else placement.model_dump(mode="json")
            row.node = None if placement is None else placement.node
        elif key == "spec":
            spec = stored_spec(value)
            row.spec = _spec_json(spec)
            row.priority_class = spec.priority_class.value
            for column, copied in spec_columns(spec).items():
                setattr(row, column, copied)
        elif key == "handle":
            row.handle = dict(value or {})
        else:
            setattr(row, key, value)


def _gpu_weight(row: JobRow) -> float:
    if row.placement is not None:
        placement = Placement.model_validate(row.placement)
        return len(placement.gpu_indices) * placement.share_per_gpu
    spec = stored_spec(row.spec)
    return spec.gpus * (spec.share_per_gpu or 1.0)


def _spec_json(spec: JobSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json")


def _json_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if hasattr(value, "model_dump"):
            value = value.model_dump(mode="json")
        elif isinstance(value, datetime):
            value = value.isoformat()
        out[key] = value
    return out


def job_from_row(row: JobRow, spec: JobSpec | None = None) -> Job:
    """The job of a row; ``spec``: the row's spec, already validated (see JobCache).

    Built without validating it again, like :func:`queued_job`: every field was checked on its
    way in, and the queue is read on every scheduling pass.
    """
    return Job.model_construct(
        id=row.id,
        spec=spec if spec is not None else stored_spec(row.spec),
        state=JobState(row.state),
        held=row.held,
        submitted_at=row.submitted_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        last_activity_at=row.last_activity_at,
        placement=None if row.placement is None else Placement.model_validate(row.placement),
        exit_code=row.exit_code,
        reason=row.reason,
        attempt=row.attempt,
        handle=dict(row.handle),
    )


def _event(row: EventRow) -> Event:
    return Event(
        id=row.id,
        at=row.at,
        job_id=row.job_id,
        kind=row.kind,
        from_state=None if row.from_state is None else JobState(row.from_state),
        to_state=None if row.to_state is None else JobState(row.to_state),
        detail=dict(row.detail),
    )
