"""Arrays as one record: ``job_arrays``, and each task's index on its job row.

An ``array: N`` was N job rows written at submit; it is now one row whose tasks become jobs as
the scheduler places them (Slurm keeps arrays the same way). ``jobs.array_index`` finds task
``ID_7`` by index; it is filled from the labels of the tasks already stored.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Rows read and updated per round while filling ``array_index``.
_BATCH = 1000


def upgrade() -> None:
    op.create_table(
        "job_arrays",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("username", sa.String(length=200), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("next_index", sa.Integer(), nullable=False),
        sa.Column("pending", sa.Integer(), nullable=False),
        sa.Column("cancelled", sa.JSON(), nullable=False),
        sa.Column("cancelled_rest", sa.Boolean(), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_arrays")),
    )
    op.create_index(op.f("ix_job_arrays_username"), "job_arrays", ["username"])
    op.create_index(op.f("ix_job_arrays_pending"), "job_arrays", ["pending"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("array_index", sa.Integer(), nullable=True))
        batch.create_index(op.f("ix_jobs_array_id_array_index"), ["array_id", "array_index"])
    _fill()


def _fill() -> None:
    """Copy each stored array task's index from its labels."""
    conn = op.get_bind()
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.Integer()),
        sa.column("spec", sa.JSON()),
        sa.column("array_id", sa.Integer()),
        sa.column("array_index", sa.Integer()),
    )
    after = 0
    while True:
        page = sa.select(jobs.c.id, jobs.c.spec).where(
            jobs.c.id > after, jobs.c.array_id.is_not(None)
        )
        rows = conn.execute(page.order_by(jobs.c.id).limit(_BATCH)).all()
        if not rows:
            return
        changes = []
        for job_id, spec in rows:
            index = str((spec.get("labels") or {}).get("array_index", ""))
            if index.isdigit():
                changes.append({"b_id": job_id, "b_index": int(index)})
        if changes:
            conn.execute(
                jobs.update()
                .where(jobs.c.id == sa.bindparam("b_id"))
                .values(array_index=sa.bindparam("b_index")),
                changes,
            )
        after = rows[-1][0]


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index(op.f("ix_jobs_array_id_array_index"))
        batch.drop_column("array_index")
    op.drop_index(op.f("ix_job_arrays_pending"), table_name="job_arrays")
    op.drop_index(op.f("ix_job_arrays_username"), table_name="job_arrays")
    op.drop_table("job_arrays")
