"""One async engine per process, and what every user of the database needs from it.

SQLAlchemy Core over asyncpg (PostgreSQL) or aiosqlite (SQLite: WAL, `synchronous=NORMAL`,
a busy timeout, and real transactions: pysqlite's implicit ones are turned off and each
transaction starts with its own `BEGIN`). Every call goes through `begin()` / `connect()`,
which turn "the database can not be reached" (refused, timed out, dropped, locked) into
`DatabaseUnavailable`, naming the database without its password, and keep `up` current
for `/health/ready` and `tokengate_database_up`. Other SQL errors are bugs and propagate.

The database's clock (`now()`) is the one time all replicas agree on: batch leases are
measured with it, so a replica whose clock drifts can not steal or keep a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Float, Table, cast, event, extract, func, literal, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.util import await_only

from app.config.schema import DatabaseConfig
from app.db.private import open_private, private_file
from app.db.url import database_url, where

log = logging.getLogger("tokengate.db")
_UNREACHABLE = (OSError, TimeoutError, OperationalError, InterfaceError)


class DatabaseUnavailable(Exception):
    """The database could not be reached (or stayed locked); the message names it."""


class Database:
    def __init__(self, cfg: DatabaseConfig, on_state: Callable[[bool], None] | None = None):
        self.cfg = cfg
        self.url = database_url(cfg)
        self.dialect = self.url.get_backend_name()  # "sqlite" | "postgresql"
        self.where = where(self.url)
        self.up: bool | None = None
        self.last_error: str | None = None
        self._on_state = on_state
        self.engine = _sqlite_engine(self.url, cfg) if self.sqlite else _pg_engine(self.url, cfg)

    @property
    def sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @property
    def path(self) -> Path | None:
        return Path(str(self.url.database)) if self.sqlite else None

    async def close(self) -> None:
        await self.engine.dispose()

    # -- connections -------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A transaction, committed when the block ends without an error."""
        async with self._reachable(), self.engine.begin() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        async with self._reachable(), self.engine.connect() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def _reachable(self) -> AsyncIterator[None]:
        try:
            yield
        except _UNREACHABLE as exc:
            self._state(False, _reason(exc))
            raise DatabaseUnavailable(
                f"database {self.where} unreachable: {_reason(exc)}"
            ) from None
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            self._state(False, _reason(exc))
            raise DatabaseUnavailable(
                f"database {self.where} unreachable: {_reason(exc)}"
            ) from None
        self._state(True, None)

    def _state(self, up: bool, error: str | None) -> None:
        if up != self.up:
            if up and self.up is False:
                log.warning("database %s reachable again", self.where)
            elif not up:
                log.error("database %s unreachable: %s", self.where, error)
            if self._on_state is not None:
                self._on_state(up)
        self.up, self.last_error = up, error

    async def ping(self) -> None:
        async with self.connect() as conn:
            await conn.execute(select(literal(1)))

    # -- dialect differences, all here -----------------------------------------------------------
    def now(self) -> ColumnElement[float]:
        """The database's clock in epoch seconds, as an SQL expression."""
        if self.sqlite:
            return (func.julianday("now") - 2440587.5) * 86400.0
        return cast(extract("epoch", func.clock_timestamp()), Float)

    def upsert(self, table: Table) -> Any:
        """`INSERT` that accepts `.on_conflict_do_update/nothing` in this dialect."""
        return (sqlite.insert if self.sqlite else postgresql.insert)(table)

    async def put(self, table: Table, key: Sequence[str], /, **row: Any) -> None:
        """Write one row: inserted, or, where a row with the same `key` columns exists,
        its other columns replaced by these (one statement, one transaction)."""
        stmt = self.upsert(table).values(**row)
        stmt = stmt.on_conflict_do_update(
            index_elements=list(key),
            set_={name: stmt.excluded[name] for name in row if name not in key},
        )
        async with self.begin() as conn:
            await conn.execute(stmt)

    @contextlib.asynccontextmanager
    async def exclusive(self, name: str) -> AsyncIterator[AsyncConnection]:
        """A connection held by one process at a time across every process using this
        database (schema creation, migrations): a PostgreSQL advisory lock, or a lock file
        beside SQLite's file."""
        if self.path is not None:
            async with _file_lock(self.path.with_name(self.path.name + ".lock")):
                async with self.connect() as conn:
                    yield conn
            return
        key = zlib.crc32(f"tokengate:{name}".encode())
        async with self.connect() as conn:
            await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            await conn.commit()
            try:
                yield conn
            finally:
                with contextlib.suppress(Exception):  # a dropped session released it anyway
                    await conn.rollback()
                    await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                    await conn.commit()

    async def try_xact_lock(self, conn: AsyncConnection, name: str) -> bool:
        """Within `conn`'s transaction: whether this process is the one doing `name` now
        (PostgreSQL; SQLite's single writer already serializes, so always True there)."""
        if self.sqlite:
            return True
        key = zlib.crc32(f"tokengate:{name}".encode())
        got = await conn.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": key})
        return bool(got)


def _sqlite_engine(url: Any, cfg: DatabaseConfig) -> AsyncEngine:
    # 0600 in a 0700 directory before SQLite opens it: its -wal and -shm copy the mode
    private_file(Path(str(url.database)), tighten=True)
    engine = create_async_engine(url, connect_args={"timeout": cfg.statement_timeout_sec})
    busy_ms = int(cfg.statement_timeout_sec * 1000)

    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = None  # no implicit transactions: see `_begin`
        cursor = dbapi_conn.cursor()
        _wal(cursor, cfg.statement_timeout_sec)
        for pragma in ("synchronous=NORMAL", f"busy_timeout={busy_ms}", "foreign_keys=ON"):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def _wal(cursor: Any, wait_sec: float) -> None:
    """`PRAGMA journal_mode=WAL`, waiting for the lock as long as the busy timeout would.

    Turning a new file to WAL takes it exclusively, and SQLite answers a connection that
    already reads it with SQLITE_BUSY at once rather than calling the busy handler (it
    cannot tell a wait from a deadlock): replicas opening a new database together failed
    to start with `database is locked` (tests/unit/db/test_migrate.py, 2 runs in 25 under
    load). Runs in SQLAlchemy's connect hook, inside its greenlet: the wait is the loop's
    sleep, never a blocking one."""
    deadline = asyncio.get_running_loop().time() + wait_sec
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or asyncio.get_running_loop().time() >= deadline:
                raise
        await_only(asyncio.sleep(0.01))


def _pg_engine(url: Any, cfg: DatabaseConfig) -> AsyncEngine:
    timeout_ms = int(cfg.statement_timeout_sec * 1000)
    return create_async_engine(
        url,
        pool_size=cfg.pool_size,
        max_overflow=cfg.max_overflow,
        pool_timeout=cfg.connect_timeout_sec + cfg.statement_timeout_sec,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={
            "timeout": cfg.connect_timeout_sec,
            "command_timeout": cfg.statement_timeout_sec,
            "server_settings": {
                "application_name": "tokengate",
                "statement_timeout": str(timeout_ms),
            },
        },
    )


@contextlib.asynccontextmanager
async def _file_lock(path: Path) -> AsyncIterator[None]:
    handle = await asyncio.to_thread(_open_lock, path)
    try:
        await asyncio.to_thread(fcntl.flock, handle, fcntl.LOCK_EX)
        yield
    finally:
        handle.close()  # releases the lock


def _open_lock(path: Path) -> Any:
    return os.fdopen(open_private(path), "a")


def _reason(exc: BaseException) -> str:
    """A short cause without the statement or its parameters (SQLAlchemy's messages carry
    both) and without credentials (asyncpg's never contain the password)."""
    inner = getattr(exc, "orig", None) or exc
    first = str(inner).strip().splitlines()[0] if str(inner).strip() else ""
    name = type(inner).__name__
    return f"{name}: {first}"[:300] if first else name
