"""A token remembers the token that created it (`api_tokens.parent_id`), so that revoking a
token revokes every token it minted, and theirs. Tokens made before, and those an admin makes
on the server (`trainyard admin`), have none.

Branch `tenants` (issue 28); another branch may add its own 0009: the later of the two takes
the other's revision as its down_revision.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_token_parents"
down_revision = "0008_job_objective"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parent_id", sa.Integer(), nullable=True))
        batch_op.create_index("ix_api_tokens_parent_id", ["parent_id"])
        batch_op.create_foreign_key(
            "fk_api_tokens_parent_id", "api_tokens", ["parent_id"], ["id"], ondelete="CASCADE"
        )


def downgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_constraint("fk_api_tokens_parent_id", type_="foreignkey")
        batch_op.drop_index("ix_api_tokens_parent_id")
        batch_op.drop_column("parent_id")
