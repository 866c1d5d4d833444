"""Chunked dataset uploads: `dataset_uploads`, one row per upload not yet completed.

Its parts are files under <artifacts>/uploads/<user id>/<upload id>/; the row holds what was
declared at its start (name, size, checksum, part size) and when it expires.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_uploads"
down_revision = "0015_predictions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dataset_uploads",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("filename", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("part_size", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("label_column", sa.Text(), nullable=True),
        sa.Column("completing", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["owner_id"], ["users.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("owner_id", "name"),
    )
    op.create_index("ix_dataset_uploads_owner_id", "dataset_uploads", ["owner_id"])
    op.create_index("ix_dataset_uploads_expires_at", "dataset_uploads", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_dataset_uploads_expires_at", table_name="dataset_uploads")
    op.drop_index("ix_dataset_uploads_owner_id", table_name="dataset_uploads")
    op.drop_table("dataset_uploads")
