"""Plugins: what each node's processes load, and what each job needs.

`nodes.plugins` maps each plugin its agent's processes load to its version, as the agent's
registration says; `jobs.plugins` lists the plugin types a job uses, each {kind, type, plugin,
version} (dsl/plugins.py): placement puts such a job only on nodes with those plugins. Null:
none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_plugins"
down_revision = "0009_token_parents"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("plugins", sa.JSON(), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("plugins", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("plugins")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("plugins")
