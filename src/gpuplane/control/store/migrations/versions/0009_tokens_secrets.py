"""api_tokens (keyed hashes of API tokens) and secrets (a team's, encrypted), for issue 23

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("team_name", sa.String(63), nullable=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("revoked_at", sa.Float(), nullable=True),
    )
    op.create_table(
        "secrets",
        sa.Column(
            "team_name",
            sa.String(63),
            sa.ForeignKey("teams.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("ciphertext", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("secrets")
    op.drop_table("api_tokens")
