"""The audit trail: every change to money and limits, durable in the database.

    admin API  ─► record(actor = the admin credential's name, entries)   written at once
    reload     ─► reloaded(old, new): one entry per key, team, price, window or setting
                  that changed (`app.config.audited`), actor `reload`, one set per replica
                  (each replica applies it)
    expiry     ─► housekeeping: a key past its `expires_at`, actor `expiry`, once across
                  every replica (`once`: the database's unique index)

A write the database refuses (it is away) is kept in memory and retried by the next
housekeeping, so a reload during an outage is still recorded; it is logged either way.
The status page shows the last changes (`recent`), read back from the database by the
housekeeping so it lists other replicas' changes too. Rows older than
`audit.retention_days` are deleted (0: kept for ever).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from app.config.audited import Entry, config_changes
from app.db.engine import DatabaseUnavailable
from app.db.trail import AuditBook, AuditQuery, AuditRow
from app.runtime import Runtime

log = logging.getLogger("tokengate.audit")
RECENT = 10
MAX_PENDING = 10_000
DAY = 86400


class AuditTrail:
    def __init__(
        self, book: AuditBook, replica: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.book = book
        self.replica = replica
        self.clock = clock
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self._pending: list[AuditRow] = []
        self._expired: set[str] = set()  # the `once` of expiries written from here

    async def record(self, actor: str, entries: Iterable[Entry], once: str | None = None) -> None:
        now = self.clock()
        rows = [AuditRow(now, actor, self.replica, *entry, once=once) for entry in entries]
        for row in rows:
            log.info("audit: %s %s %s by %s", row.action, row.target, _brief(row.after), row.actor)
        self._pending.extend(rows)
        await self._write()

    async def reloaded(self, old: Runtime, new: Runtime) -> None:
        await self.record("reload", config_changes(old.settings, new.settings))

    async def housekeeping(self, runtime: Runtime) -> None:
        """Retry what the database refused, record keys that expired, prune, refresh."""
        now = self.clock()
        for key in runtime.keys:
            if key.expires_at is None or key.expires_at.timestamp() > now:
                continue
            when = key.expires_at.isoformat()
            once = f"key.expired:{key.alias}:{when}"
            if once not in self._expired:
                self._expired.add(once)
                entry = ("key.expired", f"key:{key.alias}", {"expires_at": when}, None)
                await self.record("expiry", [entry], once=once)
        days = runtime.settings.audit.retention_days
        try:
            await self._write()
            if days:
                await self.book.prune(now - days * DAY)
            self.recent.clear()
            self.recent.extend(await self.book.read(AuditQuery(limit=RECENT)))
        except DatabaseUnavailable:
            return
        except Exception as exc:  # the upkeep runs again in a few seconds
            log.error("audit upkeep failed: %r", exc)

    async def _write(self) -> None:
        if not self._pending:
            return
        rows, self._pending = self._pending, []
        try:
            await self.book.write(rows)
        except DatabaseUnavailable:
            self._pending = (rows + self._pending)[-MAX_PENDING:]
            log.error("audit: %d change(s) kept in memory: the database is away", len(rows))
            return
        for row in rows:
            if row.once is None:
                self.recent.appendleft(_shown(row))

    async def read(self, query: AuditQuery) -> list[dict[str, Any]]:
        await self._write()
        return await self.book.read(query)


def _brief(value: object) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _shown(row: AuditRow) -> dict[str, Any]:
    return {
        "at": row.at,
        "actor": row.actor,
        "replica": row.replica,
        "action": row.action,
        "target": row.target,
        "before": row.before,
        "after": row.after,
    }
