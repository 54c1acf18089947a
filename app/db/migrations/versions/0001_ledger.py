"""The usage ledger (minute and hour buckets, flush bookkeeping) and live key limits.

Revision ID: 0001
Revises:
Create Date: issue 22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_COUNTERS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "failed_prompt_tokens",
    "failed_completion_tokens",
)


def _usage(name: str) -> None:
    op.create_table(
        name,
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("bucket", sa.BigInteger, nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("domain", sa.String(128), nullable=False),
        sa.Column("status", sa.Integer, nullable=False),
        *(sa.Column(c, sa.BigInteger, nullable=False, server_default="0") for c in _COUNTERS),
        sa.PrimaryKeyConstraint("id", name=f"pk_{name}"),
    )
    op.create_index(
        f"uq_{name}_dims", name, ["bucket", "key", "model", "domain", "status"], unique=True
    )


def upgrade() -> None:
    _usage("usage_minute")
    _usage("usage_hour")
    op.create_table(
        "ledger_writers",
        sa.Column("writer", sa.String(64), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("writer", name="pk_ledger_writers"),
    )
    op.create_table(
        "key_overrides",
        sa.Column("alias", sa.String(128), nullable=False),
        sa.Column("requests_per_minute", sa.BigInteger, nullable=False),
        sa.Column("tokens_per_minute", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("alias", name="pk_key_overrides"),
    )


def downgrade() -> None:
    for table in ("key_overrides", "ledger_writers", "usage_hour", "usage_minute"):
        op.drop_table(table)
