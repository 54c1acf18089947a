"""Revision 0003 on a ledger that already has rows (SQLite and PostgreSQL): the rows stay,
with no team and no cost counted, and after the upgrade the new columns take part in the
ledger's additive upserts."""

from __future__ import annotations

from sqlalchemy import text

from app.billing.ledger import Ledger, UsageEntry
from app.config.schema import DatabaseConfig, LedgerConfig
from app.db import migrate
from app.db.engine import Database
from app.db.usage import UsageBook, UsageQuery


async def test_ledger_rows_of_0002_survive_the_upgrade_and_count_on(
    database_cfg: DatabaseConfig,
) -> None:
    db = Database(database_cfg)
    await migrate.upgrade(db, "0002")
    async with db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO usage_minute (bucket, key, model, domain, status, requests, "
                "prompt_tokens, completion_tokens) VALUES (1750000020, 'alice', 'm', '-', 200, "
                "2, 30, 10)"
            )
        )
    assert await migrate.upgrade(db) == ("0002", migrate.head())
    ledger = Ledger(UsageBook(db), LedgerConfig(), clock=lambda: 1_750_000_030.0)
    ledger.add(UsageEntry("alice", "m", 5, 5, cost_nanos=None))  # the same bucket row
    await ledger.flush()
    (row,) = await UsageBook(db).report(UsageQuery(group_by=("key", "team")))
    assert (row["team"], row["requests"], row["prompt_tokens"]) == ("-", 3, 35)
    assert (row["unpriced_requests"], row["cost_nanos"]) == (1, 0)
    await db.close()
