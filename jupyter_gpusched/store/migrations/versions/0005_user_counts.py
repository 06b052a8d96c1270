"""Per-user limits: each user's live jobs counted from an index (user, state, kind).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(op.f("ix_jobs_username_state_kind"), "jobs", ["username", "state", "kind"])


def downgrade() -> None:
    op.drop_index(op.f("ix_jobs_username_state_kind"), table_name="jobs")
