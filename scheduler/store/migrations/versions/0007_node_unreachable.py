"""Nodes: the parameter-server Redis servers a node's agent cannot reach.

`nodes.ps_unreachable` is a list of "host:port: error" from the agent's registration
(scheduler/agent/ps_reach.py); no process of a job with server shards is placed on a node that has
any. Null for nodes whose agent reaches them all, or does not check.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_node_unreachable"
down_revision = "0006_sweep_pbt"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ps_unreachable", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("ps_unreachable")
