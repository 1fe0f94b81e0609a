"""initial schema: clusters, nodes, devices, teams, quotas, jobs, allocations, events

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "clusters",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("adapter", sa.String(length=32), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=80), nullable=True),
        sa.Column("cluster_name", sa.String(length=63), nullable=True),
        sa.Column("message", sa.String(length=2000), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_events_job_id"), ["job_id"], unique=False)

    op.create_table(
        "scheduler_lock",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    lock = sa.table(
        "scheduler_lock", sa.column("id", sa.Integer()), sa.column("version", sa.Integer())
    )
    op.bulk_insert(lock, [{"id": 1, "version": 0}])
    op.create_table(
        "teams",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("cohort", sa.String(length=63), nullable=True),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster_name", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("cpu_millis", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["cluster_name"], ["clusters.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster_name", "name"),
    )
    op.create_table(
        "quotas",
        sa.Column("team_name", sa.String(length=63), nullable=False),
        sa.Column("flavor", sa.String(length=63), nullable=False),
        sa.Column("nominal_milli_gpus", sa.Integer(), nullable=False),
        sa.Column("nominal_mem_mib", sa.Integer(), nullable=True),
        sa.Column("borrowing_limit_milli_gpus", sa.Integer(), nullable=True),
        sa.Column("borrowing_limit_mem_mib", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["team_name"], ["teams.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("team_name", "flavor"),
    )
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=63), nullable=False),
        sa.Column("mem_mib", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node_id", "index"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=80), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("team_name", sa.String(length=63), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("cluster_name", sa.String(length=63), nullable=True),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("flavor", sa.String(length=63), nullable=True),
        sa.Column("milli_gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_mem_mib", sa.Integer(), nullable=False),
        sa.Column("cpu_millis", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("message", sa.String(length=2000), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(
            ["team_name"],
            ["teams.name"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_name"), ["name"], unique=False)
        batch_op.create_index("ix_jobs_state_priority", ["state", "priority"], unique=False)

    op.create_table(
        "allocations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=80), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("mem_mib", sa.Integer(), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_allocations_device_id"), ["device_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_allocations_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_allocations_job_id"))
        batch_op.drop_index(batch_op.f("ix_allocations_device_id"))

    op.drop_table("allocations")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_state_priority")
        batch_op.drop_index(batch_op.f("ix_jobs_name"))

    op.drop_table("jobs")
    op.drop_table("devices")
    op.drop_table("quotas")
    op.drop_table("nodes")
    op.drop_table("teams")
    op.drop_table("scheduler_lock")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_job_id"))

    op.drop_table("events")
    op.drop_table("clusters")
