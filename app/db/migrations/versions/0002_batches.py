"""The Batch API's files (content in 1 MiB chunks), batches with their leases, and items.

Revision ID: 0002
Revises: 0001
Create Date: issue 22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(512), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_files"),
    )
    op.create_table(
        "file_chunks",
        sa.Column("file_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("file_id", "seq", name="pk_file_chunks"),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_until", sa.Double, nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("id", name="pk_batches"),
    )
    op.create_index("ix_batches_owner_created", "batches", ["owner", "created_at", "id"])
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_table(
        "items",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("idx", sa.Integer, nullable=False),
        sa.Column("custom_id", sa.Text, nullable=False),
        sa.Column("request", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("result", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("batch_id", "idx", name="pk_items"),
    )
    op.create_index("ix_items_batch_state", "items", ["batch_id", "state"])


def downgrade() -> None:
    for table in ("items", "batches", "file_chunks", "files"):
        op.drop_table(table)
