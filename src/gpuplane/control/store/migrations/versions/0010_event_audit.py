"""events: who called the API, from where, for which team, with what result (issue 23's trail)

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("team_name", sa.String(63), nullable=True))
        batch_op.add_column(sa.Column("actor", sa.String(255), nullable=True))
        batch_op.add_column(sa.Column("source", sa.String(255), nullable=True))
        batch_op.add_column(sa.Column("status", sa.Integer(), nullable=True))
    op.create_index("ix_events_at", "events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_events_at", table_name="events")
    with op.batch_alter_table("events", schema=None, recreate="never") as batch_op:
        for column in ("status", "source", "actor", "team_name"):
            batch_op.drop_column(column)
