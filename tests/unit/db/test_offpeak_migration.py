"""Revision 0006 (off-peak) on a ledger with rows (SQLite and PostgreSQL): the rows stay in
window `-`, and afterwards the window is a dimension of the ledger and its reports; an
old spill file (rows without a window) is still written."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import text

from app.billing.ledger import Ledger, UsageEntry
from app.config.schema import DatabaseConfig, LedgerConfig
from app.db import migrate
from app.db.engine import Database
from app.db.usage import UsageBook, UsageQuery


async def test_rows_before_windows_stay_in_window_dash_and_windows_group_apart(
    database_cfg: DatabaseConfig,
) -> None:
    db = Database(database_cfg)
    await migrate.upgrade(db, "0003")
    async with db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO usage_minute (bucket, key, model, domain, status, team, requests, "
                "prompt_tokens, cost_nanos) VALUES (1750000020, 'alice', 'm', '-', 200, '-', "
                "2, 30, 100)"
            )
        )
    assert await migrate.upgrade(db) == ("0003", migrate.head())
    ledger = Ledger(UsageBook(db), LedgerConfig(), clock=lambda: 1_750_000_030.0)
    ledger.add(UsageEntry("alice", "m", 5, 5, cost_nanos=10))  # the old row: window "-"
    ledger.add(UsageEntry("alice", "m", 7, 1, cost_nanos=3, window="offpeak"))
    ledger.add(UsageEntry("alice", "m", 1, 1, cost_nanos=4, window="offpeak"))
    await ledger.flush()
    rows = await UsageBook(db).report(UsageQuery(group_by=("window",)))
    found = {r["window"]: (r["requests"], r["prompt_tokens"], r["cost_nanos"]) for r in rows}
    assert found == {"-": (3, 35, 110), "offpeak": (2, 8, 7)}
    # the roll-up into hours keeps the window apart too
    assert await UsageBook(db).roll_up(1_750_003_600) == 2
    rows = await UsageBook(db).report(UsageQuery(group_by=("key", "window")))
    assert sorted((r["window"], r["requests"]) for r in rows) == [("-", 3), ("offpeak", 2)]
    await db.close()


async def test_a_spill_file_from_before_windows_is_written_in_window_dash(
    database_cfg: DatabaseConfig, tmp_path: Path
) -> None:
    db = Database(database_cfg)
    await migrate.prepare(db)
    counters = [1, 0, 4, 2, 0, 0, 0, 0, 0, 0, 9]
    doc = {
        "version": 1,
        "writer": "old:1:abcd",
        "flushes": [{"seq": 1, "rows": [[[1750000020, "bob", "m", "-", 200, "-"], counters]]}],
    }
    (tmp_path / "ledger-spill-old-1-abcd.json").write_text(json.dumps(doc))
    ledger = Ledger(UsageBook(db), LedgerConfig(spill_dir=str(tmp_path)))
    assert await ledger.recover() == 1
    (row,) = await UsageBook(db).report(UsageQuery(group_by=("key", "window")))
    assert (row["key"], row["window"], row["cost_nanos"]) == ("bob", "-", 9)
    await db.close()
