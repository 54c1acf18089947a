"""Fixtures of the billing tests: a migrated database on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.config.schema import DatabaseConfig
from app.db import migrate
from app.db.engine import Database


@pytest.fixture
async def db(database_cfg: DatabaseConfig) -> AsyncIterator[Database]:
    database = Database(database_cfg)
    await migrate.prepare(database)
    yield database
    await database.close()
