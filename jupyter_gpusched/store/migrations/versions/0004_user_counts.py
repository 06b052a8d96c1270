"""Per-user limits: each user's live jobs counted from an index (user, state, kind).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(op.f("ix_jobs_username_state_kind"), "jobs", ["username", "state", "kind"])


def downgrade() -> None:
    op.drop_index(op.f("ix_jobs_username_state_kind"), table_name="jobs")
