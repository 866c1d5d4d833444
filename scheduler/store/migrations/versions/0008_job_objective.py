"""A job's objective: what its best metric is the best of, and the step it was measured at;
which of its checkpoints is the objective's best.

`jobs.objective` and `jobs.objective_mode` are the job's resolved objective (dsl/objective.py:
a metric such as val/accuracy, and max or min); `jobs.best_step` the step of `best_metric`.
Jobs stored before had test/accuracy as their best metric: they keep it, with its step found
in their metrics. `checkpoints.best` marks the checkpoint checkpoint.keep_best keeps.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_job_objective"
down_revision = "0007_node_unreachable"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("objective", sa.String(64), nullable=False, server_default="test/accuracy")
        )
        batch_op.add_column(
            sa.Column("objective_mode", sa.String(3), nullable=False, server_default="max")
        )
        batch_op.add_column(sa.Column("best_step", sa.Integer(), nullable=True))
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("best", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.Integer()),
        sa.column("best_metric", sa.Float()),
        sa.column("best_step", sa.Integer()),
    )
    metrics = sa.table(
        "metrics",
        sa.column("job_id", sa.Integer()),
        sa.column("name", sa.String()),
        sa.column("step", sa.Integer()),
        sa.column("value", sa.Float()),
        sa.column("grp", sa.Integer()),
        sa.column("rank", sa.Integer()),
    )
    first_best = (
        sa.select(sa.func.min(metrics.c.step))
        .where(
            metrics.c.job_id == jobs.c.id,
            metrics.c.name == "test/accuracy",
            metrics.c.grp == 0,
            metrics.c.rank == 0,
            metrics.c.value == jobs.c.best_metric,
        )
        .scalar_subquery()
    )
    op.execute(jobs.update().where(jobs.c.best_metric.is_not(None)).values(best_step=first_best))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_column("best")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("best_step")
        batch_op.drop_column("objective_mode")
        batch_op.drop_column("objective")
