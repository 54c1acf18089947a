"""The schema's versions on SQLite and PostgreSQL: created at head when empty, refused
when behind, unknown or foreign, and the same as `app/db/tables.py` declares."""

from __future__ import annotations

import asyncio

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, text

from app.config.schema import DatabaseConfig
from app.db import migrate
from app.db.engine import Database
from app.db.tables import metadata


async def test_an_empty_database_is_created_at_head_as_the_tables_declare(
    database_cfg: DatabaseConfig,
) -> None:
    db = Database(database_cfg)
    assert (await migrate.state(db)).empty
    found = await migrate.prepare(db)
    assert found.at_head and found.current == migrate.head()

    def diff(conn: Connection) -> list[object]:
        return list(compare_metadata(MigrationContext.configure(conn), metadata))

    async with db.connect() as conn:
        assert await conn.run_sync(diff) == []  # migrations and tables.py agree
    await db.close()


async def test_a_database_behind_is_refused_until_upgraded(database_cfg: DatabaseConfig) -> None:
    db = Database(database_cfg)
    assert await migrate.upgrade(db, "0001") == (None, "0001")
    with pytest.raises(migrate.SchemaError, match=r"at revision 0001.*`tokengate db upgrade`"):
        await migrate.prepare(db)
    assert await migrate.upgrade(db) == ("0001", migrate.head())
    assert (await migrate.prepare(db)).at_head
    await db.close()


async def test_a_newer_or_foreign_schema_is_refused(database_cfg: DatabaseConfig) -> None:
    db = Database(database_cfg)
    await migrate.prepare(db)
    async with db.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = 'f00d'"))
    with pytest.raises(migrate.SchemaError, match="written by a newer tokengate"):
        await migrate.prepare(db)
    async with db.begin() as conn:
        await conn.execute(text("DROP TABLE alembic_version"))
    with pytest.raises(migrate.SchemaError, match="has tables but no tokengate schema"):
        await migrate.prepare(db)
    await db.close()


async def test_replicas_starting_together_create_the_schema_once(
    database_cfg: DatabaseConfig,
) -> None:
    replicas = [Database(database_cfg) for _ in range(4)]
    states = await asyncio.gather(*(migrate.prepare(db) for db in replicas))
    assert all(s.at_head for s in states)
    for db in replicas:
        await db.close()
