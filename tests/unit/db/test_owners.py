"""The owner row of a stored response: written by one compiled statement on the driver
connection, committed before `record` returns, and written through SQLAlchemy when the
driver connection fails (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from app.db.engine import Database
from app.db.owners import Owner, ResponseOwners


async def _never(*_: object) -> None:
    raise AssertionError("the owner row went the slow way")


async def test_the_row_is_committed_when_record_returns(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    owners = ResponseOwners(db, 3600)
    monkeypatch.setattr(owners, "_record_classified", _never)
    await owners.record("resp_1", "alice", "dom-a")
    await owners.record("resp_1", "mallory", "dom-b")  # an id keeps its first owner
    other = Database(db.cfg)  # another process's view: only a committed row is seen
    try:
        assert await ResponseOwners(other, 3600).find("resp_1") == Owner("alice", "dom-a")
    finally:
        await other.close()


async def test_the_row_expires_after_the_ttl_of_its_writer(db: Database) -> None:
    await ResponseOwners(db, -1).record("resp_old", "alice", "dom-a")
    assert await ResponseOwners(db, 3600).find("resp_old") is None
    assert await ResponseOwners(db, 3600).prune() == 1


async def test_a_failing_driver_write_goes_through_sqlalchemy(db: Database) -> None:
    owners = ResponseOwners(db, 3600)
    owners._insert.sql = "INSERT INTO no_such_table VALUES (1)"  # the driver refuses it
    await owners.record("resp_2", "bob", "dom-b")
    assert await owners.find("resp_2") == Owner("bob", "dom-b")
