"""Population-based training: each trial job's learned schedule of hyperparameters.

`jobs.pbt_schedule` is a list of {"step", "params", "from_trial"}: the values the trial's
weights were trained with from each step on, following the checkpoints it continued (from_trial
is set where a member took another trial's checkpoint). Null for trials of other sweeps and for
ordinary jobs.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_sweep_pbt"
down_revision = "0005_tokens_quotas"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pbt_schedule", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("pbt_schedule")
