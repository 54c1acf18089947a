"""Spend alerts in-process against a real local HTTP receiver and a real database: one
delivery per budget, threshold and period across two replicas, signed, retried with
backoff after failures, and sent again by another replica once a dead one's lease lapses."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from app.alerts import AlertCenter, sign, threshold_events
from app.billing.budget_rules import Budget
from app.billing.periods import Calendar
from app.billing.spend import BudgetState
from app.config.schema import DatabaseConfig, Settings
from app.db import migrate
from app.db.alertbook import AlertBook
from app.db.engine import Database
from app.kinds import BudgetMetric, BudgetPeriod, BudgetScope
from app.runtime import Runtime
from tests.support.receiver import receiver

CAL = Calendar("UTC")
NOW = 1_780_000_000.0
SECRET = "alert-secret-0123456789"


def state(spent: int, limit: int = 1000) -> BudgetState:
    budget = Budget(BudgetScope.KEY, "alice", BudgetPeriod.DAY, BudgetMetric.TOKENS, limit)
    return BudgetState(budget, limit, None, CAL.window(BudgetPeriod.DAY, NOW), spent, 0)


class FakeSpend:
    def __init__(self) -> None:
        self.calendar = CAL
        self.now: list[BudgetState] = []
        self.refused: set[tuple[str, str, str]] = set()

    def states(self, now: float | None = None) -> list[BudgetState]:
        return self.now


def runtime(url: str, **alerts: Any) -> Runtime:
    settings = Settings.model_validate(
        {"alerts": {"webhooks": [{"url": url}], "max_attempts": 3, "lease_sec": 5, **alerts}}
    )
    return Runtime(settings, (), (), False, 1, alerts_secret=SecretStr(SECRET))


async def center(db: Database, spend: FakeSpend, rt: Runtime, name: str) -> AlertCenter:
    clock = [NOW]
    c = AlertCenter(AlertBook(db), spend, name, set, clock=lambda: clock[0])  # type: ignore[arg-type]
    c.configure(rt)
    c.clock_cell = clock  # type: ignore[attr-defined]
    return c


def test_thresholds_reached_are_each_an_event_named_by_budget_threshold_and_period() -> None:
    keys = [e[0] for e in threshold_events(state(850), [50, 80, 100], "USD", CAL)]
    assert keys == [
        "threshold:key:alice:day_tokens:day:2026-05-28:50",
        "threshold:key:alice:day_tokens:day:2026-05-28:80",
    ]
    assert len(threshold_events(state(1000), [50, 80, 100], "USD", CAL)) == 3
    assert threshold_events(state(499), [50], "USD", CAL) == []
    # a budget that refused a request is at 100 % (spend stops short of it by a request)
    full = threshold_events(state(930), [50, 100, 150], "USD", CAL, refused=True)
    assert [e[2]["threshold_percent"] for e in full] == [50, 100]
    body = b'{"a": 1}'
    expected = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert sign(SECRET.encode(), body) == f"sha256={expected}"


async def test_two_replicas_send_each_alert_once_signed(tmp_path: Path) -> None:
    db = Database(DatabaseConfig(path=str(tmp_path / "t.sqlite3")))
    await migrate.prepare(db)
    spend = FakeSpend()
    spend.now = [state(600)]
    with receiver() as hook:
        a = await center(db, spend, runtime(hook.url), "replica-a")
        b = await center(db, spend, runtime(hook.url), "replica-b")
        await a.tick()
        await b.tick()
        spend.now = [state(900)]
        await b.tick()
        await a.tick()
        posts = hook.delivered()
        ids = [p.headers["x-tokengate-delivery"] for p in posts]
        assert ids == [
            "threshold:key:alice:day_tokens:day:2026-05-28:50#0",
            "threshold:key:alice:day_tokens:day:2026-05-28:80#0",
        ]
        for post in posts:
            assert post.headers["x-tokengate-signature"] == sign(SECRET.encode(), post.raw)
            assert post.body["event"] == "budget_threshold"
        assert posts[1].body["threshold_percent"] == 80 and posts[1].body["spent"] == 900
        await a.close()
        await b.close()
    await db.close()


async def test_a_failing_receiver_is_retried_with_backoff_then_given_up(tmp_path: Path) -> None:
    db = Database(DatabaseConfig(path=str(tmp_path / "t.sqlite3")))
    await migrate.prepare(db)
    spend = FakeSpend()
    spend.now = [state(500)]
    with receiver() as hook:
        hook.fail_next = 1
        c = await center(db, spend, runtime(hook.url), "r")
        await c.tick()  # tried once: 500
        ident = "threshold:key:alice:day_tokens:day:2026-05-28:50#0"
        row = await AlertBook(db).read(ident)
        assert row is not None and (row["state"], row["attempts"]) == ("pending", 1)
        assert row["last_status"] == 500 and row["next_at"] >= NOW
        c.clock_cell[0] = row["next_at"] + 0.001  # type: ignore[attr-defined]
        assert await c.deliver(c.clock()) == 1
        row = await AlertBook(db).read(ident)
        assert row is not None and (row["state"], row["attempts"]) == ("delivered", 2)
        assert len(hook.delivered()) == 2
        # a receiver that always fails: given up after alerts.max_attempts (3)
        hook.fail_next = 100
        spend.now = [state(800)]
        await c.tick()
        for _ in range(5):
            c.clock_cell[0] += 400  # type: ignore[attr-defined]
            await c.deliver(c.clock())
        row = await AlertBook(db).read("threshold:key:alice:day_tokens:day:2026-05-28:80#0")
        assert row is not None and (row["state"], row["attempts"]) == ("failed", 3)
        await c.close()
    await db.close()


async def test_a_delivery_whose_replica_died_is_sent_by_another_after_the_lease(
    tmp_path: Path,
) -> None:
    db = Database(DatabaseConfig(path=str(tmp_path / "t.sqlite3")))
    await migrate.prepare(db)
    book = AlertBook(db)
    spend = FakeSpend()
    spend.now = [state(500)]
    with receiver() as hook:
        dead = await center(db, spend, runtime(hook.url), "dead")
        await dead.enqueue(await dead.detect(NOW), NOW)
        ident = "threshold:key:alice:day_tokens:day:2026-05-28:50#0"
        assert await book.claim(ident, "dead", NOW, 5.0) is not None  # ... and then it died
        other = await center(db, spend, runtime(hook.url), "other")
        assert await other.deliver(NOW + 1) == 0  # leased: not before the lease lapses
        assert await other.deliver(NOW + 6) == 1
        row = await book.read(ident)
        assert row is not None and row["state"] == "delivered"
        assert [p.headers["x-tokengate-delivery"] for p in hook.delivered()] == [ident]
        await other.close()
        await dead.close()
    await db.close()


async def test_a_budget_that_alerted_and_enters_a_new_period_sends_a_reset(
    tmp_path: Path,
) -> None:
    db = Database(DatabaseConfig(path=str(tmp_path / "t.sqlite3")))
    await migrate.prepare(db)
    spend = FakeSpend()
    spend.now = [state(600)]
    with receiver() as hook:
        c = await center(db, spend, runtime(hook.url), "r")
        await c.tick()
        tomorrow = NOW + 86400
        budget = Budget(BudgetScope.KEY, "alice", BudgetPeriod.DAY, BudgetMetric.TOKENS, 1000)
        spend.now = [BudgetState(budget, 1000, None, CAL.window(BudgetPeriod.DAY, tomorrow), 0, 0)]
        c.clock_cell[0] = tomorrow  # type: ignore[attr-defined]
        await c.tick()
        await c.tick()  # seen again in the same period: nothing more
        events = [(p.body["event"], p.body["period_id"]) for p in hook.delivered()]
        assert events == [
            ("budget_threshold", "day:2026-05-28"),
            ("budget_reset", "day:2026-05-29"),
        ]
        # a budget that never alerted sends no reset
        other = Budget(BudgetScope.TEAM, "quiet", BudgetPeriod.DAY, BudgetMetric.TOKENS, 1000)
        spend.now = [BudgetState(other, 1000, None, CAL.window(BudgetPeriod.DAY, tomorrow), 0, 0)]
        await c.tick()
        assert len(hook.delivered()) == 2
        await c.close()
    await db.close()
