"""The durable ledger on SQLite and on a real PostgreSQL: buckets, flushes that survive
failures (and lost acknowledgements), retention."""

from __future__ import annotations

import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from app.billing.ledger import Ledger, UsageEntry
from app.config.schema import DatabaseConfig, LedgerConfig
from app.db import migrate
from app.db.engine import Database, DatabaseUnavailable
from app.db.tables import COUNTERS
from app.db.usage import BucketKey, UsageBook, UsageQuery
from tests.support.clock import FakeClock

T0 = 1_750_000_040.0  # 40 s into a minute, 440 s into an hour


class FlakyBook(UsageBook):
    """A book whose writes fail on demand: before reaching the database, or after the
    commit (the acknowledgement lost on the way back)."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.fail_before = 0
        self.fail_after = 0

    async def write(
        self, writer: str, seq: int, rows: Mapping[BucketKey, Sequence[int]], spend: Any = None
    ) -> bool:
        if self.fail_before:
            self.fail_before -= 1
            raise DatabaseUnavailable("database down (test)")
        done = await super().write(writer, seq, rows, spend)
        if self.fail_after:
            self.fail_after -= 1
            raise DatabaseUnavailable("connection lost after COMMIT (test)")
        return done


def entry(key: str = "alice", **kw: Any) -> UsageEntry:
    base: dict[str, Any] = {"model": "gpt-4o", "prompt_tokens": 10, "completion_tokens": 5}
    return UsageEntry(key=key, **{**base, **kw})


async def totals(book: UsageBook, **query: Any) -> list[dict[str, Any]]:
    return await book.report(UsageQuery(**query))


async def test_entries_become_minute_rows_and_periods_can_be_asked_for(db: Database) -> None:
    clock = FakeClock(T0)
    ledger = Ledger(UsageBook(db), LedgerConfig(), clock=clock)
    ledger.add(entry(cached_tokens=4, domain="a"))
    ledger.add(entry(status=502, error=True, failed_prompt_tokens=10, domain="a"))
    clock.advance(60)
    ledger.add(entry(domain="b"))
    ledger.add(entry("bob", model="claude"))
    assert ledger.backlog == 4  # (minute, key, model, domain, status) each
    await ledger.flush()
    assert ledger.backlog == 0

    (alice, bob) = await totals(ledger.book)
    assert (alice["key"], alice["model"], bob["key"]) == ("alice", "gpt-4o", "bob")
    assert (alice["requests"], alice["errors"], alice["prompt_tokens"]) == (3, 1, 30)
    assert (alice["cached_tokens"], alice["failed_prompt_tokens"]) == (4, 10)
    first_minute = int(T0) - int(T0) % 60
    per_minute = await totals(ledger.book, group_by=("key",), granularity=60, keys=("alice",))
    assert [(r["period"], r["requests"]) for r in per_minute] == [
        (first_minute, 2),
        (first_minute + 60, 1),
    ]
    only_second = await totals(ledger.book, start=first_minute + 60, end=first_minute + 120)
    assert [(r["key"], r["requests"]) for r in only_second] == [("alice", 1), ("bob", 1)]
    by_status = await totals(ledger.book, group_by=("status",))
    assert [(r["status"], r["requests"]) for r in by_status] == [(200, 3), (502, 1)]


async def test_a_failed_flush_is_kept_and_written_once_the_database_is_back(
    db: Database,
) -> None:
    book = FlakyBook(db)
    ledger = Ledger(book, LedgerConfig(), clock=FakeClock(T0))
    for _ in range(3):
        ledger.add(entry())
    book.fail_before = 2
    for _ in range(2):
        with pytest.raises(DatabaseUnavailable):
            await ledger.flush()
        ledger.add(entry("bob"))  # the gateway keeps serving meanwhile
    assert await totals(book) == []
    await ledger.flush()  # the outstanding flush...
    await ledger.flush()  # ...then what gathered during the outage
    rows = {r["key"]: r["requests"] for r in await totals(book)}
    assert rows == {"alice": 3, "bob": 2} and ledger.backlog == 0


async def test_a_flush_whose_commit_was_not_acknowledged_is_not_counted_twice(
    db: Database,
) -> None:
    book = FlakyBook(db)
    ledger = Ledger(book, LedgerConfig(), clock=FakeClock(T0))
    ledger.add(entry(prompt_tokens=7))
    book.fail_after = 1
    with pytest.raises(DatabaseUnavailable):
        await ledger.flush()  # committed, but the gateway could not know
    ledger.add(entry(prompt_tokens=1))
    await ledger.flush_all(deadline=0)
    (row,) = await totals(book)
    assert (row["requests"], row["prompt_tokens"]) == (2, 8)


async def test_two_writers_add_up_and_a_replayed_sequence_adds_nothing(db: Database) -> None:
    book = UsageBook(db)
    key: BucketKey = (1_750_000_020, "alice", "m", "-", 200, "-", "-", "-")
    rest = [0] * (len(COUNTERS) - 4)
    assert await book.write("w1", 1, {key: [1, 0, 5, 5, *rest]})
    assert await book.write("w2", 1, {key: [2, 1, 5, 5, *rest]})
    assert not await book.write("w1", 1, {key: [1, 0, 5, 5, *rest]})
    (row,) = await totals(book)
    assert (row["requests"], row["errors"], row["prompt_tokens"]) == (3, 1, 10)


async def test_old_minutes_roll_up_into_hours_and_hours_expire(db: Database) -> None:
    day, clock = 86400, FakeClock(T0)
    ledger = Ledger(UsageBook(db), LedgerConfig(minute_retention_days=1, hour_retention_days=3))
    ledger.clock = clock
    for minute in range(3):  # three minutes of one hour, 5 days ago
        clock.now = T0 - 5 * day + minute * 60
        ledger.add(entry())
    clock.now = T0 - 2 * day
    ledger.add(entry(prompt_tokens=100))
    ledger.add(entry(prompt_tokens=100))
    clock.now = T0
    ledger.add(entry(prompt_tokens=1000))
    await ledger.flush()
    before = await totals(ledger.book)

    moved = await ledger.maintain()
    assert moved == 4  # the minutes older than a day, in two hour rows
    after = await totals(ledger.book)
    hourly = await totals(ledger.book, granularity=3600)
    # What was 5 days old passed hour retention too: only the 2-day-old hour and today left.
    assert [r["requests"] for r in hourly] == [2, 1]
    assert after[0]["prompt_tokens"] == before[0]["prompt_tokens"] - 30
    assert await ledger.maintain() == 0  # nothing left to move


async def test_the_buffer_is_bounded_while_the_database_is_away(db: Database) -> None:
    book = FlakyBook(db)
    ledger = Ledger(book, LedgerConfig(max_buffered_rows=2), clock=FakeClock(T0))
    ledger.add(entry("a"))
    ledger.add(entry("b"))
    ledger.add(entry("c"))  # a third row: no room
    ledger.add(entry("a"))  # an existing row always takes more
    assert (ledger.backlog, ledger.dropped) == (2, 1)
    await ledger.flush()
    assert {r["key"]: r["requests"] for r in await totals(book)} == {"a": 2, "b": 1}


async def test_closing_writes_everything_settled(database_cfg: DatabaseConfig) -> None:
    db = Database(database_cfg)
    await migrate.prepare(db)
    ledger = Ledger(UsageBook(db), LedgerConfig())
    for i in range(50):
        ledger.add(entry(f"k{i % 5}", status=200 if i % 7 else 503))
    await ledger.close()
    assert sum(r["requests"] for r in await totals(ledger.book)) == 50
    await db.close()


async def test_a_shutdown_without_the_database_spills_and_the_next_start_writes_it_once(
    db: Database, tmp_path: Path
) -> None:
    """SIGTERM while the database is away loses no row: what could not be written goes
    to a spill file that the next start writes (a file replayed twice adds nothing)."""
    cfg = LedgerConfig(spill_dir=str(tmp_path / "spill"))
    book = FlakyBook(db)
    ledger = Ledger(book, cfg, clock=FakeClock(T0))
    ledger.add(entry(prompt_tokens=7))
    book.fail_after = 1  # the first flush commits, its acknowledgement is lost
    with pytest.raises(DatabaseUnavailable):
        await ledger.flush()
    ledger.add(entry("bob", cost_nanos=1000))
    book.fail_before = 10_000  # then the database is gone for good
    with pytest.raises(DatabaseUnavailable):
        await ledger.close(grace_sec=0)
    (spilled,) = (tmp_path / "spill").glob("ledger-spill-*.json")
    # prompts' usage by key: only the gateway's user may read it (issue #31)
    assert stat.S_IMODE(spilled.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "spill").stat().st_mode) == 0o700
    kept = spilled.read_text()

    restarted = Ledger(UsageBook(db), cfg, clock=FakeClock(T0 + 5))
    assert await restarted.recover() == 1  # alice's row was committed already: only bob's
    assert not spilled.exists()
    spilled.write_text(kept)  # the same file again (a crash before the removal)
    assert await restarted.recover() == 0 and not spilled.exists()
    rows = {r["key"]: (r["requests"], r["prompt_tokens"]) for r in await totals(book)}
    assert rows == {"alice": (1, 7), "bob": (1, 10)}
    assert await restarted.recover() == 0  # nothing left


async def test_an_unreadable_spill_file_is_left_alone(db: Database, tmp_path: Path) -> None:
    (tmp_path / "ledger-spill-x.json").write_text("{not json")
    ledger = Ledger(UsageBook(db), LedgerConfig(spill_dir=str(tmp_path)))
    assert await ledger.recover() == 0
    assert (tmp_path / "ledger-spill-x.json").exists()
