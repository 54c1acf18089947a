"""Stored responses' owners: which key created each response id, and which domain holds it.

Revision ID: 0004
Revises: 0003
Create Date: issue 31
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "response_owners",
        sa.Column("id", sa.String(256), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("domain", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("expires_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_response_owners"),
    )
    op.create_index("ix_response_owners_expires_at", "response_owners", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_response_owners_expires_at", table_name="response_owners")
    op.drop_table("response_owners")
