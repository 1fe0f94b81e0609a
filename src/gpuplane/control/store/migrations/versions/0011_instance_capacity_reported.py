"""deployment_instances.capacity may be NULL: not reported by its engine yet (issue 20)

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployment_instances", schema=None) as batch_op:
        batch_op.alter_column("capacity", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    op.execute("UPDATE deployment_instances SET capacity = 1 WHERE capacity IS NULL")
    with op.batch_alter_table("deployment_instances", schema=None) as batch_op:
        batch_op.alter_column("capacity", existing_type=sa.Integer(), nullable=False)
