"""Columns that let a pass skip what cannot start soon: ``not_before`` and ``array_id``.

A queued job that waits for a far ``not_before`` (or is held) is not weighed by every pass, and
an array is released, found and counted by its id, so one user's flood of far-future jobs costs
the passes and reads of everyone else nothing. Both are copied from each job's spec.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Rows read and updated per round while filling the new columns.
_BATCH = 1000


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("array_id", sa.Integer(), nullable=True))
        batch.create_index(op.f("ix_jobs_not_before"), ["not_before"])
        batch.create_index(op.f("ix_jobs_array_id"), ["array_id"])
    _fill()


def _fill() -> None:
    """Copy each job's ``not_before`` and array id from its spec into the new columns."""
    conn = op.get_bind()
    sqlite = conn.dialect.name == "sqlite"
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.Integer()),
        sa.column("spec", sa.JSON()),
        sa.column("not_before", sa.DateTime(timezone=True)),
        sa.column("array_id", sa.Integer()),
    )
    after = 0
    while True:
        page = sa.select(jobs.c.id, jobs.c.spec).where(jobs.c.id > after).order_by(jobs.c.id)
        rows = conn.execute(page.limit(_BATCH)).all()
        if not rows:
            return
        changes = []
        for job_id, spec in rows:
            not_before = _when(spec.get("not_before"), sqlite)
            array_id = str((spec.get("labels") or {}).get("array_id", ""))
            if not_before is not None or array_id.isdigit():
                changes.append(
                    {
                        "b_id": job_id,
                        "b_not_before": not_before,
                        "b_array_id": int(array_id) if array_id.isdigit() else None,
                    }
                )
        if changes:
            fill = sa.update(jobs).where(jobs.c.id == sa.bindparam("b_id"))
            columns = {"not_before": "b_not_before", "array_id": "b_array_id"}
            fill = fill.values({k: sa.bindparam(v) for k, v in columns.items()})
            conn.execute(fill, changes)
        after = rows[-1][0]


def _when(text: object, sqlite: bool) -> datetime | None:
    """A stored ISO time as the column keeps it (naive UTC on SQLite), None if absent or bad."""
    if not isinstance(text, str):
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    if at.tzinfo is None:
        return None
    try:
        at = at.astimezone(UTC)
    except OverflowError:
        return None
    return at.replace(tzinfo=None) if sqlite else at


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index(op.f("ix_jobs_array_id"))
        batch.drop_index(op.f("ix_jobs_not_before"))
        batch.drop_column("array_id")
        batch.drop_column("not_before")
