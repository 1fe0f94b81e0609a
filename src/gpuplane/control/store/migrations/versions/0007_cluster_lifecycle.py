"""clusters: where each came from (gpuplane.yaml or `cluster add`, with its stored settings),
cordoned and draining, its backend's version, and its health (unreachable since, last sync)

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("source", sa.String(16), sa.text("'config'")),
    ("settings", sa.JSON(), sa.text("'{}'")),
    ("cordoned", sa.Boolean(), sa.false()),
    ("draining", sa.Boolean(), sa.false()),
    ("inventory", sa.String(2000), sa.text("''")),
    ("version", sa.String(63), sa.text("''")),
)


def upgrade() -> None:
    # in place, never by copying the table: a copy of `clusters` on SQLite with foreign keys on
    # would cascade-delete its nodes, devices and the running jobs' allocations (as in 0005)
    with op.batch_alter_table("clusters", schema=None, recreate="never") as batch_op:
        for name, type_, default in _COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=False, server_default=default))
        batch_op.add_column(sa.Column("unreachable", sa.String(2000), nullable=True))
        batch_op.add_column(sa.Column("unreachable_since", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("last_sync_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("clusters", schema=None, recreate="never") as batch_op:
        for name in ("last_sync_at", "unreachable_since", "unreachable"):
            batch_op.drop_column(name)
        for name, _, _ in reversed(_COLUMNS):
            batch_op.drop_column(name)
