"""Each job's worker environments (what they trained with), and webhooks with their outbox.

`job_environments`: one row per worker process (group, rank) of a job, its newest report
(contract.stream.EnvironmentRecord). `webhooks`: a user's URLs told of job.finished, job.failed
and sweep.finished, each with its secret and last delivery's status; `webhook_deliveries`: the
events waiting to be sent by the scheduler.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_environment_webhooks"
down_revision = "0016_uploads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_environments",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("grp", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("facts", sa.JSON(), nullable=False),
        sa.Column("packages", sa.JSON(), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "grp", "rank"),
    )
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret", sa.String(length=100), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_status", sa.Text(), nullable=True),
        sa.Column("last_event", sa.String(length=32), nullable=True),
        sa.Column("last_delivery_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["owner_id"], ["users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhooks_owner_id", "webhooks", ["owner_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("webhook_id", sa.Integer(), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["webhook_id"], ["webhooks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhook_deliveries_webhook_id", "webhook_deliveries", ["webhook_id"])
    op.create_index("ix_webhook_deliveries_due_at", "webhook_deliveries", ["due_at"])


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhooks_owner_id", table_name="webhooks")
    op.drop_table("webhooks")
    op.drop_table("job_environments")
