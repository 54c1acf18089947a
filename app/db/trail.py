"""The audit trail's SQL: one row per change to money or limits, newest read first.

A row says who (`actor`: the admin credential's name, `reload`, `expiry`), when (`at`,
epoch seconds on the writer's clock), which process (`replica`), what (`action`, e.g.
`key_limits.set`, and `target`, e.g. `key:alice`), and the value before and after as
JSON text (null: there was none, or there is none now). A row with `once` is written
at most once across every replica sharing the database (a unique index: the second
replica's insert does nothing), for changes each replica notices by itself, such as a
key's expiry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import delete, select

from app.db.engine import Database
from app.db.tables import audit_log

MAX_ROWS = 1000


class AuditRow(NamedTuple):
    at: float
    actor: str
    replica: str
    action: str
    target: str
    before: object = None
    after: object = None
    once: str | None = None


@dataclass(frozen=True)
class AuditQuery:
    since: float | None = None
    until: float | None = None
    actor: str | None = None
    action: str | None = None  # exact, or a prefix ending in "." (`key_limits.`)
    target: str | None = None
    limit: int = 100


class AuditBook:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def write(self, rows: list[AuditRow]) -> None:
        if not rows:
            return
        stmt = self.db.upsert(audit_log).on_conflict_do_nothing(index_elements=["once"])
        params = [
            {
                "at": r.at,
                "actor": r.actor[:128],
                "replica": r.replica[:64],
                "action": r.action[:64],
                "target": r.target[:256],
                "old_value": _json(r.before),
                "new_value": _json(r.after),
                "once": r.once,
            }
            for r in rows
        ]
        async with self.db.begin() as conn:
            await conn.execute(stmt, params)

    async def read(self, query: AuditQuery) -> list[dict[str, Any]]:
        t = audit_log.c
        stmt = select(audit_log).order_by(t.at.desc(), t.id.desc())
        if query.since is not None:
            stmt = stmt.where(t.at >= query.since)
        if query.until is not None:
            stmt = stmt.where(t.at < query.until)
        if query.actor is not None:
            stmt = stmt.where(t.actor == query.actor)
        if query.action is not None:
            if query.action.endswith("."):
                stmt = stmt.where(t.action.startswith(query.action, autoescape=True))
            else:
                stmt = stmt.where(t.action == query.action)
        if query.target is not None:
            stmt = stmt.where(t.target == query.target)
        stmt = stmt.limit(max(1, min(query.limit, MAX_ROWS)))
        async with self.db.connect() as conn:
            return [_row(r._mapping) for r in await conn.execute(stmt)]

    async def prune(self, before: float) -> int:
        async with self.db.begin() as conn:
            done = await conn.execute(delete(audit_log).where(audit_log.c.at < before))
            return done.rowcount or 0


def _json(value: object) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


def _row(m: Any) -> dict[str, Any]:
    return {
        "id": int(m["id"]),
        "at": float(m["at"]),
        "actor": m["actor"],
        "replica": m["replica"],
        "action": m["action"],
        "target": m["target"],
        "before": None if m["old_value"] is None else json.loads(m["old_value"]),
        "after": None if m["new_value"] is None else json.loads(m["new_value"]),
    }
