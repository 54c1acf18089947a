"""Where stored responses live: the bounded local map, and the shared store behind it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from app.dispatch.homes import Home, LocalHomes, ResponseHomes
from tests.support.clock import FakeClock

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


def test_home_round_trips_through_its_text_form() -> None:
    assert Home.decode(A.encode()) == A
    assert Home.decode("") is None and Home.decode("dom-a") is None


class FakeShared:
    def __init__(self) -> None:
        self.values: dict[str, tuple[str, float]] = {}

    async def put_text(self, name: str, value: str, ttl_sec: float) -> None:
        self.values[name] = (value, ttl_sec)

    async def get_text(self, name: str) -> str | None:
        entry = self.values.get(name)
        return entry[0] if entry else None

    async def delete_text(self, name: str) -> None:
        self.values.pop(name, None)


async def test_a_replica_finds_what_another_remembered() -> None:
    shared = FakeShared()
    tasks: list[asyncio.Task[None]] = []

    def spawn(coro: Coroutine[Any, Any, None]) -> None:
        tasks.append(asyncio.ensure_future(coro))

    one = ResponseHomes(LocalHomes(10, 60), shared, spawn)
    two = ResponseHomes(LocalHomes(10, 60), shared, spawn)
    one.remember("resp_1", A)
    await asyncio.gather(*tasks)
    assert shared.values["resp:{resp_1}"] == ("dom-a alice", 60)
    assert await two.where("resp_1") == A
    assert two.local.where("resp_1") == A  # cached: the next lookup costs no round trip
    two.forget("resp_1")
    await asyncio.gather(*tasks)
    # Another replica's cache keeps it (its upstream's 404 then says it is gone), but no
    # replica that asks the shared store finds it any more.
    assert await one.where("resp_1") == A
    assert await ResponseHomes(LocalHomes(10, 60), shared, spawn).where("resp_1") is None
