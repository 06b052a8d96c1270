"""Recurring job definitions, their firings, and how far notebook logs have been read.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _when(name: str, nullable: bool) -> sa.Column:
    # Aware UTC on PostgreSQL (timestamptz); naive UTC on SQLite, re-attached by the store.
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "job_definitions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("username", sa.String(length=200), nullable=False),
        sa.Column("schedule", sa.String(length=200), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("catch_up", sa.String(length=8), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        _when("next_fire_at", nullable=True),
        _when("last_fired_at", nullable=True),
        sa.Column("last_job_id", sa.Integer(), nullable=True),
        sa.Column("fire_count", sa.Integer(), nullable=False),
        _when("created_at", nullable=False),
        _when("updated_at", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_definitions")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_job_definitions_next_fire_at"), "job_definitions", ["next_fire_at"])
    op.create_index(op.f("ix_job_definitions_username"), "job_definitions", ["username"])

    op.create_table(
        "definition_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("definition_id", sa.Integer(), nullable=False),
        _when("fire_at", nullable=False),
        _when("fired_at", nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("caught_up", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["definition_id"],
            ["job_definitions.id"],
            name=op.f("fk_definition_runs_definition_id_job_definitions"),
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_definition_runs_job_id_jobs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_definition_runs")),
        sa.UniqueConstraint(
            "definition_id", "fire_at", name=op.f("uq_definition_runs_definition_id_fire_at")
        ),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_definition_runs_definition_id"), "definition_runs", ["definition_id"])

    op.create_table(
        "notebook_progress",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("log_offset", sa.Integer(), nullable=False),
        _when("updated_at", nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_notebook_progress_job_id_jobs")
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_notebook_progress")),
    )


def downgrade() -> None:
    op.drop_table("notebook_progress")
    op.drop_index(op.f("ix_definition_runs_definition_id"), table_name="definition_runs")
    op.drop_table("definition_runs")
    op.drop_index(op.f("ix_job_definitions_username"), table_name="job_definitions")
    op.drop_index(op.f("ix_job_definitions_next_fire_at"), table_name="job_definitions")
    op.drop_table("job_definitions")
