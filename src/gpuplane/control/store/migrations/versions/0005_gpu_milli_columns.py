"""milli-GPU columns spelled gpu_milli, as everywhere else (jobs.milli_gpus, quotas.*_milli_gpus)

Revision ID: 0005
Revises: 0004

Renamed in place (`ALTER TABLE ... RENAME COLUMN`, SQLite 3.25+ and PostgreSQL), never by
batch mode's copy of the table: on SQLite with foreign keys on, dropping the old `jobs` table
would cascade to `allocations` and free every device a running job holds.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# (table, old name, new name)
RENAMES = (
    ("jobs", "milli_gpus", "gpu_milli"),
    ("quotas", "nominal_milli_gpus", "nominal_gpu_milli"),
    ("quotas", "borrowing_limit_milli_gpus", "borrowing_limit_gpu_milli"),
    ("quotas", "lending_limit_milli_gpus", "lending_limit_gpu_milli"),
)


def _rename(backward: bool) -> None:
    for table in ("jobs", "quotas"):
        with op.batch_alter_table(table, schema=None, recreate="never") as batch_op:
            for t, old, new in RENAMES:
                if t == table:
                    a, b = (new, old) if backward else (old, new)
                    batch_op.alter_column(a, new_column_name=b)


def upgrade() -> None:
    _rename(backward=False)


def downgrade() -> None:
    _rename(backward=True)
