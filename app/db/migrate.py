"""The schema's version: read it, create it, upgrade it (Alembic, run in-process).

    empty database          `serve` creates it at head (nothing to migrate)
    at head                 serve
    behind (older revision) `serve` refuses (exit 2): `tokengate db upgrade`, after a backup
    unknown revision        `serve` refuses: a newer tokengate wrote it (or another program)
    tables, no revision     `serve` refuses: not a tokengate database

Creation and upgrades hold one lock across replicas (`Database.exclusive`), and re-read
the revision under it, so four replicas starting on an empty PostgreSQL create it once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.engine import Database

_SCRIPTS = Path(__file__).with_name("migrations")
_LOCK = "schema"


class SchemaError(Exception):
    """The database's schema does not fit this tokengate; the message says what to run."""


@dataclass(frozen=True)
class SchemaState:
    current: str | None
    head: str
    known: bool  # `current` is one of this tokengate's revisions (or None)
    empty: bool  # no tables at all

    @property
    def at_head(self) -> bool:
        return self.current == self.head

    @property
    def behind(self) -> bool:
        return self.known and self.current is not None and not self.at_head


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_SCRIPTS))
    return cfg


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


def head() -> str:
    found = _scripts().get_current_head()
    assert found is not None, "no migrations shipped"
    return found


def _read_state(conn: Connection) -> SchemaState:
    current = MigrationContext.configure(conn).get_current_revision()
    return SchemaState(current, head(), _known(current), empty=not inspect(conn).get_table_names())


def _known(revision: str | None) -> bool:
    if revision is None:
        return True
    try:
        return _scripts().get_revision(revision) is not None
    except Exception:  # alembic: "No such revision or branch"
        return False


async def _state_on(conn: AsyncConnection) -> SchemaState:
    state: SchemaState = await conn.run_sync(_read_state)
    return state


async def state(db: Database) -> SchemaState:
    async with db.connect() as conn:
        return await _state_on(conn)


async def upgrade(db: Database, target: str = "heads") -> tuple[str | None, str | None]:
    """Migrate to `target` under the schema lock; (revision before, revision after)."""
    async with db.exclusive(_LOCK) as conn:
        return await _upgrade_on(conn, target)


async def _upgrade_on(conn: AsyncConnection, target: str) -> tuple[str | None, str | None]:
    def run(sync: Connection) -> tuple[str | None, str | None]:
        before = MigrationContext.configure(sync).get_current_revision()
        cfg = _config()
        cfg.attributes["connection"] = sync
        command.upgrade(cfg, target)
        return before, MigrationContext.configure(sync).get_current_revision()

    result: tuple[str | None, str | None] = await conn.run_sync(run)
    await conn.commit()
    return result


async def prepare(db: Database) -> SchemaState:
    """Before serving: create an empty database at head; refuse one that does not fit."""
    found = await state(db)
    if found.current is None:
        # Empty, or another replica is creating it right now (its tables may show up
        # between our two reads): decide under the schema lock, on one snapshot.
        async with db.exclusive(_LOCK) as conn:
            found = await _state_on(conn)
            if found.empty:
                await _upgrade_on(conn, "heads")
                found = await _state_on(conn)
    check(found, db.where)
    return found


def check(found: SchemaState, where: str) -> None:
    if found.at_head:
        return
    if found.behind:
        raise SchemaError(
            f"database {where} schema is at revision {found.current}, this tokengate needs "
            f"{found.head}: back it up, then run `tokengate db upgrade`"
        )
    if not found.known:
        raise SchemaError(
            f"database {where} schema is at revision {found.current}, which this tokengate "
            f"(head {found.head}) does not know: it was written by a newer tokengate; run "
            "that version, or point database.url / database.path elsewhere"
        )
    raise SchemaError(
        f"database {where} has tables but no tokengate schema revision: point database.url "
        "/ database.path at an empty database or one tokengate created"
    )
