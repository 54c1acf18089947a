"""Off-peak (issue 35): the ledger's billing-window dimension; the audit trail; spend
alerts' deliveries.

Revision ID: 0006
Revises: 0005
Create Date: issue 35
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_OLD_DIMS = ["bucket", "key", "model", "domain", "status", "team", "session"]


def upgrade() -> None:
    for name in ("usage_minute", "usage_hour"):
        op.drop_index(f"uq_{name}_dims", table_name=name)
        with op.batch_alter_table(name) as batch:
            batch.add_column(sa.Column("window", sa.String(32), nullable=False, server_default="-"))
        op.create_index(f"uq_{name}_dims", name, [*_OLD_DIMS, "window"], unique=True)
    op.create_table(
        "audit_log",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("replica", sa.String(64), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(256), nullable=False),
        sa.Column("old_value", sa.Text, nullable=True),
        sa.Column("new_value", sa.Text, nullable=True),
        sa.Column("once", sa.String(256), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("uq_audit_log_once", "audit_log", ["once"], unique=True)
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("webhook", sa.Integer, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_at", sa.Double, nullable=False),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.Column("lease_until", sa.Double, nullable=False, server_default="0"),
        sa.Column("last_status", sa.Integer, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("delivered_at", sa.Double, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_alert_deliveries"),
    )
    op.create_index("ix_alert_deliveries_state_next", "alert_deliveries", ["state", "next_at"])


def downgrade() -> None:
    op.drop_table("alert_deliveries")
    op.drop_table("audit_log")
    for name in ("usage_minute", "usage_hour"):
        op.drop_index(f"uq_{name}_dims", table_name=name)
        with op.batch_alter_table(name) as batch:
            batch.drop_column("window")
        op.create_index(f"uq_{name}_dims", name, _OLD_DIMS, unique=True)
