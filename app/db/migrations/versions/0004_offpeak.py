"""Off-peak (issue 35): the ledger's billing-window dimension.

Revision ID: 0004_offpeak
Revises: 0003
Create Date: issue 35
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_offpeak"
down_revision = "0003"
branch_labels = None
depends_on = None

_OLD_DIMS = ["bucket", "key", "model", "domain", "status", "team"]


def upgrade() -> None:
    for name in ("usage_minute", "usage_hour"):
        op.drop_index(f"uq_{name}_dims", table_name=name)
        with op.batch_alter_table(name) as batch:
            batch.add_column(sa.Column("window", sa.String(32), nullable=False, server_default="-"))
        op.create_index(f"uq_{name}_dims", name, [*_OLD_DIMS, "window"], unique=True)


def downgrade() -> None:
    for name in ("usage_minute", "usage_hour"):
        op.drop_index(f"uq_{name}_dims", table_name=name)
        with op.batch_alter_table(name) as batch:
            batch.drop_column("window")
        op.create_index(f"uq_{name}_dims", name, _OLD_DIMS, unique=True)
