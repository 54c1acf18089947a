"""Where stored responses live and whose they are: the bounded local cache, and the
database behind it (SQLite and PostgreSQL)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.config.schema import DatabaseConfig
from app.db.engine import Database
from app.db.owners import ResponseOwners
from app.dispatch.homes import Home, LocalHomes, ResponseHomes
from app.errors import ServiceUnavailable
from tests.support.clock import FakeClock
from tests.support.waiting import sqlite_threads, sqlite_threads_ended

A = Home("dom-a", "alice")


def test_local_entries_expire_and_the_least_recent_goes_first(clock: FakeClock) -> None:
    homes = LocalHomes(capacity=2, ttl=10, clock=clock)
    homes.remember("r1", A)
    homes.remember("r2", Home("dom-b", "bob"))
    assert homes.where("r1") == A  # a read makes r1 the most recent
    homes.remember("r3", A)
    assert homes.where("r2") is None and homes.where("r1") == A and len(homes) == 2
    clock.advance(10)
    assert homes.where("r1") is None and homes.where("r3") is None


async def test_what_one_process_forgot_the_database_still_knows(db: Database) -> None:
    one = ResponseHomes(LocalHomes(1, 60), ResponseOwners(db, 3600))
    await one.remember("resp_1", A)
    await one.remember("resp_2", Home("dom-b", "bob"))  # evicts resp_1 from the cache
    assert one.local.where("resp_1") is None
    assert await one.where("resp_1") == A  # the database answers, and the cache learns it
    two = ResponseHomes(LocalHomes(10, 60), ResponseOwners(db, 3600))  # a restart, a replica
    assert await two.where("resp_1") == A and await two.where("resp_never") is None
    await two.remember("resp_1", Home("dom-b", "mallory"))  # a second claim changes nothing
    fresh = ResponseHomes(LocalHomes(10, 60), ResponseOwners(db, 3600))
    assert await fresh.where("resp_1") == A
    await two.forget("resp_1")
    assert await ResponseHomes(LocalHomes(10, 60), ResponseOwners(db, 3600)).where("resp_1") is None


async def test_owners_expire_and_are_pruned(db: Database) -> None:
    owners = ResponseOwners(db, -1)  # already past its lifetime
    await owners.record("resp_old", "alice", "dom-a")
    assert await owners.find("resp_old") is None  # expired: unknown, even before pruning
    await ResponseOwners(db, 3600).record("resp_new", "alice", "dom-a")
    assert await owners.prune() == 1
    assert await owners.find("resp_new") == ("alice", "dom-a")


async def test_an_unreachable_database_refuses_what_the_cache_can_not_vouch_for(
    tmp_path: Path,
) -> None:
    before = sqlite_threads()
    down = Database(DatabaseConfig(path=str(tmp_path / "missing" / "x.sqlite3")))
    await down.close()
    homes = ResponseHomes(LocalHomes(10, 60), ResponseOwners(down, 3600))
    shutil.rmtree(tmp_path / "missing")  # no file, no directory: every statement fails
    (tmp_path / "missing").write_text("not a directory")
    await homes.remember("resp_1", A)  # logged; the creator still has it from the cache
    assert await homes.where("resp_1") == A
    with pytest.raises(ServiceUnavailable):
        await homes.where("resp_2")
    await down.close()  # the statements above opened connections again: none left running
    await sqlite_threads_ended(before)
