"""Named tokens may expire; per-user quota overrides (null: the operator's default).

Revoking a token deletes its row, so only `expires_at` is new on `api_tokens` (`label` is the
token's name). `user_quotas` holds what an admin changed for one user; the defaults are
settings (contract/settings.py), so changing them needs no migration.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_tokens_quotas"
down_revision = "0004_restarts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "user_quotas",
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("running_jobs", sa.Integer(), nullable=True),
        sa.Column("slots", sa.Integer(), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=True),
        sa.Column("train_steps", sa.Integer(), nullable=True),
        sa.Column("dataset_bytes", sa.BigInteger(), nullable=True),
        sa.Column("artifact_bytes", sa.BigInteger(), nullable=True),
        sa.Column("submissions_per_minute", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("user_id"),
    )


def downgrade() -> None:
    op.drop_table("user_quotas")
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_column("expires_at")
