"""Budgets at admission with an injected clock: refusals, resets at local midnight,
temporary raises, and the spend read back from the database after a restart (SQLite and
PostgreSQL)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from app.billing.books import BudgetOverride, SpendBook
from app.billing.budget_rules import Amount
from app.billing.ledger import Ledger, UsageEntry
from app.billing.periods import Calendar
from app.billing.spend import SpendGate
from app.config.schema import LedgerConfig
from app.db.engine import Database
from app.db.usage import UsageBook
from app.errors import BudgetExceeded, ModelNotPriced
from app.runtime import KeySpec, Runtime, compile_runtime
from tests.support.clock import FakeClock
from tests.support.inproc import local_settings

TZ = "Asia/Shanghai"
# 2026-11-03 23:59:00 in Shanghai (15:59 UTC)
LATE = datetime(2026, 11, 3, 15, 59, tzinfo=UTC).timestamp()
USD = 10**9


def runtime(tmp_path: Path, **extra: Any) -> Runtime:
    data = {
        "billing": {"timezone": TZ},
        "keys": [
            {
                "alias": "alice",
                "key_sha256": "a" * 64,
                "team": "ml",
                "budgets": [{"period": "day", "max_cost": "1.00"}],
            },
            {"alias": "bob", "key_sha256": "b" * 64, "team": "ml"},
            {"alias": "carol", "key_sha256": "c" * 64},
        ],
        "teams": [{"name": "ml", "budgets": [{"period": "month", "max_tokens": 10_000}]}],
        **extra,
    }
    return compile_runtime(local_settings(tmp_path, data), {"TAOTOKEN_API_KEY": "sk"})


def key(rt: Runtime, alias: str) -> KeySpec:
    return next(k for k in rt.keys if k.alias == alias)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(LATE)


async def test_a_spent_budget_refuses_with_what_was_spent_of_what_and_when_it_resets(
    tmp_path: Path, clock: FakeClock
) -> None:
    rt = runtime(tmp_path)
    gate = SpendGate(rt, Calendar(TZ), clock=clock)
    alice = key(rt, "alice")
    hold = await gate.reserve(alice, Amount(USD // 2, 100), priced=True)
    assert hold is not None
    gate.settle(hold, Amount(USD * 9 // 10, 120))
    with pytest.raises(BudgetExceeded) as refused:
        await gate.reserve(alice, Amount(USD // 5, 100), priced=True)
    err = refused.value
    assert (err.status, err.type, err.code) == (429, "insufficient_quota", "budget_exceeded")
    assert err.response_headers()["x-should-retry"] == "false"
    assert err.message == (
        "Budget exceeded: the day cost budget of key 'alice' has 0.9 USD of 1 USD spent, "
        "and this request needs up to 0.2 USD. It resets at 2026-11-04T00:00:00+08:00 "
        "(Asia/Shanghai)."
    )
    assert await gate.reserve(alice, Amount(USD // 10, 100), priced=True) is not None


async def test_a_day_budget_resets_at_local_midnight_not_at_utc_midnight(
    tmp_path: Path, clock: FakeClock
) -> None:
    rt = runtime(tmp_path)
    gate = SpendGate(rt, Calendar(TZ), clock=clock)
    alice = key(rt, "alice")
    hold = await gate.reserve(alice, Amount(USD, 1), priced=True)
    assert hold is not None
    gate.settle(hold, Amount(USD, 1))
    clock.now = LATE + 59.999  # 23:59:59.999 local
    with pytest.raises(BudgetExceeded):
        await gate.reserve(alice, Amount(1, 1), priced=True)
    clock.now = LATE + 60  # 00:00 local, 16:00 UTC
    assert await gate.reserve(alice, Amount(USD, 1), priced=True) is not None
    # the month's tokens of the team do not reset with the day
    assert gate.states()[-1].spent == 1


async def test_a_team_budget_counts_every_key_of_the_team(tmp_path: Path, clock: FakeClock) -> None:
    rt = runtime(tmp_path)
    gate = SpendGate(rt, Calendar(TZ), clock=clock)
    for alias in ("alice", "bob"):
        hold = await gate.reserve(key(rt, alias), Amount(0, 4000), priced=True)
        assert hold is not None
        gate.settle(hold, Amount(0, 5000))
    with pytest.raises(BudgetExceeded, match="month tokens budget of team 'ml' has 10,000"):
        await gate.reserve(key(rt, "bob"), Amount(0, 1), priced=True)
    assert await gate.reserve(key(rt, "carol"), Amount(10**12, 10**9), priced=True) is None


async def test_a_raised_budget_applies_until_its_end_then_the_configured_one_again(
    tmp_path: Path, clock: FakeClock
) -> None:
    rt = runtime(tmp_path)
    gate = SpendGate(rt, Calendar(TZ), clock=clock)
    alice = key(rt, "alice")
    hold = await gate.reserve(alice, Amount(USD, 0), priced=True)
    assert hold is not None
    gate.settle(hold, Amount(USD, 0))
    gate.set_overrides([BudgetOverride("key", "alice", "day", "cost", 2 * USD, LATE + 30)])
    assert await gate.reserve(alice, Amount(USD // 2, 0), priced=True) is not None
    clock.advance(30)
    with pytest.raises(BudgetExceeded):
        await gate.reserve(alice, Amount(1, 0), priced=True)


async def test_a_model_without_a_price_is_refused_to_a_key_with_a_cost_budget(
    tmp_path: Path, clock: FakeClock
) -> None:
    rt = runtime(tmp_path)
    gate = SpendGate(rt, Calendar(TZ), clock=clock)
    with pytest.raises(ModelNotPriced):
        await gate.reserve(key(rt, "alice"), Amount(0, 10), priced=False)
    # bob's team caps tokens only: an unpriced model is counted in tokens
    assert await gate.reserve(key(rt, "bob"), Amount(0, 10), priced=False) is not None


async def test_after_a_restart_the_spend_is_read_back_and_a_spent_budget_stays_spent(
    tmp_path: Path, clock: FakeClock, db: Database
) -> None:
    rt, cal = runtime(tmp_path), Calendar(TZ)
    ledger = Ledger(UsageBook(db), LedgerConfig(), clock=clock, calendar=cal)
    book = SpendBook(db)
    alice = UsageEntry("alice", "m", 10, 10, team="ml", cost_nanos=USD * 3 // 4)
    ledger.add(alice)
    await ledger.flush()
    ledger.add(replace(alice, cost_nanos=USD // 4))  # settled, not flushed yet
    before = SpendGate(rt, cal, clock=clock)
    await before.refresh(ledger, book)
    with pytest.raises(BudgetExceeded):  # 0.75 durable + 0.25 unflushed
        await before.reserve(key(rt, "alice"), Amount(1, 1), priced=True)
    await ledger.close()  # SIGTERM: everything written

    after = SpendGate(rt, cal, clock=clock)  # a new process
    await after.refresh(Ledger(UsageBook(db), LedgerConfig(), clock=clock, calendar=cal), book)
    with pytest.raises(BudgetExceeded):
        await after.reserve(key(rt, "alice"), Amount(1, 1), priced=True)
    team = next(s for s in after.states() if s.budget.scope == "team")
    assert team.spent == 40  # both entries' tokens, counted once each
