"""The ledger's SQL: write flushed buckets, roll minutes up into hours, answer reports.

A flush is one transaction: first the writer's sequence number moves forward
(`ledger_writers`, only if it is behind), then every bucket is added with
`INSERT ... ON CONFLICT DO UPDATE SET n = n + excluded.n`. A flush retried after its
commit was acknowledged to nobody finds its sequence already there and adds nothing, so
a lost acknowledgement never counts usage twice.

A roll-up moves the minute rows of one hour at a time into `usage_hour`, deleting them
with `RETURNING` and adding exactly the rows it deleted: a flush that commits minute rows
for that hour meanwhile is not lost, it is rolled up the next time. Several replicas may
roll up at once (PostgreSQL: an advisory lock lets one through; the deletes make it safe
anyway).

Reports (`UsageQuery`) read both tables: minute precision where minutes are kept, hour
precision before that (an hour bucket counts when its start is inside the period).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, delete, func, select, union_all
from sqlalchemy.sql.elements import ColumnElement

from app.db.engine import Database
from app.db.tables import (
    COUNTERS,
    DIMENSIONS,
    budget_spend,
    ledger_writers,
    usage_hour,
    usage_minute,
)

# bucket (epoch s), key, model, domain, status, team, session, billing window
BucketKey = tuple[int, str, str, str, int, str, str, str]
SpendRow = tuple[str, str, str]  # scope ("key" | "team"), owner, period id
HOUR = 3600
DAY = 86400
WRITERS_KEPT_SEC = 30 * DAY  # a writer idle this long (its process is gone) is forgotten
_KEY_COLUMNS = ("bucket", *DIMENSIONS)


@dataclass(frozen=True)
class UsageQuery:
    """A report: `[start, end)` in epoch seconds (None: unbounded), grouped by some of
    `DIMENSIONS`, optionally per period of `granularity` seconds (60, 3600, 86400)."""

    start: int | None = None
    end: int | None = None
    group_by: tuple[str, ...] = ("key", "model")
    granularity: int | None = None
    keys: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.group_by) - set(DIMENSIONS)
        assert not unknown, f"not a usage dimension: {unknown}"


class UsageBook:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- writing ------------------------------------------------------------------------------
    async def write(
        self,
        writer: str,
        seq: int,
        rows: Mapping[BucketKey, Sequence[int]],
        spend: Mapping[SpendRow, tuple[int, int]] | None = None,
    ) -> bool:
        """Add one flush (and the budget spend of its rows: (cost nanos, tokens) per
        scope, owner and period); False when this (writer, seq) was already committed."""
        db = self.db
        claim = db.upsert(ledger_writers).values(writer=writer, seq=seq, updated_at=db.now())
        claim = claim.on_conflict_do_update(
            index_elements=["writer"],
            set_={"seq": claim.excluded.seq, "updated_at": claim.excluded.updated_at},
            where=ledger_writers.c.seq < claim.excluded.seq,
        ).returning(ledger_writers.c.writer)
        params = [
            {**dict(zip(_KEY_COLUMNS, key, strict=True)), **dict(zip(COUNTERS, v, strict=True))}
            for key, v in rows.items()
        ]
        async with db.begin() as conn:
            if (await conn.execute(claim)).first() is None:
                return False
            if params:
                await conn.execute(_add(db, usage_minute), params)
            if spend:
                await conn.execute(_add_spend(db), _spend_params(spend))
        return True

    # -- roll-up and retention -----------------------------------------------------------------
    async def roll_up(self, before: int, max_hours: int = 24) -> int:
        """Move minute rows older than `before` into hour rows, oldest hour first, at most
        `max_hours` hours per call (one transaction each); the number of rows moved."""
        moved = 0
        for _ in range(max_hours):
            async with self.db.begin() as conn:
                if not await self.db.try_xact_lock(conn, "ledger-rollup"):
                    return moved
                oldest = await conn.scalar(select(func.min(usage_minute.c.bucket)))
                if oldest is None or oldest >= before:
                    return moved
                hour = oldest - oldest % HOUR
                gone = await conn.execute(
                    delete(usage_minute)
                    .where(usage_minute.c.bucket >= hour)
                    .where(usage_minute.c.bucket < min(hour + HOUR, before))
                    .returning(*(usage_minute.c[c] for c in (*DIMENSIONS, *COUNTERS)))
                )
                sums: dict[tuple[Any, ...], list[int]] = {}
                for row in gone:
                    dims, values = tuple(row[: len(DIMENSIONS)]), row[len(DIMENSIONS) :]
                    into = sums.setdefault(dims, [0] * len(COUNTERS))
                    for i, v in enumerate(values):
                        into[i] += v
                    moved += 1
                if sums:
                    await conn.execute(
                        _add(self.db, usage_hour),
                        [
                            {
                                "bucket": hour,
                                **dict(zip(DIMENSIONS, dims, strict=True)),
                                **dict(zip(COUNTERS, v, strict=True)),
                            }
                            for dims, v in sums.items()
                        ],
                    )
        return moved

    async def maintain(
        self, now: int, minute_days: int, hour_days: int, max_hours: int = 24
    ) -> tuple[int, int]:
        """Retention: minutes older than `minute_days` become hours; hours older than
        `hour_days` (0: never) are deleted. (minute rows rolled up, hour rows deleted)"""
        cutoff = now - minute_days * DAY
        moved = await self.roll_up(cutoff - cutoff % HOUR, max_hours)
        deleted = await self.prune(
            now - hour_days * DAY if hour_days else None, now - WRITERS_KEPT_SEC
        )
        return moved, deleted

    async def prune(self, hours_before: int | None, writers_before: float) -> int:
        """Delete hour rows older than `hours_before` (None: keep) and idle writers."""
        async with self.db.begin() as conn:
            deleted = 0
            if hours_before is not None:
                done = await conn.execute(
                    delete(usage_hour).where(usage_hour.c.bucket < hours_before)
                )
                deleted = done.rowcount or 0
            await conn.execute(
                delete(ledger_writers).where(ledger_writers.c.updated_at < writers_before)
            )
        return deleted

    # -- reports ----------------------------------------------------------------------------------
    async def report(self, query: UsageQuery) -> list[dict[str, Any]]:
        both = union_all(*(_window(t, query) for t in (usage_minute, usage_hour))).subquery()
        groups: list[ColumnElement[Any]] = []
        if query.granularity:
            groups.append((both.c.bucket - both.c.bucket % query.granularity).label("period"))
        groups.extend(both.c[d] for d in query.group_by)
        sums = [func.sum(both.c[c]).label(c) for c in COUNTERS]
        stmt = select(*groups, *sums).group_by(*groups).order_by(*groups)
        async with self.db.connect() as conn:
            result = await conn.execute(stmt)
            return [
                {name: (int(v) if name in COUNTERS else v) for name, v in row._mapping.items()}
                for row in result
            ]


def _window(table: Table, query: UsageQuery) -> Any:
    stmt = select(*(table.c[c] for c in (*_KEY_COLUMNS, *COUNTERS)))
    if query.start is not None:
        stmt = stmt.where(table.c.bucket >= query.start)
    if query.end is not None:
        stmt = stmt.where(table.c.bucket < query.end)
    if query.keys is not None:
        stmt = stmt.where(table.c.key.in_(query.keys))
    return stmt


def _spend_params(spend: Mapping[SpendRow, tuple[int, int]]) -> list[dict[str, Any]]:
    return [
        {"scope": s, "owner": o, "period": p, "cost_nanos": c, "tokens": t}
        for (s, o, p), (c, t) in spend.items()
    ]


def _add_spend(db: Database) -> Any:
    stmt = db.upsert(budget_spend).values(updated_at=db.now())
    t = budget_spend.c
    return stmt.on_conflict_do_update(
        index_elements=[t.scope, t.owner, t.period],
        set_={
            "cost_nanos": t.cost_nanos + stmt.excluded.cost_nanos,
            "tokens": t.tokens + stmt.excluded.tokens,
            "updated_at": stmt.excluded.updated_at,
        },
    )


def _add(db: Database, table: Table) -> Any:
    """Additive upsert of bucket rows (executemany)."""
    stmt = db.upsert(table)
    return stmt.on_conflict_do_update(
        index_elements=[table.c[c] for c in _KEY_COLUMNS],
        set_={c: table.c[c] + stmt.excluded[c] for c in COUNTERS},
    )
