"""A node's plugin error: why a plugin failed to load in its agent (dsl/plugins.py).

`nodes.plugin_error` is the agent's registration's `plugin_error`: such a node takes no jobs
and its node card says why. Null: every plugin loaded.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_node_plugin_error"
down_revision = "0013_bounded_queues"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("plugin_error", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("plugin_error")
