"""deployment_instances.url may be NULL: not known until the instance's cluster says where it
answers (a KServe InferenceService's URL, issue 20)

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployment_instances", schema=None) as batch_op:
        batch_op.alter_column("url", existing_type=sa.String(255), nullable=True)


def downgrade() -> None:
    # an instance whose address is not known yet is forgotten; its job is stopped as a stray
    op.execute("DELETE FROM deployment_instances WHERE url IS NULL")
    with op.batch_alter_table("deployment_instances", schema=None) as batch_op:
        batch_op.alter_column("url", existing_type=sa.String(255), nullable=False)
