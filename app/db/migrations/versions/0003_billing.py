"""Cost control: the ledger's team dimension and cost counters, budget spend, budget overrides.

Revision ID: 0003
Revises: 0002
Create Date: issue 24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_NEW_COUNTERS = ("cache_write_tokens", "estimated_requests", "unpriced_requests", "cost_nanos")
_OLD_DIMS = ["bucket", "key", "model", "domain", "status"]


def upgrade() -> None:
    for name in ("usage_minute", "usage_hour"):
        op.drop_index(f"uq_{name}_dims", table_name=name)
        with op.batch_alter_table(name) as batch:
            batch.add_column(sa.Column("team", sa.String(128), nullable=False, server_default="-"))
            for counter in _NEW_COUNTERS:
                batch.add_column(
                    sa.Column(counter, sa.BigInteger, nullable=False, server_default="0")
                )
        op.create_index(f"uq_{name}_dims", name, [*_OLD_DIMS, "team"], unique=True)
    op.create_table(
        "budget_spend",
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("period", sa.String(32), nullable=False),
        sa.Column("cost_nanos", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("scope", "owner", "period", name="pk_budget_spend"),
    )
    op.create_table(
        "budget_overrides",
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("period", sa.String(8), nullable=False),
        sa.Column("metric", sa.String(8), nullable=False),
        sa.Column("limit_value", sa.BigInteger, nullable=False),
        sa.Column("until", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("scope", "owner", "period", "metric", name="pk_budget_overrides"),
    )


def downgrade() -> None:
    op.drop_table("budget_overrides")
    op.drop_table("budget_spend")
    for name in ("usage_minute", "usage_hour"):
        op.drop_index(f"uq_{name}_dims", table_name=name)
        with op.batch_alter_table(name) as batch:
            for column in ("team", *_NEW_COUNTERS):
                batch.drop_column(column)
        op.create_index(f"uq_{name}_dims", name, _OLD_DIMS, unique=True)
