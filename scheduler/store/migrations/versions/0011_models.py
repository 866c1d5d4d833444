"""The model registry: `model_versions`, one row per version of a user's registered model (a
copy of a job's checkpoint, its objective value, spec, data facts and metrics, its tags)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_models"
down_revision = "0010_plugins"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column(
            "job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True
        ),
        sa.Column("job_name", sa.String(100), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("objective", sa.String(64), nullable=False),
        sa.Column("objective_mode", sa.String(3), nullable=False),
        sa.Column("objective_value", sa.Float(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("owner_id", "name", "version"),
    )
    op.create_index("ix_model_versions_owner_id", "model_versions", ["owner_id"])


def downgrade() -> None:
    op.drop_index("ix_model_versions_owner_id", table_name="model_versions")
    op.drop_table("model_versions")
