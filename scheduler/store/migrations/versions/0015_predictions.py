"""Batch prediction runs: a job's or a registered model's checkpoint scoring a user's dataset on
the cluster, each run's workers the processes of a placed job of its own."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_predictions"
down_revision = "0014_node_plugin_error"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "predictions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("model", sa.String(length=120), nullable=True),
        sa.Column("run_job_id", sa.Integer(), nullable=False),
        sa.Column("dataset", sa.String(length=100), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("workers", sa.Integer(), nullable=False),
        sa.Column("probabilities", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["owner_id"], ["users.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["run_job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_job_id"),
    )
    op.create_index("ix_predictions_owner_id", "predictions", ["owner_id"])
    op.create_index("ix_predictions_job_id", "predictions", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_predictions_job_id", table_name="predictions")
    op.drop_index("ix_predictions_owner_id", table_name="predictions")
    op.drop_table("predictions")
