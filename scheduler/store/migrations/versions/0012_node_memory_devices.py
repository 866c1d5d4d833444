"""A node's memory and an allocation's GPUs.

`nodes.memory_mb` is the memory its agent offers its worker processes together (0: an agent
that does not say), whose share per slot is a worker's default limit; `allocations.devices` the
indices of the node's GPUs the process alone uses (null: none).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_node_memory_devices"
down_revision = "0011_models"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("memory_mb", sa.Integer(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("devices", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_column("devices")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("memory_mb")
