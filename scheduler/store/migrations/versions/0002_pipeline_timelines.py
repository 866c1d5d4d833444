"""pipeline timelines: the latest timeline of each stage of a pipelined job

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 22:30:28.739494
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pipeline_timelines",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("grp", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "grp", "rank"),
    )


def downgrade() -> None:
    op.drop_table("pipeline_timelines")
