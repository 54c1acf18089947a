"""Spend per agent session: the ledger's `session` dimension (issue 36).

Revision ID: 0005
Revises: 0004
Create Date: issue 36

Other branches add revisions after 0003 too; whoever merges them chains the
`down_revision`s one after the other (this one only adds a column and widens the
unique index, so its place in the chain does not matter).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_OLD_DIMS = ["bucket", "key", "model", "domain", "status", "team"]


def upgrade() -> None:
    for name in ("usage_minute", "usage_hour"):
        op.drop_index(f"uq_{name}_dims", table_name=name)
        with op.batch_alter_table(name) as batch:
            batch.add_column(
                sa.Column("session", sa.String(64), nullable=False, server_default="-")
            )
        op.create_index(f"uq_{name}_dims", name, [*_OLD_DIMS, "session"], unique=True)


def downgrade() -> None:
    # Rows that differ only by session would collide in the narrower index.
    bind = op.get_bind()
    for name in ("usage_minute", "usage_hour"):
        if bind.execute(sa.text(f"SELECT 1 FROM {name} WHERE session <> '-' LIMIT 1")).first():
            raise RuntimeError(
                f"{name} has per-session rows: back the database up, prune the ledger "
                "(tokengate db prune) or delete those rows, then downgrade"
            )

    for name in ("usage_minute", "usage_hour"):
        op.drop_index(f"uq_{name}_dims", table_name=name)
        with op.batch_alter_table(name) as batch:
            batch.drop_column("session")
        op.create_index(f"uq_{name}_dims", name, _OLD_DIMS, unique=True)
