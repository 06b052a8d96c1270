"""Recurring job definitions: a job spec plus a cron schedule in a timezone, kept in the store.

Firing exactly once
-------------------
A definition row carries ``next_fire_at`` (UTC) and a ``version``. Whoever fires it -- any of
several servers sharing one store -- does so in **one transaction** that

1. advances the row by compare-and-swap: ``UPDATE ... SET next_fire_at = <next>, version =
   version + 1 WHERE id = ? AND version = <read> AND NOT paused`` (the first statement, so it
   takes SQLite's write lock; on PostgreSQL the row lock makes a concurrent updater re-check
   the condition and match nothing),
2. inserts the job row and its ``submitted`` event, and
3. inserts a ``definition_runs`` row, unique on ``(definition_id, fire_at)``.

The claim and the job commit together or not at all: a server that loses the race matches no
row and writes nothing; a server that dies mid-way leaves no trace, and the firing is still due
for the next one. The unique run row is a second guard (e.g. against an edit that moves the
schedule back over a time that already fired). There is no lease to expire, so a slow server
cannot fire twice.

Schedules are cron expressions in a timezone (:mod:`.cron`).

Catch-up
--------
When firings were missed (the server was down), ``catch_up="skip"`` drops them and waits for
the next time; ``"once"`` makes one run for the latest missed time. A firing up to
``misfire_grace_s`` late counts as on time either way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import (
    delete,
    func,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jupyter_gpusched.core.api import Definition, DefinitionRun
from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import (
    ForbiddenError,
    GpuSchedError,
    InvalidSpecError,
    NotFoundError,
    UnavailableError,
)
from jupyter_gpusched.core.models import Job, JobSpec, stored_spec
from jupyter_gpusched.core.schedules import cron_words
from jupyter_gpusched.store.idempotency import KeyClaim, add_keys
from jupyter_gpusched.store.orm import DefinitionRow, DefinitionRunRow, EventRow
from jupyter_gpusched.store.rows import add_event_row, add_job_row
from jupyter_gpusched.store.store import Store

from .cron import MAX_MISSED, check_schedule, next_fire_time

log = logging.getLogger(__name__)

CATCH_UP = ("skip", "once")


# ------------------------------------------------------------------------------ the store side


class Definitions:
    """Definitions in the store: create, list, change, delete, and fire the due ones.

    Parameters
    ----------
    store
        The job store; definitions live in its database (migration 0002).
    clock
        Source of ``now`` for timestamps.
    misfire_grace_s
        A firing this late still counts as on time (not as missed).
    admins
        Users who may change anyone's definitions.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock,
        misfire_grace_s: float = 60.0,
        admins: frozenset[str] = frozenset(),
    ) -> None:
        self.store = store
        self.clock = clock
        self.misfire_grace_s = misfire_grace_s
        self.admins = admins

    # -- CRUD -------------------------------------------------------------------------------
    def create(
        self,
        spec: JobSpec,
        *,
        schedule: str,
        timezone: str = "UTC",
        catch_up: str = "skip",
        name: str | None = None,
        paused: bool = False,
        claim: KeyClaim | None = None,
    ) -> Definition:
        """Store a new definition; it first fires at the next matching time after now.

        ``claim``: the request's idempotency key, committed with the definition.
        """
        check_schedule(schedule, timezone)
        _check_catch_up(catch_up)
        if spec.not_before is not None:
            raise InvalidSpecError(
                "not_before", "a recurring job starts at its schedule; leave not_before out"
            )
        now = self.clock.now()
        with self.store.write_session() as s:
            row = DefinitionRow(
                version=1,
                name=name or spec.name,
                username=spec.user,
                schedule=schedule.strip(),
                timezone=timezone,
                catch_up=catch_up,
                paused=paused,
                spec=spec.model_dump(mode="json"),
                next_fire_at=None if paused else next_fire_time(schedule, timezone, now),
                last_fired_at=None,
                last_job_id=None,
                fire_count=0,
                created_at=now,
                updated_at=now,
            )
            s.add(row)
            s.flush()
            add_keys(s, [(claim, "definition", row.id)], now)
            detail = {"definition_id": row.id, "action": "created", "user": spec.user}
            add_event_row(s, _event(now, "definition", detail))
            return _definition(row, [])

    def get(self, definition_id: int, *, runs: int = 20) -> Definition:
        """One definition with its latest ``runs`` firings; :class:`NotFoundError` if absent."""
        with self.store.read_session() as s:
            row = _get(s, definition_id)
            return _definition(row, self._runs(s, [row.id], runs).get(row.id, []))

    def list(
        self, *, user: str | None = None, limit: int | None = 100, offset: int = 0
    ) -> tuple[list[Definition], int]:
        """A page of definitions (oldest first) and the total, optionally one user's."""
        query = select(DefinitionRow)
        count = select(func.count()).select_from(DefinitionRow)
        if user is not None:
            query = query.where(DefinitionRow.username == user)
            count = count.where(DefinitionRow.username == user)
        query = query.order_by(DefinitionRow.id).offset(offset)
        if limit is not None:
            query = query.limit(limit)
        with self.store.read_session() as s:
            rows = list(s.scalars(query))
            runs = self._runs(s, [r.id for r in rows], 5)
            return [_definition(r, runs.get(r.id, [])) for r in rows], s.scalar(count) or 0

    def update(
        self,
        definition_id: int,
        *,
        user: str,
        admin: bool = False,
        paused: bool | None = None,
        schedule: str | None = None,
        timezone: str | None = None,
        catch_up: str | None = None,
        name: str | None = None,
    ) -> Definition:
        """Pause, resume or reschedule; resuming starts from the next time after now."""
        now = self.clock.now()
        with self.store.write_session() as s:
            row = _get(s, definition_id, lock=True)
            self._check_owner(row, user, admin)
            if catch_up is not None:
                _check_catch_up(catch_up)
                row.catch_up = catch_up
            if schedule is not None or timezone is not None:
                check_schedule(schedule or row.schedule, timezone or row.timezone)
                row.schedule = (schedule or row.schedule).strip()
                row.timezone = timezone or row.timezone
            if name is not None:
                row.name = name
            if paused is not None:
                row.paused = paused
            changes_time = paused is not None or schedule is not None or timezone is not None
            if row.paused:
                row.next_fire_at = None
            elif changes_time or row.next_fire_at is None:
                row.next_fire_at = next_fire_time(row.schedule, row.timezone, now)
            row.version += 1
            row.updated_at = now
            action = "paused" if paused else "resumed" if paused is False else "updated"
            add_event_row(
                s,
                _event(
                    now, "definition", {"definition_id": row.id, "action": action, "user": user}
                ),
            )
            return _definition(row, self._runs(s, [row.id], 20).get(row.id, []))

    def delete(self, definition_id: int, *, user: str, admin: bool = False) -> Definition:
        """Remove a definition and its firing records; jobs it made stay."""
        now = self.clock.now()
        with self.store.write_session() as s:
            row = _get(s, definition_id, lock=True)
            self._check_owner(row, user, admin)
            gone = _definition(row, [])
            s.execute(delete(DefinitionRunRow).where(DefinitionRunRow.definition_id == row.id))
            s.delete(row)
            add_event_row(
                s,
                _event(
                    now,
                    "definition",
                    {"definition_id": definition_id, "action": "deleted", "user": user},
                ),
            )
        return gone

    def _check_owner(self, row: DefinitionRow, user: str, admin: bool) -> None:
        if user != row.username and not admin and user not in self.admins:
            raise ForbiddenError(
                f"definition {row.id} belongs to {row.username}; only its "
                "owner or an admin may change it"
            )

    @staticmethod
    def _runs(s: Session, ids: Iterable[int], per: int) -> dict[int, list[DefinitionRun]]:
        out: dict[int, list[DefinitionRun]] = {}
        for def_id in ids:
            rows = s.scalars(
                select(DefinitionRunRow)
                .where(DefinitionRunRow.definition_id == def_id)
                .order_by(DefinitionRunRow.fire_at.desc())
                .limit(per)
            )
            out[def_id] = [
                DefinitionRun(
                    fire_at=r.fire_at, fired_at=r.fired_at, job_id=r.job_id, caught_up=r.caught_up
                )
                for r in rows
            ]
        return out

    def runs(self, definition_id: int) -> list[DefinitionRun]:
        """Every firing of a definition, oldest first."""
        with self.store.read_session() as s:
            rows = s.scalars(
                select(DefinitionRunRow)
                .where(DefinitionRunRow.definition_id == definition_id)
                .order_by(DefinitionRunRow.fire_at)
            )
            return [
                DefinitionRun(
                    fire_at=r.fire_at, fired_at=r.fired_at, job_id=r.job_id, caught_up=r.caught_up
                )
                for r in rows
            ]

    # -- firing -----------------------------------------------------------------------------
    def fire_due(self, now: datetime | None = None) -> list[Job]:
        """Fire every definition due at ``now``; the jobs made (exactly one per firing)."""
        now = now or self.clock.now()
        with self.store.read_session() as s:
            due = list(
                s.execute(
                    select(DefinitionRow.id, DefinitionRow.version)
                    .where(DefinitionRow.paused.is_(False), DefinitionRow.next_fire_at <= now)
                    .order_by(DefinitionRow.next_fire_at, DefinitionRow.id)
                )
            )
        made: list[Job] = []
        for def_id, version in due:
            try:
                job_id = self._fire(def_id, version, now)
            except UnavailableError:
                raise  # the store is away, not this definition broken: it fires when back
            except (GpuSchedError, ValueError):  # e.g. a stored spec no longer validates
                log.exception("gpusched: definition %s could not fire", def_id)
                continue
            if job_id is not None:
                made.append(self.store.get_job(job_id))
        return made

    def _fire(self, def_id: int, version: int, now: datetime) -> int | None:
        """Claim one due definition and make its job, in one transaction; None if not ours."""
        with self.store.read_session() as s:
            row = s.get(DefinitionRow, def_id)
            if row is None or row.version != version or row.next_fire_at is None:
                return None
            snap = (row.schedule, row.timezone, row.catch_up, dict(row.spec), row.next_fire_at)
        schedule, tz_name, catch_up, spec_json, first = snap
        due: list[datetime] = []
        t = first
        while t <= now and len(due) < MAX_MISSED:
            due.append(t)
            t = next_fire_time(schedule, tz_name, t)
        if not due:
            return None
        following = t
        latest = due[-1]
        on_time = (now - latest).total_seconds() <= self.misfire_grace_s
        fire = on_time or catch_up == "once"
        skipped = len(due) - (1 if fire else 0)
        try:
            with self.store.write_session() as s:
                claimed = s.execute(
                    update(DefinitionRow)
                    .where(
                        DefinitionRow.id == def_id,
                        DefinitionRow.version == version,
                        DefinitionRow.paused.is_(False),
                    )
                    .values(
                        version=DefinitionRow.version + 1, next_fire_at=following, updated_at=now
                    )
                    .execution_options(synchronize_session=False)
                )
                if claimed.rowcount != 1:
                    return None  # another server fired it, or it was paused/changed/deleted
                job_id = None
                if fire:
                    job_id = self._add_job(s, def_id, spec_json, latest, now, caught_up=not on_time)
                    s.add(
                        DefinitionRunRow(
                            definition_id=def_id,
                            fire_at=latest,
                            fired_at=now,
                            job_id=job_id,
                            caught_up=not on_time,
                        )
                    )
                    s.execute(
                        update(DefinitionRow)
                        .where(DefinitionRow.id == def_id)
                        .values(
                            last_fired_at=latest,
                            last_job_id=job_id,
                            fire_count=DefinitionRow.fire_count + 1,
                        )
                        .execution_options(synchronize_session=False)
                    )
                if skipped:
                    add_event_row(
                        s,
                        _event(
                            now,
                            "definition",
                            {
                                "definition_id": def_id,
                                "action": "skipped",
                                "missed": skipped,
                                "first_missed": due[0].isoformat(),
                                "catch_up": catch_up,
                            },
                        ),
                    )
                return job_id
        except IntegrityError:
            return None  # that (definition, time) already has its run

    @staticmethod
    def _add_job(
        s: Session,
        def_id: int,
        spec_json: dict[str, Any],
        fire_at: datetime,
        now: datetime,
        *,
        caught_up: bool,
    ) -> int:
        """Queue the firing's job in the claiming transaction."""
        spec = stored_spec(spec_json)
        labels = {**spec.labels, "definition_id": str(def_id), "fire_at": fire_at.isoformat()}
        if caught_up:
            labels["caught_up"] = "true"
        spec = spec.model_copy(update={"labels": labels})
        detail = {"definition_id": def_id, "fire_at": fire_at.isoformat()}
        row = add_job_row(s, spec, now, detail=detail)
        return int(row.id)


def _check_catch_up(value: str) -> None:
    if value not in CATCH_UP:
        raise InvalidSpecError("catch_up", f"{value!r} is not one of 'skip', 'once'")


def _get(s: Session, definition_id: int, *, lock: bool = False) -> DefinitionRow:
    lock = lock and s.get_bind().dialect.name != "sqlite"
    row = s.get(DefinitionRow, definition_id, with_for_update=lock)
    if row is None:
        raise NotFoundError(
            f"definition {definition_id} does not exist; list them with "
            "GET gpusched/api/definitions"
        )
    return row


def _event(now: datetime, kind: str, detail: dict[str, Any]) -> EventRow:
    return EventRow(at=now, job_id=None, kind=kind, from_state=None, to_state=None, detail=detail)


def _definition(row: DefinitionRow, runs: list[DefinitionRun]) -> Definition:
    return Definition(
        id=row.id,
        name=row.name,
        user=row.username,
        schedule=row.schedule,
        schedule_words=cron_words(row.schedule),
        timezone=row.timezone,
        catch_up=row.catch_up,
        paused=row.paused,
        spec=stored_spec(row.spec),
        next_fire_at=row.next_fire_at,
        last_fired_at=row.last_fired_at,
        last_job_id=row.last_job_id,
        fire_count=row.fire_count,
        created_at=row.created_at,
        updated_at=row.updated_at,
        runs=runs,
    )


__all__ = [
    "CATCH_UP",
    "Definition",
    "DefinitionRow",
    "DefinitionRun",
    "DefinitionRunRow",
    "Definitions",
]
