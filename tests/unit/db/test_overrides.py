"""Live overrides are one row per key (`OverrideBook`) or per budget (`BudgetOverrideBook`):
saved again, the row is replaced in place (`Database.put`), on SQLite and PostgreSQL."""

from __future__ import annotations

from app.billing.books import BudgetOverride, BudgetOverrideBook
from app.db.engine import Database
from app.db.overrides import Override, OverrideBook


async def test_a_key_saved_twice_keeps_one_row_with_its_latest_limits(db: Database) -> None:
    book = OverrideBook(db)
    await book.save("alice", 60, 1000)
    await book.save("bob", 5, 50)
    await book.save("alice", 120, 2000)
    assert await book.load() == {"alice": Override(120, 2000), "bob": Override(5, 50)}


async def test_a_budget_saved_twice_keeps_one_row_with_its_latest_limit(db: Database) -> None:
    book = BudgetOverrideBook(db)
    first = BudgetOverride("key", "bob", "day", "tokens", 5000, 4_000_000_000.0)
    await book.save(first)
    await book.save(first._replace(metric="cost", limit=7))  # another budget of bob's
    await book.save(first._replace(limit=9000, until=4_100_000_000.0))
    saved = sorted(await book.load(now=1.0), key=lambda o: o.metric)
    assert saved == [
        first._replace(metric="cost", limit=7),
        first._replace(limit=9000, until=4_100_000_000.0),
    ]
