"""Spend alerts' deliveries in SQL: deduplicated by id, leased while being sent.

    enqueue  INSERT ... ON CONFLICT DO NOTHING: the first replica to notice an alert
             writes it; every other one (and every later check) adds nothing, so an alert
             goes out once per budget, threshold and period whoever notices it
    claim    UPDATE ... SET lease WHERE pending, due and not leased: one replica sends it
    settle   delivered, or back to pending with the next try's time (failed after the
             last try); a replica that dies while sending leaves a lease that lapses, and
             the delivery is sent again by whoever claims it next (at least once)

Times are the writers' clocks (epoch seconds): replicas' clocks should agree to well
within `alerts.lease_sec`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import func, select, update

from app.db.engine import Database
from app.db.tables import alert_deliveries

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


class Delivery(NamedTuple):
    id: str
    event: str
    webhook: int
    body: str
    attempts: int


class AlertBook:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def enqueue(self, rows: list[tuple[str, str, int, str]], now: float) -> None:
        """(id, event, webhook index, body) each, written unless already there."""
        if not rows:
            return
        stmt = self.db.upsert(alert_deliveries).on_conflict_do_nothing(index_elements=["id"])
        params = [
            {
                "id": i,
                "event": e,
                "webhook": w,
                "body": b,
                "created_at": now,
                "state": PENDING,
                "attempts": 0,
                "next_at": now,
                "lease_until": 0.0,
            }
            for i, e, w, b in rows
        ]
        async with self.db.begin() as conn:
            await conn.execute(stmt, params)

    async def any_with_prefix(self, prefix: str) -> bool:
        t = alert_deliveries.c
        stmt = select(t.id).where(t.id.startswith(prefix, autoescape=True)).limit(1)
        async with self.db.connect() as conn:
            return (await conn.execute(stmt)).first() is not None

    async def due(self, now: float, limit: int = 20) -> list[str]:
        t = alert_deliveries.c
        stmt = (
            select(t.id)
            .where(t.state == PENDING, t.next_at <= now, t.lease_until < now)
            .order_by(t.next_at)
            .limit(limit)
        )
        async with self.db.connect() as conn:
            return [r[0] for r in await conn.execute(stmt)]

    async def claim(self, ident: str, owner: str, now: float, lease: float) -> Delivery | None:
        t = alert_deliveries.c
        take = (
            update(alert_deliveries)
            .where(t.id == ident, t.state == PENDING, t.next_at <= now, t.lease_until < now)
            .values(lease_owner=owner, lease_until=now + lease)
        )
        async with self.db.begin() as conn:
            if (await conn.execute(take)).rowcount != 1:
                return None
            row = (
                await conn.execute(
                    select(t.id, t.event, t.webhook, t.body, t.attempts).where(t.id == ident)
                )
            ).one()
        return Delivery(row[0], row[1], int(row[2]), row[3], int(row[4]))

    async def settle(
        self,
        delivery: Delivery,
        *,
        now: float,
        status: int | None,
        error: str | None,
        next_at: float | None,
    ) -> str:
        """Record one try: delivered (`error` None), retried at `next_at`, or failed."""
        if error is None:
            state = DELIVERED
        else:
            state = PENDING if next_at is not None else FAILED
        values: dict[str, Any] = {
            "state": state,
            "attempts": delivery.attempts + 1,
            "last_status": status,
            "last_error": None if error is None else error[:500],
            "lease_owner": None,
            "lease_until": 0.0,
        }
        if state == DELIVERED:
            values["delivered_at"] = now
        if next_at is not None:
            values["next_at"] = next_at
        async with self.db.begin() as conn:
            await conn.execute(
                update(alert_deliveries).where(alert_deliveries.c.id == delivery.id).values(values)
            )
        return state

    async def counts(self) -> dict[str, int]:
        t = alert_deliveries.c
        stmt = select(t.state, func.count()).group_by(t.state)
        async with self.db.connect() as conn:
            return {str(s): int(n) for s, n in await conn.execute(stmt)}

    async def read(self, ident: str) -> dict[str, Any] | None:
        stmt = select(alert_deliveries).where(alert_deliveries.c.id == ident)
        async with self.db.connect() as conn:
            row = (await conn.execute(stmt)).first()
        return None if row is None else dict(row._mapping)
