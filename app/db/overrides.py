"""Live per-key limits set through the admin API, durable and shared by every replica.

`PUT /admin/keys/{alias}/limits` writes a row here; every process reads the table at start
and once a second (the gateway's housekeeping), so a change made on one replica is
enforced by all of them within a second and survives restarts, with or without Redis.
A row stays until the key's limits are changed again or it is cleared (`DELETE
/admin/keys/{alias}/limits`); settings.json and SIGHUP do not remove it: the live value was
set on purpose, later than the file (each reload lists the overrides that hide a file value).
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import select

from app.db.engine import Database
from app.db.tables import key_overrides


class Override(NamedTuple):
    requests_per_minute: int
    tokens_per_minute: int


class OverrideBook:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def save(self, alias: str, rpm: int, tpm: int) -> None:
        await self.db.put(
            key_overrides,
            ("alias",),
            alias=alias,
            requests_per_minute=rpm,
            tokens_per_minute=tpm,
            updated_at=self.db.now(),
        )

    async def delete(self, alias: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(key_overrides.delete().where(key_overrides.c.alias == alias))

    async def load(self) -> dict[str, Override]:
        stmt = select(
            key_overrides.c.alias,
            key_overrides.c.requests_per_minute,
            key_overrides.c.tokens_per_minute,
        )
        async with self.db.connect() as conn:
            return {r[0]: Override(int(r[1]), int(r[2])) for r in await conn.execute(stmt)}
