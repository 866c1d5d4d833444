"""A job's compiled net, stored at admission.

`jobs.graph` (JSON: nodes and edges, dsl.compiler.CompiledJob.graph) is what GET
/jobs/{id}/graph serves, so that the job is compiled once, when it is admitted. Jobs stored
before keep it null and are compiled when their graph is asked for.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021_job_graphs"
down_revision = "0020_job_avoided_nodes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("graph", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("graph")
