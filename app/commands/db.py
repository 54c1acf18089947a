"""`tokengate db upgrade | current | check | backup PATH | prune`, and `serve`'s check
(the arguments are declared in `app.commands.cli`, which must not import SQLAlchemy to start).

Exit codes follow the CLI's: 0 done, 1 a failed check (`check`: the schema is not at head;
`backup`: no `pg_dump`), 2 the database can not be used (unreachable, or a schema `serve`
refuses). Every message names the database as `where()` shows it: never its password.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from app.config.schema import Settings
from app.db import migrate
from app.db.engine import Database, DatabaseUnavailable
from app.db.owners import ResponseOwners
from app.db.private import private_file
from app.db.unusable import DatabaseProblem
from app.db.usage import UsageBook


def run(args: argparse.Namespace, settings: Settings) -> int:
    commands: dict[str, Callable[[Database], Awaitable[int]]] = {
        "upgrade": lambda db: _upgrade(db, args.revision),
        "current": _current,
        "check": _check,
        "backup": lambda db: _backup(db, Path(args.path)),
        "prune": lambda db: _prune(db, settings),
    }
    return asyncio.run(_with_db(settings, commands[args.db_command]))


def prepare_for_serve(settings: Settings) -> None:
    """Before `serve` binds its port: the database answers and its schema fits (an empty
    one is created). Raises `DatabaseProblem` with the one line an operator needs."""

    async def prepare(db: Database) -> int:
        try:
            await migrate.prepare(db)
        except migrate.SchemaError as exc:
            raise DatabaseProblem(str(exc)) from None
        return 0

    asyncio.run(_with_db(settings, prepare))


def open_database(settings: Settings) -> Database:
    """The database as `serve` opens it; a SQLite directory that can not be made (a file
    in the way, no permission) is a `DatabaseProblem` naming it, not a traceback."""
    try:
        return Database(settings.database)
    except OSError as exc:
        raise DatabaseProblem(
            f"database.path {settings.database.path}: its directory can not be created "
            f"({exc.strerror or exc}): fix the path or its permissions"
        ) from None


async def _with_db(settings: Settings, command: Callable[[Database], Awaitable[int]]) -> int:
    db = open_database(settings)
    try:
        return await command(db)
    except DatabaseUnavailable as exc:
        raise DatabaseProblem(
            f"{exc}. Check database.url / TOKENGATE_DATABASE_URL (or database.path) and that "
            "the database server is up and reachable from here"
        ) from None
    finally:
        await db.close()


async def _upgrade(db: Database, target: str) -> int:
    before, after = await migrate.upgrade(db, target)
    if before == after:
        print(f"{db.where}: schema already at {after}")
    else:
        print(f"{db.where}: schema upgraded {before or '(empty)'} -> {after}")
    return 0


async def _current(db: Database) -> int:
    found = await migrate.state(db)
    print(f"{db.where}: revision {found.current or '(empty)'}; this tokengate: {found.head}")
    return 0


async def _check(db: Database) -> int:
    found = await migrate.state(db)
    try:
        migrate.check(found, db.where)
    except migrate.SchemaError as exc:
        print(f"tokengate: {exc}", file=sys.stderr)
        return 1
    print(f"{db.where}: schema at {found.head}")
    return 0


async def _prune(db: Database, settings: Settings) -> int:
    cfg = settings.ledger
    moved, deleted = await UsageBook(db).maintain(
        int(time.time()), cfg.minute_retention_days, cfg.hour_retention_days, max_hours=10**6
    )
    print(f"{db.where}: {moved} minute rows rolled up into hours, {deleted} hour rows deleted")
    expired = await ResponseOwners(db, settings.responses.id_ttl_sec).prune()
    print(f"{db.where}: {expired} expired stored-response owners deleted")
    return 0


async def _backup(db: Database, target: Path) -> int:
    await db.ping()  # unreachable: the usual message, before any file is written
    if db.path is not None:
        return await asyncio.to_thread(_sqlite_backup, db, db.path, target)
    return await asyncio.to_thread(_pg_dump, db, target)


def _sqlite_backup(db: Database, source: Path, target: Path) -> int:
    """SQLite's online backup API: a consistent copy while gateways keep writing."""
    if target.exists():
        print(f"tokengate: {target} exists; name a new file", file=sys.stderr)
        return 1
    private_file(target)  # 0600 in a 0700 directory, before a byte is copied
    src = sqlite3.connect(source)
    dst = sqlite3.connect(target)
    try:
        with dst:
            src.backup(dst)
    finally:
        dst.close()
        src.close()
    print(
        f"{db.where}: backed up to {target} ({target.stat().st_size} bytes). Restore: stop "
        f"every gateway, copy it over {source} (deleting {source.name}-wal and -shm)"
    )
    return 0


def _pg_dump(db: Database, target: Path) -> int:
    if target.exists():
        print(f"tokengate: {target} exists; name a new file", file=sys.stderr)
        return 1
    url = db.url
    exe = shutil.which("pg_dump")
    if exe is None:
        print(
            "tokengate: pg_dump not found. Install the PostgreSQL client (Debian: "
            "postgresql-client), or run it where it is:\n"
            f"  PGPASSWORD=... pg_dump --format=custom --file {target} "
            f"--host {url.host} --port {url.port or 5432} --username {url.username} "
            f"{url.database}",
            file=sys.stderr,
        )
        return 1
    private_file(target)  # pg_dump truncates it and keeps its mode
    env = dict(os.environ)
    if url.password is not None:
        env["PGPASSWORD"] = str(url.password)  # the environment, never argv
    if "ssl" in url.query:
        env["PGSSLMODE"] = str(url.query["ssl"])
    argv = [exe, "--format=custom", "--no-owner", f"--file={target}"]
    argv += [f"--host={url.host or 'localhost'}", f"--port={url.port or 5432}"]
    argv += [f"--username={url.username}", f"--dbname={url.database}"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"tokengate: pg_dump failed: {done.stderr.strip()}", file=sys.stderr)
        return 1
    print(
        f"{db.where}: backed up to {target} ({target.stat().st_size} bytes, pg_dump custom "
        "format). Restore into an empty database: pg_restore --no-owner --dbname=URL "
        f"{target}, then `tokengate db check`"
    )
    return 0
