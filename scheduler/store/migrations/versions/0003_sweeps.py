"""Sweeps: a hyperparameter search's row, and each trial job's link to it.

Optuna's own tables (the sampler's history) are not here: they live in a SQLite file or a
PostgreSQL schema of their own (scheduler/sweeps/study.py).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_sweeps"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("spec_yaml", sa.Text(), nullable=False),
        sa.Column("overrides", sa.JSON(), nullable=False),
        sa.Column("base_job", sa.JSON(), nullable=False),
        sa.Column("search", sa.JSON(), nullable=False),
        sa.Column("base_dir", sa.Text(), nullable=True),
        sa.Column("study_name", sa.String(length=100), nullable=False),
        sa.Column("best_trial", sa.Integer(), nullable=True),
        sa.Column("best_value", sa.Float(), nullable=True),
        sa.Column("pareto_trials", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["owner_id"], ["users.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("study_name"),
    )
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sweeps_name"), ["name"], unique=False)
        batch_op.create_index(batch_op.f("ix_sweeps_owner_id"), ["owner_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_sweeps_state"), ["state"], unique=False)

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sweep_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("trial_number", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("pruned_step", sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f("ix_jobs_sweep_id"), ["sweep_id"], unique=False)
        batch_op.create_unique_constraint("uq_jobs_sweep_trial", ["sweep_id", "trial_number"])
        batch_op.create_foreign_key("fk_jobs_sweep_id_sweeps", "sweeps", ["sweep_id"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_constraint("fk_jobs_sweep_id_sweeps", type_="foreignkey")
        batch_op.drop_constraint("uq_jobs_sweep_trial", type_="unique")
        batch_op.drop_index(batch_op.f("ix_jobs_sweep_id"))
        batch_op.drop_column("pruned_step")
        batch_op.drop_column("trial_number")
        batch_op.drop_column("sweep_id")

    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sweeps_state"))
        batch_op.drop_index(batch_op.f("ix_sweeps_owner_id"))
        batch_op.drop_index(batch_op.f("ix_sweeps_name"))

    op.drop_table("sweeps")
