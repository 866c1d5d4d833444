"""The nodes a job avoids: those its processes failed to start on, or were stuck on.

`jobs.avoided_nodes` (JSON list of node names) is written when the recovery policy places such
a job again, and read by placement (scheduler/placement/plan.py): the job goes to other nodes
while one of them could take it. Jobs stored before avoid none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_job_avoided_nodes"
down_revision = "0019_dataset_inventories"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("avoided_nodes", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("avoided_nodes")
