"""Quotas that bound what one user queues and checks: `validations_per_minute` (dry runs, an
allowance apart from submissions), `queued_jobs` (jobs waiting at once) and `sweep_trials` (a
sweep's largest max_trials); null: the operator's default."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_bounded_queues"
down_revision = "0012_node_memory_devices"
branch_labels = None
depends_on = None

COLUMNS = ("validations_per_minute", "queued_jobs", "sweep_trials")


def upgrade() -> None:
    with op.batch_alter_table("user_quotas", schema=None) as batch_op:
        for name in COLUMNS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("user_quotas", schema=None) as batch_op:
        for name in COLUMNS:
            batch_op.drop_column(name)
