"""Who owns each stored response (the Responses API): the durable answer, in the database.

    ResponseOwners.record(id, owner, domain)   when the answer names the id, before the
                                               client can use it; an id already recorded
                                               keeps its first owner
    ResponseOwners.find(id)                    (owner, domain), or None: unknown or expired
    ResponseOwners.drop(id)                    after the owner deleted it upstream
    ResponseOwners.prune()                     rows past `expires_at` (the housekeeping
                                               loop, and `tokengate db prune`)

A row lives as long as the gateway routes follow-ups to the response
(`responses.id_ttl_sec`, OpenAI keeps responses 30 days): past that the id is unknown, so
nobody, its creator included, reaches it through the gateway any more.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import delete, select

from app.db.engine import Database
from app.db.tables import response_owners


class Owner(NamedTuple):
    owner: str  # the key alias that created the response
    domain: str  # the domain whose upstream stores it


class ResponseOwners:
    def __init__(self, db: Database, ttl_sec: float) -> None:
        self.db = db
        self.ttl_sec = ttl_sec

    async def record(self, response_id: str, owner: str, domain: str) -> None:
        now = self.db.now()
        stmt = (
            self.db.upsert(response_owners)
            .values(
                id=response_id,
                owner=owner,
                domain=domain,
                created_at=now,
                expires_at=now + self.ttl_sec,
            )
            .on_conflict_do_nothing(index_elements=["id"])
        )
        async with self.db.begin() as conn:
            await conn.execute(stmt)

    async def find(self, response_id: str) -> Owner | None:
        t = response_owners.c
        stmt = select(t.owner, t.domain).where(t.id == response_id, t.expires_at > self.db.now())
        async with self.db.connect() as conn:
            row = (await conn.execute(stmt)).first()
        return None if row is None else Owner(str(row[0]), str(row[1]))

    async def drop(self, response_id: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(delete(response_owners).where(response_owners.c.id == response_id))

    async def prune(self) -> int:
        t = response_owners.c
        async with self.db.begin() as conn:
            done = await conn.execute(delete(response_owners).where(t.expires_at <= self.db.now()))
        return done.rowcount or 0
