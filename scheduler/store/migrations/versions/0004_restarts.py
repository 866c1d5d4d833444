"""Restarts: each job's attempt (placement) number, restarts counted against
cluster.max_restarts, the restart point its attempt continues from, and why it waits."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_restarts"
down_revision = "0003_sweeps"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("restarts", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("restart_from", sa.Text(), nullable=True))
        batch.add_column(sa.Column("pending_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("pending_reason")
        batch.drop_column("restart_from")
        batch.drop_column("restarts")
        batch.drop_column("attempt")
