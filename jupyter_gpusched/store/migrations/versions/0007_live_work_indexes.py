"""Indexes that keep a pass's reads in the size of the live queue, not of the history.

A full pass reads the queued jobs that may start soon or that no pass has weighed yet, and
the tracker asks every tick for requeued jobs: with only the ``state`` index each read walked
every queued row (and decoded a JSON handle for the second), so a lab's far-future backlog
cost CPU at every tick while nothing changed. And a start looked for ended jobs whose end
hooks did not run through the whole history: ``finished_at`` gets an index.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UNWEIGHED = sa.text("reason IS NULL")


def upgrade() -> None:
    op.create_index(op.f("ix_jobs_state_held_not_before"), "jobs", ["state", "held", "not_before"])
    op.create_index(op.f("ix_jobs_state_attempt"), "jobs", ["state", "attempt"])
    op.create_index(op.f("ix_jobs_finished_at"), "jobs", ["finished_at"])
    op.create_index(
        op.f("ix_jobs_unweighed"),
        "jobs",
        ["state"],
        sqlite_where=_UNWEIGHED,
        postgresql_where=_UNWEIGHED,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_jobs_unweighed"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_finished_at"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_state_attempt"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_state_held_not_before"), table_name="jobs")
