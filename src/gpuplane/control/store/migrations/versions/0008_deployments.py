"""deployments, their instances (each one a job) and their events (issue 20)

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("deleting", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "deployment_instances",
        sa.Column("job_id", sa.String(80), primary_key=True),
        sa.Column(
            "deployment",
            sa.String(63),
            sa.ForeignKey("deployments.name", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("version", sa.String(63), nullable=False),
        sa.Column("url", sa.String(255), nullable=False),
        sa.Column("capacity", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("draining_since", sa.Float(), nullable=True),
    )
    op.create_table(
        "deployment_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("deployment", sa.String(63), nullable=False, index=True),
        sa.Column("message", sa.String(2000), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("deployment_events")
    op.drop_table("deployment_instances")
    op.drop_table("deployments")
