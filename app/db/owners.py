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

`record` is on every stored Responses answer's path, so it is written the cheap way: the
`INSERT ... ON CONFLICT DO NOTHING` is compiled once for the dialect, and each call runs it
as one autocommitted statement on the driver connection of a pooled SQLAlchemy connection
(aiosqlite: one trip to its thread instead of eight; asyncpg: one prepared statement from
its cache). The statement has committed when `record` returns, as before: the row is
durable before the client sees the id. A driver error there (a dropped or locked
connection) is not classified on this path: the same write goes again through SQLAlchemy,
which either succeeds (the insert is idempotent) or raises `DatabaseUnavailable`.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from sqlalchemy import Float, bindparam, delete, select

from app.db.engine import Database, DatabaseUnavailable
from app.db.tables import response_owners

log = logging.getLogger("tokengate.db")
_VARYING = ("id", "owner", "domain")  # the insert's parameters that change per call


class Owner(NamedTuple):
    owner: str  # the key alias that created the response
    domain: str  # the domain whose upstream stores it


class _Insert:
    """The owner insert compiled once: its SQL in the driver's parameter style, and the
    positional parameters with every constant already in place."""

    __slots__ = ("slots", "sql", "template")

    def __init__(self, db: Database, ttl_sec: float) -> None:
        stmt = _insert(db, bindparam("id"), bindparam("owner"), bindparam("domain"), ttl_sec)
        compiled = stmt.compile(dialect=db.engine.dialect)
        names = compiled.positiontup or []
        values = compiled.construct_params({"id": "", "owner": "", "domain": ""})
        self.sql = str(compiled)
        self.template = [values[name] for name in names]
        self.slots = [(at, _VARYING.index(n)) for at, n in enumerate(names) if n in _VARYING]

    def params(self, varying: tuple[str, str, str]) -> list[Any]:
        params = self.template.copy()
        for at, which in self.slots:
            params[at] = varying[which]
        return params


def _insert(db: Database, id_: Any, owner: Any, domain: Any, ttl_sec: float) -> Any:
    now = db.now()
    return (
        db.upsert(response_owners)
        .values(
            id=id_,
            owner=owner,
            domain=domain,
            created_at=now,
            expires_at=now + bindparam("ttl", ttl_sec, type_=Float),
        )
        .on_conflict_do_nothing(index_elements=["id"])
    )


class ResponseOwners:
    def __init__(self, db: Database, ttl_sec: float) -> None:
        self.db = db
        self.ttl_sec = ttl_sec
        self._insert = _Insert(db, ttl_sec)

    async def record(self, response_id: str, owner: str, domain: str) -> None:
        params = self._insert.params((response_id, owner, domain))
        try:
            async with self.db.connect() as conn:
                driver = (await conn.get_raw_connection()).driver_connection
                if self.db.sqlite:  # isolation_level None: the statement commits itself
                    await driver.execute_insert(self._insert.sql, params)  # type: ignore[union-attr]
                else:  # asyncpg outside a transaction: autocommit
                    await driver.execute(self._insert.sql, *params)  # type: ignore[union-attr]
            return
        except DatabaseUnavailable:
            raise  # no connection at all: the slow path would say the same
        except Exception as exc:  # a driver error: the slow path classifies it
            log.debug("owner row not written on the driver (%s): again", type(exc).__name__)
        await self._record_classified(response_id, owner, domain)

    async def _record_classified(self, response_id: str, owner: str, domain: str) -> None:
        stmt = _insert(self.db, response_id, owner, domain, self.ttl_sec)
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
