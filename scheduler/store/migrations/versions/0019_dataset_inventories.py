"""A dataset's inventory: what its upload's intake read of an .npz's or a .csv's values.

`datasets.inventory` (JSON, contract/inventory.py) is what checking a job reads instead of the
file, so that a job naming a dataset costs the API no read of it. Datasets stored before keep
it null; their files are inventoried, a bounded chunk at a time, when a job is checked.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_dataset_inventories"
down_revision = "0018_effective_documents"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("inventory", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_column("inventory")
