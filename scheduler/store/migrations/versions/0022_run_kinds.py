"""A job's run kind, and a prediction run's task in its own row.

`jobs.kind` says what a job's processes do (dsl/run_kinds.py): training, or prediction. A
prediction run was a job of framework "predict", its largest shard's rows in `train_steps`,
"predict/rows" in `objective` (and the rows of worker 0/0 as its best metric) and its task
(checkpoint, dataset file and format, the .npz array, batch size) under `topology["predict"]`.
Those runs become jobs of kind prediction with no framework (""), no train_steps (0) and no
objective (""), their task in the columns of their `predictions` row. Other jobs are training
runs. The downgrade writes the old form back.

The names are written out here, as they were when this ran: a migration does not follow the
registry's later changes.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0022_run_kinds"
down_revision = "0021_job_graphs"
branch_labels = None
depends_on = None

OLD_FRAMEWORK = "predict"  # a prediction run's jobs.framework before this revision
OLD_TASK_KEY = "predict"  # its task in jobs.topology
OLD_OBJECTIVE = "predict/rows"
TASK_COLUMNS = {  # the task's key in topology -> its predictions column
    "checkpoint": "checkpoint",
    "dataset": "dataset_file",
    "kind": "dataset_format",
    "key": "sample_key",
    "batch_size": "batch_size",
}

jobs = sa.table(
    "jobs",
    sa.column("id", sa.Integer()),
    sa.column("kind", sa.String()),
    sa.column("framework", sa.String()),
    sa.column("topology", sa.JSON()),
    sa.column("train_steps", sa.Integer()),
    sa.column("objective", sa.String()),
    sa.column("best_metric", sa.Float()),
    sa.column("best_step", sa.Integer()),
)
predictions = sa.table(
    "predictions",
    sa.column("run_job_id", sa.Integer()),
    sa.column("rows", sa.BigInteger()),
    sa.column("workers", sa.Integer()),
    sa.column("probabilities", sa.Boolean()),
    sa.column("checkpoint", sa.Text()),
    sa.column("dataset_file", sa.Text()),
    sa.column("dataset_format", sa.String()),
    sa.column("sample_key", sa.Text()),
    sa.column("batch_size", sa.Integer()),
)


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("kind", sa.String(length=16), nullable=False, server_default="training")
        )
    with op.batch_alter_table("predictions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("checkpoint", sa.Text(), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("dataset_file", sa.Text(), nullable=False, server_default=""))
        batch_op.add_column(
            sa.Column("dataset_format", sa.String(length=8), nullable=False, server_default="")
        )
        batch_op.add_column(sa.Column("sample_key", sa.Text(), nullable=False, server_default=""))
        batch_op.add_column(
            sa.Column("batch_size", sa.Integer(), nullable=False, server_default="1024")
        )
    bind = op.get_bind()
    runs = bind.execute(
        sa.select(jobs.c.id, jobs.c.topology).where(jobs.c.framework == OLD_FRAMEWORK)
    ).all()
    for job_id, topology in runs:
        placed = dict(topology or {})
        task: dict[str, Any] = placed.pop(OLD_TASK_KEY, None) or {}
        placed["framework"] = ""
        bind.execute(
            jobs.update()
            .where(jobs.c.id == job_id)
            .values(
                kind="prediction",
                framework="",
                topology=placed,
                train_steps=0,
                objective="",
                best_metric=None,
                best_step=None,
            )
        )
        moved = {column: task[key] for key, column in TASK_COLUMNS.items() if key in task}
        if moved:
            bind.execute(
                predictions.update().where(predictions.c.run_job_id == job_id).values(**moved)
            )


def downgrade() -> None:
    bind = op.get_bind()
    runs = bind.execute(
        sa.select(
            jobs.c.id,
            jobs.c.topology,
            predictions.c.rows,
            predictions.c.workers,
            predictions.c.probabilities,
            *(predictions.c[column] for column in TASK_COLUMNS.values()),
        )
        .join(predictions, predictions.c.run_job_id == jobs.c.id)
        .where(jobs.c.kind == "prediction")
    ).all()
    for row in runs:
        task = {key: row._mapping[column] for key, column in TASK_COLUMNS.items()}
        task.update(rows=row.rows, probabilities=bool(row.probabilities))
        topology = {**(row.topology or {}), "framework": OLD_FRAMEWORK, OLD_TASK_KEY: task}
        bind.execute(
            jobs.update()
            .where(jobs.c.id == row.id)
            .values(
                framework=OLD_FRAMEWORK,
                topology=topology,
                train_steps=-(-row.rows // row.workers),  # the largest shard's rows
                objective=OLD_OBJECTIVE,
            )
        )
    with op.batch_alter_table("predictions", schema=None) as batch_op:
        for column in TASK_COLUMNS.values():
            batch_op.drop_column(column)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("kind")
