"""Initial schema: jobs, their event log, GPU usage stretches and node health.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _when(name: str, nullable: bool) -> sa.Column:
    # Aware UTC on PostgreSQL (timestamptz); naive UTC on SQLite, re-attached by the store.
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("username", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("priority_class", sa.String(length=16), nullable=False),
        _when("submitted_at", nullable=False),
        sa.Column("node", sa.String(length=200), nullable=True),
        sa.Column("held", sa.Boolean(), nullable=False),
        _when("started_at", nullable=True),
        _when("finished_at", nullable=True),
        _when("last_activity_at", nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("placement", sa.JSON(), nullable=True),
        sa.Column("handle", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sqlite_autoincrement=True,
    )
    for column in ("kind", "node", "priority_class", "state", "submitted_at", "username"):
        op.create_index(op.f(f"ix_jobs_{column}"), "jobs", [column])

    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("up", sa.Boolean(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        _when("updated_at", nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nodes")),
    )

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        _when("at", nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_events_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_events_job_id"), "events", ["job_id"])

    op.create_table(
        "usage",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("username", sa.String(length=200), nullable=False),
        sa.Column("gpus", sa.Float(), nullable=False),
        _when("started_at", nullable=False),
        _when("finished_at", nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_usage_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_usage_finished_at"), "usage", ["finished_at"])
    op.create_index(op.f("ix_usage_job_id"), "usage", ["job_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_usage_job_id"), table_name="usage")
    op.drop_index(op.f("ix_usage_finished_at"), table_name="usage")
    op.drop_table("usage")
    op.drop_index(op.f("ix_events_job_id"), table_name="events")
    op.drop_table("events")
    op.drop_table("nodes")
    for column in ("kind", "node", "priority_class", "state", "submitted_at", "username"):
        op.drop_index(op.f(f"ix_jobs_{column}"), table_name="jobs")
    op.drop_table("jobs")
