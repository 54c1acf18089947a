"""Budgets' durable state: spend per period (read), and temporary limits (the admin API).

`budget_spend` is written by the ledger's flush, in the same transaction as the usage
rows it sums (usage.py), so it is exactly the ledger's spend per key, team and calendar
period, and it survives every restart. Each process reads the current periods' rows once
a second (`SpendBook.read`); that is how a budget spent on one replica is seen by the
others without Redis, and how every replica's view is rebuilt after a restart.

`budget_overrides` holds limits raised (or lowered) through the admin API until a given
instant; every process reads the live ones at start and once a second.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from sqlalchemy import and_, delete, or_, select

from app.db.engine import Database
from app.db.tables import budget_overrides, budget_spend

DAY = 86400
# A period row untouched this long is past (no period but `total` lasts over 31 days).
SPEND_KEPT_SEC = 62 * DAY
_OWNERS_PER_QUERY = 500


class BudgetOverride(NamedTuple):
    scope: str
    owner: str
    period: str
    metric: str
    limit: int
    until: float  # epoch seconds


class SpendBook:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def read(
        self, periods: Iterable[str], owners: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str, str], tuple[int, int]]:
        """(cost nanos, tokens) per (scope, owner, period) for these periods and owners."""
        t = budget_spend.c
        wanted, ids = sorted(set(owners)), sorted(set(periods))
        out: dict[tuple[str, str, str], tuple[int, int]] = {}
        async with self.db.connect() as conn:
            for i in range(0, len(wanted), _OWNERS_PER_QUERY):
                chunk = wanted[i : i + _OWNERS_PER_QUERY]
                match = or_(*(and_(t.scope == s, t.owner == o) for s, o in chunk))
                stmt = select(t.scope, t.owner, t.period, t.cost_nanos, t.tokens).where(
                    t.period.in_(ids), match
                )
                for row in await conn.execute(stmt):
                    out[(row[0], row[1], row[2])] = (int(row[3]), int(row[4]))
        return out

    async def prune(self) -> int:
        """Forget past periods' rows (never `total`)."""
        t = budget_spend.c
        async with self.db.begin() as conn:
            done = await conn.execute(
                delete(budget_spend).where(
                    t.period != "total", t.updated_at < self.db.now() - SPEND_KEPT_SEC
                )
            )
        return done.rowcount or 0


class BudgetOverrideBook:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def save(self, o: BudgetOverride) -> None:
        await self.db.put(
            budget_overrides,
            ("scope", "owner", "period", "metric"),
            scope=o.scope,
            owner=o.owner,
            period=o.period,
            metric=o.metric,
            limit_value=o.limit,
            until=o.until,
            updated_at=self.db.now(),
        )

    async def end(
        self, scope: str, owner: str, period: str | None = None, metric: str | None = None
    ) -> int:
        """End overrides of one owner now (all of them, or one period and/or metric)."""
        t = budget_overrides.c
        stmt = delete(budget_overrides).where(t.scope == scope, t.owner == owner)
        if period is not None:
            stmt = stmt.where(t.period == period)
        if metric is not None:
            stmt = stmt.where(t.metric == metric)
        async with self.db.begin() as conn:
            done = await conn.execute(stmt)
        return done.rowcount or 0

    async def load(self, now: float) -> list[BudgetOverride]:
        """The overrides still in force at `now`; past ones are deleted on the way."""
        t = budget_overrides.c
        stmt = select(t.scope, t.owner, t.period, t.metric, t.limit_value, t.until)
        async with self.db.connect() as conn:
            rows = list(await conn.execute(stmt))
        live = [BudgetOverride(r[0], r[1], r[2], r[3], int(r[4]), float(r[5])) for r in rows]
        if any(o.until <= now for o in live):
            async with self.db.begin() as conn:
                await conn.execute(delete(budget_overrides).where(t.until <= now))
        return [o for o in live if o.until > now]
