"""A job's effective document: the document as submitted with its overrides applied.

`jobs.effective_yaml` is what the job runs and what is shown of it (dsl/overrides.py
effective_document), kept beside `spec_yaml` (the document as submitted) and `overrides`. Jobs
stored before get it from those two; one whose overrides no longer apply keeps it null.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dsl.errors import JobSpecError
from dsl.overrides import effective_document

revision = "0018_effective_documents"
down_revision = "0017_environment_webhooks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("effective_yaml", sa.Text(), nullable=True))
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.Integer()),
        sa.column("spec_yaml", sa.Text()),
        sa.column("overrides", sa.JSON()),
        sa.column("effective_yaml", sa.Text()),
    )
    bind = op.get_bind()
    rows = bind.execute(sa.select(jobs.c.id, jobs.c.spec_yaml, jobs.c.overrides)).all()
    for job_id, spec_yaml, overrides in rows:
        try:
            effective = effective_document(spec_yaml, overrides or {})
        except (JobSpecError, RecursionError):
            continue
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(effective_yaml=effective))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("effective_yaml")
