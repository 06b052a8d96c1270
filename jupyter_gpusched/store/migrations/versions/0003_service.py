"""The lab-wide service: API tokens for users without JupyterHub, and the scheduler's leader.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _when(name: str, nullable: bool) -> sa.Column:
    # Aware UTC on PostgreSQL (timestamptz); naive UTC on SQLite, re-attached by the store.
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("username", sa.String(length=200), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=8), nullable=False),
        sa.Column("note", sa.String(length=200), nullable=True),
        _when("created_at", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("digest", name=op.f("uq_api_tokens_digest")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_api_tokens_username"), "api_tokens", ["username"])
    op.create_table(
        "scheduler_leader",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("holder", sa.String(length=300), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        _when("renewed_at", nullable=False),
        _when("expires_at", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scheduler_leader")),
    )


def downgrade() -> None:
    op.drop_table("scheduler_leader")
    op.drop_index(op.f("ix_api_tokens_username"), table_name="api_tokens")
    op.drop_table("api_tokens")
