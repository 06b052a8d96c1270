"""The store: jobs, their audit log, GPU usage and node health, in one SQL database.

The store is the truth: a restarted server rebuilds its view from it. SQLite (a file under the
Jupyter data dir) is the default; any SQLAlchemy URL works, and PostgreSQL is tested, for
several servers sharing one queue. Rows are kept apart from the pydantic models in
:mod:`jupyter_gpusched.core.models`; this module maps one to the other.

Durability and consistency
--------------------------
* Every public write is one short transaction: the row change *and* its event row commit
  together or not at all, so the audit log can be replayed into the job table.
* SQLite runs in WAL mode with ``synchronous=FULL``: a commit returns only once its WAL frames
  are fsynced, so a committed transaction survives a killed process *and* a power cut
  (``NORMAL`` would survive ``kill -9`` but could lose the last commits on power loss; writes
  here are few, so the fsync is cheap insurance). An interrupted transaction never reaches the
  database: its frames lack a commit record and are ignored on the next open. The one
  exception is :meth:`Store.set_reasons`: a waiting reason is the pass's to redo, so it
  commits without its own fsync (atomic still; the next durable commit syncs it too), which
  halved the fsyncs of a submit.
* Writers on SQLite take the write lock up front (``BEGIN IMMEDIATE``): a read-check-write such
  as :meth:`Store.transition` cannot interleave with another writer, in this process or
  another one, and ``busy_timeout`` makes a second writer wait instead of failing.
* On PostgreSQL :meth:`Store.transition` reads the job ``SELECT ... FOR UPDATE``; on every
  backend the ``version`` column is compared-and-swapped on update, so a lost update shows up
  as :class:`~jupyter_gpusched.core.errors.ConflictError` rather than silently.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import (
    and_,
    func,
    or_,
    select,
    text,
    union,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError
from sqlalchemy.sql.elements import ColumnElement

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import ConflictError, InvalidSpecError
from jupyter_gpusched.core.models import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    Job,
    JobKind,
    JobState,
    PriorityClass,
    check_transition,
    stored_spec,
)

from .arrays import Arrays
from .availability import Availability
from .engine import (
    alembic_config,
    make_engine,
    normalize_url,
    private_folder,
    sqlite_path,
    truncate_wal,
)
from .eventlog import EventLog
from .idempotency import IdempotencyKeys
from .jobcache import JobCache
from .leader import check_fence
from .nodes import NodeLedger
from .orm import EventRow, JobArrayRow, JobRow
from .reasons import WaitingReasons
from .rows import (
    IN_CHUNK,
    _apply,
    _check_fields,
    _get_row,
    _json_fields,
    add_event_row,
    job_from_row,
)
from .submissions import Submissions
from .usage import UsageLedger, account_usage

#: Alembic's bookkeeping table; named for us so a shared PostgreSQL database stays readable.
VERSION_TABLE = "gpusched_alembic_version"
#: Key of the PostgreSQL advisory lock that keeps two servers from migrating at once.
_MIGRATE_LOCK_KEY = 0x67707573636864  # "gpuschd"


#: Fields ``transition`` may set beside the state.
_TRANSITION_FIELDS = frozenset(
    {
        "placement",
        "handle",
        "exit_code",
        "started_at",
        "finished_at",
        "attempt",
        "last_activity_at",
        "held",
    }
)
#: Fields ``update_job`` may set; the state itself changes only through ``transition``.
_UPDATE_FIELDS = frozenset(
    {"spec", "held", "handle", "last_activity_at", "reason", "placement", "exit_code", "attempt"}
)
#: How long after an id was the largest every smaller one has surely committed (PostgreSQL),
#: and how often the kept count of all rows is redone (see ``Store._all_rows``).
_SETTLE = timedelta(minutes=5)
_RECOUNT = timedelta(minutes=10)
#: Orders a page of history walks in (an index of theirs, or the table by id).
_WALKED = frozenset({"id", "submitted_at", "finished_at"})


_ORDERS = {
    "id": JobRow.id,
    "submitted_at": JobRow.submitted_at,
    "state": JobRow.state,
    "user": JobRow.username,
    "priority": JobRow.priority_class,
    "started_at": JobRow.started_at,
    "finished_at": JobRow.finished_at,
}


class Store(
    Submissions, Arrays, WaitingReasons, UsageLedger, EventLog, NodeLedger, IdempotencyKeys
):
    """Jobs, events, usage and node rows behind one object; each method is one transaction.

    Parameters
    ----------
    url
        Any SQLAlchemy URL; ``postgresql://`` uses psycopg 3. See :meth:`default_url`.
        ``sqlite://`` (in memory) is one shared connection: for single-threaded tests only.
    clock
        The only source of timestamps.
    echo
        Log every SQL statement (debugging).
    """

    def __init__(self, url: str, *, clock: Clock, echo: bool = False) -> None:
        self.url = normalize_url(url)
        self._clock = clock
        self._engine = make_engine(self.url, echo=echo)
        self.dialect = self._engine.dialect.name
        self.availability = Availability(self.url)
        # A page and its total come from one snapshot on PostgreSQL too.
        reads = (
            self._engine
            if self.dialect != "postgresql"
            else self._engine.execution_options(isolation_level="REPEATABLE READ")
        )
        self._reads = sessionmaker(reads, expire_on_commit=False)
        self._cache = JobCache()
        self._usage_kept = {}  # see UsageLedger
        # See _all_rows: (settled id, rows up to it, when counted); (largest id, seen at).
        self._kept_count: tuple[int, int, datetime] | None = None
        self._id_seen: tuple[int, datetime] | None = None
        # Writers take SQLite's write lock at BEGIN (see the module docstring).
        self._writes = sessionmaker(
            self._engine.execution_options(gpusched_begin="IMMEDIATE"), expire_on_commit=False
        )
        # Writes a later pass redoes if they are lost (SQLite: no fsync of their own).
        self._redoable_writes = sessionmaker(
            self._engine.execution_options(gpusched_begin="IMMEDIATE", gpusched_sync="NORMAL"),
            expire_on_commit=False,
        )

    @staticmethod
    def default_url() -> str:
        """``sqlite:///<jupyter data dir>/gpusched/gpusched.db``; creates the directory (0700)."""
        from jupyter_core.paths import jupyter_data_dir

        folder = Path(jupyter_data_dir()) / "gpusched"
        private_folder(str(folder))
        return f"sqlite:///{folder / 'gpusched.db'}"

    @property
    def clock(self) -> Clock:
        """The clock every timestamp of this store comes from."""
        return self._clock

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (for tests and maintenance tools)."""
        return self._engine

    def migrate(self) -> None:
        """Bring the schema to the newest version; a no-op when it is there already.

        Runs in one transaction, so a failed migration leaves the previous schema; two servers
        starting at once wait for each other (advisory lock / SQLite write lock).
        """
        from alembic import command

        with self.availability.guard(write=True), self._writes.begin() as session:
            conn = session.connection()
            if self.dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATE_LOCK_KEY})
            command.upgrade(alembic_config(conn), "head")

    def trim_wal(self) -> bool:
        """Empty a SQLite store's WAL that readers kept past its limit; whether it was.

        For a periodic task in a worker thread (:func:`.engine.truncate_wal`); it never
        raises: a store that is away is left to the callers that say so.
        """
        path = sqlite_path(self.url)
        if path is None:
            return False
        try:
            return truncate_wal(self._engine, path)
        except (SQLAlchemyError, sqlite3.Error, OSError):
            return False

    def close(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()

    # -- jobs ---------------------------------------------------------------------------------

    def get_job(self, job_id: int) -> Job:
        """The job with this id; :class:`NotFoundError` when there is none."""
        with self.read_session() as s:
            return job_from_row(_get_row(s, job_id))

    def get_jobs(self, job_ids: Iterable[int]) -> dict[int, Job]:
        """The jobs with these ids that exist, by id (one query)."""
        wanted = sorted(set(job_ids))
        if not wanted:
            return {}
        with self.read_session() as s:
            keys = s.execute(select(JobRow.id, JobRow.version).where(JobRow.id.in_(wanted)))
            return self._jobs_of(s, keys.all())

    def list_jobs(
        self,
        *,
        states: Iterable[JobState] | None = None,
        user: str | None = None,
        kind: JobKind | None = None,
        node: str | None = None,
        priority: PriorityClass | None = None,
        held: bool | None = None,
        array_id: int | None = None,
        limit: int | None = 100,
        offset: int = 0,
        order: str = "id",
        shared: bool = False,
    ) -> tuple[list[Job], int]:
        """One page of jobs matching every filter given, and how many match in all.

        ``order`` is a column name (``id``, ``submitted_at``, ``state``, ``user``, ``priority``,
        ``started_at``, ``finished_at``), ``-`` in front for descending; ties go by id.
        ``limit=None`` returns every match. ``array_id``: the tasks of one bulk submit.
        ``shared``: the job cache's own objects, not copies, for a caller that only reads them
        (a scheduling pass reads the whole queue; copying thousands was a third of a pass).
        """
        desc = order.startswith("-")
        column = _ORDERS.get(order.lstrip("-"))
        if column is None:
            raise InvalidSpecError("order", f"must be one of {sorted(_ORDERS)}, '-' for descending")
        if offset < 0 or (limit is not None and limit < 0):
            raise InvalidSpecError("limit", "limit and offset must not be negative")
        conditions: list[ColumnElement[bool]] = []
        page_conditions: list[ColumnElement[bool]] = []  # the page's, where they differ
        if states is not None:
            chosen = {JobState(x) for x in states}
            wanted = sorted(x.value for x in chosen)
            conditions.append(JobRow.state.in_(wanted))
            if order.lstrip("-") in _WALKED and user is None and chosen <= TERMINAL_STATES:
                # A page of history: the state index would hand most of the year to a sort;
                # walking the order's index (or the table by id) stops at the page. (The
                # count keeps the state index: it reads that index only.)
                page_conditions.append(_not_indexed(JobRow.state).in_(wanted))
            else:
                page_conditions.append(conditions[-1])
        if user is not None:
            conditions.append(JobRow.username == user)
        if kind is not None:
            conditions.append(JobRow.kind == JobKind(kind).value)
        if node is not None:
            conditions.append(JobRow.node == node)
        if priority is not None:
            conditions.append(JobRow.priority_class == PriorityClass(priority).value)
        if held is not None:
            conditions.append(JobRow.held == held)
        if array_id is not None:
            conditions.append(JobRow.array_id == array_id)
        page_conditions += conditions[1:] if states is not None else conditions
        query = select(JobRow.id, JobRow.version).where(*page_conditions)
        query = query.order_by(
            column.desc() if desc else column.asc(), JobRow.id.desc() if desc else JobRow.id.asc()
        )
        query = query.offset(offset) if limit is None else query.limit(limit).offset(offset)
        with self.read_session() as s:
            # One snapshot: the rows read next are these. Through Core, not the ORM's execute:
            # columns only, and the ORM's layer was a third of reading a long queue's ids.
            keys = s.connection().execute(query).all()
            if limit is None or len(keys) < limit:  # a page not full says the total itself
                total = offset + len(keys) if keys or not offset else None
            else:
                total = None
            if total is None and not conditions:
                total = self._all_rows(s)
            elif total is None:
                total = s.scalar(select(func.count()).select_from(JobRow).where(*conditions)) or 0
            jobs = self._jobs_of(s, keys, shared=shared)
        return [jobs[i] for i, _ in keys], total

    def _all_rows(self, s: Session) -> int:
        """How many jobs the store holds, without counting a year of them at every read.

        Rows are never deleted, so the count up to a settled id is kept and only the newer
        rows are counted (a range of the primary key). An id is settled once every smaller id
        has surely committed: at once on SQLite (one writer; ids grow), :data:`_SETTLE` after
        it was the largest on PostgreSQL (ids there can commit out of order, never that
        late). The kept count is redone every :data:`_RECOUNT`, a backstop.
        """
        now = self._clock.now()
        settle = timedelta(0) if self.dialect == "sqlite" else _SETTLE
        if self._id_seen is None:
            self._id_seen = (s.scalar(select(func.max(JobRow.id))) or 0, now)
        kept, (seen, seen_at) = self._kept_count, self._id_seen
        if (kept is None or now - kept[2] > _RECOUNT) and now - seen_at >= settle:
            # all rows less those above: a plain count walks the smallest index, while one
            # bounded by id would walk the table itself (every spec of the year)
            count = select(func.count()).select_from(JobRow)
            above = select(func.count()).select_from(JobRow).where(JobRow.id > seen)
            counted = (s.scalar(count) or 0) - (s.scalar(above) or 0)
            kept = self._kept_count = (seen, counted, now)
            self._id_seen = None  # the next candidate is taken at the next read
        base_id, base = (kept[0], kept[1]) if kept is not None else (0, 0)
        newer = select(func.count()).select_from(JobRow).where(JobRow.id > base_id)
        return base + (s.scalar(newer) or 0)

    def live_counts(self, user: str) -> tuple[int, int, int]:
        """``user``'s queued jobs, leases (queued, starting, running) and arrays' pending tasks.

        The pending tasks count as queued jobs, as Slurm counts them. One statement (each
        submit of the lab's service asks): a count over a range of the (user, state, kind)
        index, no row read, the cost following the user's live jobs (bounded by their
        limits), not the queue or the history; and a sum over their arrays.
        """
        live = [JobState.QUEUED.value, *(x.value for x in ACTIVE_STATES)]
        pending = (
            select(func.coalesce(func.sum(JobArrayRow.pending), 0))
            .where(JobArrayRow.username == user, JobArrayRow.pending > 0)
            .scalar_subquery()
        )
        query = select(
            func.count().filter(JobRow.state == JobState.QUEUED.value),
            func.count().filter(JobRow.kind == JobKind.LEASE.value),
            pending,
        ).where(JobRow.username == user, JobRow.state.in_(live))
        with self.read_session() as s:
            queued, leases, tasks = s.connection().execute(query).one()
        return int(queued), int(leases), int(tasks)

    def _jobs_of(self, s: Session, keys: Sequence[Any], *, shared: bool = False) -> dict[int, Job]:
        """The jobs of these (id, version) pairs: from the cache, else read (and kept)."""
        out, missing = self._cache.get_many(keys, shared=shared)
        for i in range(0, len(missing), IN_CHUNK):
            chunk = missing[i : i + IN_CHUNK]
            for row in s.scalars(select(JobRow).where(JobRow.id.in_(chunk))):
                out[row.id] = self._cache.put(row, shared=shared)
        return out

    def queued_for_pass(self, soon: datetime, *, shared: bool = False) -> list[Job]:
        """The queued jobs a full pass weighs, by id: all but those that cannot start soon.

        Left out are jobs whose reason a pass already gave them and that wait for a
        ``not_before`` after ``soon``, or are held: nothing about them changes until their
        time comes (or someone releases them, which wakes a pass that reads them again). So
        one user's thousands of far-future jobs cost the passes of everyone else nothing.
        """
        # Three ranges of indexes (migration 0007), not one scan of every queued row: the
        # unweighed (few), and the not held whose not_before is unset or comes soon.
        queued = JobRow.state == JobState.QUEUED.value
        ready = and_(queued, JobRow.held.is_(False))
        found = union(
            select(JobRow.id, JobRow.version).where(queued, JobRow.reason.is_(None)),
            select(JobRow.id, JobRow.version).where(ready, JobRow.not_before.is_(None)),
            select(JobRow.id, JobRow.version).where(ready, JobRow.not_before <= soon),
        ).subquery()
        with self.read_session() as s:
            by_id = select(found.c.id, found.c.version).order_by(found.c.id)
            keys = s.connection().execute(by_id).all()
            jobs = self._jobs_of(s, keys, shared=shared)
        return [jobs[i] for i, _ in keys]

    def active_and_queued_since(self, after_id: int) -> tuple[list[Job], list[Job]]:
        """The active jobs, and the queued jobs with an id above ``after_id``, by id.

        What a pass woken by submissions reads (:mod:`jupyter_gpusched.scheduling.increments`),
        in one statement: it runs after every group commit. Shared objects: read only.
        """
        active = [x.value for x in ACTIVE_STATES]
        query = select(JobRow.id, JobRow.version, JobRow.state).where(
            or_(
                JobRow.state.in_(active),
                and_(JobRow.state == JobState.QUEUED.value, JobRow.id > after_id),
            )
        )
        with self.read_session() as s:
            keys = s.connection().execute(query.order_by(JobRow.id)).all()
            jobs = self._jobs_of(s, [(i, v) for i, v, _ in keys], shared=True)
        new = [jobs[i] for i, _, state in keys if state == JobState.QUEUED.value]
        return [jobs[i] for i, _, state in keys if state != JobState.QUEUED.value], new

    def jobs_with_earlier_attempts(self, states: Iterable[JobState]) -> list[Job]:
        """Jobs in ``states`` whose handle records earlier attempts (``previous``), by id.

        Few jobs ever have one, so the database finds them (a JSON path): the tracker asks
        every tick, and reading the whole queue for it cost as much as the placing pass.
        """
        wanted = [JobState(x).value for x in states]
        has_previous = JobRow.handle["previous"].as_string().is_not(None)  # NULL when absent
        # Only a requeued job (attempt > 0) has earlier attempts: a range of an index, so the
        # JSON is read for those few and not for every queued row.
        query = select(JobRow.id, JobRow.version).where(
            JobRow.state.in_(wanted), JobRow.attempt > 0, has_previous
        )
        with self.read_session() as s:
            keys = s.execute(query.order_by(JobRow.id)).all()
            found = self._jobs_of(s, keys)
        return [found[i] for i, _ in keys]

    def ended_without(self, flag: str, *, since: datetime) -> list[int]:
        """Ids of jobs that ran and ended after ``since`` whose handle lacks ``flag``.

        For a step every ended job gets once (the end hooks), asked at start-up: a range of
        the ``finished_at`` index, so a year of history is not read to find the few that
        ended while no server ran.
        """
        terminal = [x.value for x in TERMINAL_STATES]
        query = select(JobRow.id).where(
            JobRow.finished_at >= since,
            _not_indexed(JobRow.state).in_(terminal),  # the year's ended jobs: not this index
            JobRow.started_at.is_not(None),
            JobRow.handle[flag].as_string().is_(None),
        )
        with self.read_session() as s:  # not by id: that order would walk the table
            return sorted(s.scalars(query))

    def transition(
        self,
        job_id: int,
        to_state: JobState,
        *,
        reason: str | None = None,
        expect: JobState | None = None,
        **fields: Any,
    ) -> Job:
        """Move a job to ``to_state`` if the state machine allows it, and log the move.

        Atomic: the row is locked, the move checked, ``fields`` applied (any of placement,
        handle, exit_code, started_at, finished_at, attempt, last_activity_at, held) and one
        ``state`` event written, all in one transaction. ``reason`` is stored as the job's
        reason when given. Defaults from the clock: ``started_at`` on reaching running when not
        set yet, ``finished_at`` on reaching a terminal state. Nothing else is implied: pass
        ``placement=None`` (and ``started_at=None``) when requeueing.

        Raises
        ------
        IllegalTransitionError
            The state machine forbids the move; nothing is written.
        ConflictError
            ``expect`` was given and the job is in another state (someone moved it meanwhile).
        NotFoundError
            No such job.
        """
        to_state = JobState(to_state)
        _check_fields("transition", fields, _TRANSITION_FIELDS)
        now = self._clock.now()
        with self.write_session() as s:
            row = _get_row(s, job_id, for_update=True)
            current = JobState(row.state)
            if expect is not None and current is not JobState(expect):
                raise ConflictError(
                    f"job {job_id} is {current.value}, not {JobState(expect).value}: "
                    "it changed meanwhile; reload it and try again"
                )
            check_transition(current, to_state, job_id)
            if to_state is JobState.RUNNING and row.started_at is None:
                fields.setdefault("started_at", now)
            if to_state in TERMINAL_STATES:
                fields.setdefault("finished_at", now)
            _apply(row, fields)
            if reason is not None:
                row.reason = reason
            row.state = to_state.value
            account_usage(s, row, current, to_state, now, fields.get("finished_at"))
            detail: dict[str, Any] = {"reason": reason} if reason is not None else {}
            for key in ("exit_code", "attempt"):
                if key in fields:
                    detail[key] = fields[key]
            if "placement" in fields:
                detail["node"] = row.node
            add_event_row(
                s,
                EventRow(
                    at=now,
                    job_id=job_id,
                    kind="state",
                    from_state=current.value,
                    to_state=to_state.value,
                    detail=detail,
                ),
            )
            job = job_from_row(row)
        if to_state in TERMINAL_STATES:
            self._cache.drop(job_id)  # ended jobs leave memory; the store keeps them
        return job

    def update_job(self, job_id: int, *, event: str | None = "updated", **fields: Any) -> Job:
        """Change fields other than the state (held, spec, handle, last_activity_at, reason...).

        Logs an event of kind ``event`` naming the changed fields; ``event=None`` writes none,
        for frequent bookkeeping such as ``last_activity_at``. A new ``spec`` must keep the
        job's user and kind.
        """
        _check_fields("update_job", fields, _UPDATE_FIELDS)
        now = self._clock.now()
        with self.write_session() as s:
            row = _get_row(s, job_id, for_update=True)
            if "spec" in fields:
                fields["spec"] = spec = stored_spec(fields["spec"])
                if spec.user != row.username or spec.kind.value != row.kind:
                    raise ConflictError(f"job {job_id}: a new spec cannot change its user or kind")
            _apply(row, fields)
            if event is not None:
                add_event_row(
                    s,
                    EventRow(
                        at=now,
                        job_id=job_id,
                        kind=event,
                        from_state=None,
                        to_state=None,
                        detail={"fields": _json_fields(fields)},
                    ),
                )
            return job_from_row(row)

    # -- plumbing -----------------------------------------------------------------------------

    @property
    def _for_update(self) -> bool:
        return self.dialect != "sqlite"

    @contextlib.contextmanager
    def read_session(self) -> Iterator[Session]:
        """A read-only transaction (a consistent snapshot on PostgreSQL)."""
        with self.availability.guard(write=False), self._reads.begin() as s:
            yield s

    @contextlib.contextmanager
    def write_session(self, *, redoable: bool = False) -> Iterator[Session]:
        """A write transaction; on SQLite it holds the write lock from its first statement.

        Features with tables of their own write through this, so their rows commit with the
        job and event rows they add, under the same locking rules. ``redoable``: what it
        writes is redone if lost (a waiting reason), so SQLite need not fsync its commit.
        """
        sessions = self._redoable_writes if redoable else self._writes
        try:
            with self.availability.guard(write=True), sessions.begin() as s:
                check_fence(s, for_update=self._for_update)
                yield s
        except StaleDataError:
            raise ConflictError("the job changed meanwhile; reload it and try again") from None


def _not_indexed(column: Any) -> Any:
    """``column`` as an expression no index serves (``state || ''``).

    For a query whose other index (its order's, a range) finds its rows faster than
    ``column``'s would, which SQLite, without statistics, would take.
    """
    return column.concat("")
