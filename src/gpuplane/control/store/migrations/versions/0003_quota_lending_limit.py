"""quotas: lending limits (the part of a nominal quota the cohort may borrow)

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lending_limit_milli_gpus", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("lending_limit_mem_mib", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        batch_op.drop_column("lending_limit_mem_mib")
        batch_op.drop_column("lending_limit_milli_gpus")
