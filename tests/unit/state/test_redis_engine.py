"""The shared-state engine alone, over a scripted link: round trips shared by whatever
meets while one is in flight (feeders first, in attach order, then single calls), an
outage that fails every waiter at once and ends with the heartbeat that answers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rx

from app.config.schema import RedisConfig
from app.state.link import Call, RedisLink, connect
from app.state.redis_engine import Pending, RedisEngine
from tests.unit.limits.test_shared_store import Tasks


class Scripted(RedisLink):
    """A link that answers each call with its own arguments (a heartbeat: one replica),
    holds its first round trip until `release`, and raises `error` while it is set."""

    def __init__(self) -> None:
        base = connect(RedisConfig(url="redis://127.0.0.1:1/0"))  # never connected
        super().__init__(base.client, base.target)
        self.trips: list[list[Call]] = []
        self.release = asyncio.Event()
        self.error: Exception | None = None

    async def run(self, calls: Sequence[Call]) -> list[Any]:
        self.trips.append(list(calls))
        if len(self.trips) == 1:
            await self.release.wait()
        if self.error is not None:
            raise self.error
        return [[1, "epoch"] if c.keys[:1] == ("t:{replicas}",) else c.args for c in calls]


class Item:
    def __init__(self, name: str) -> None:
        self.name, self.answer, self.failed = name, None, False

    def call(self) -> Call:
        return Call(None, (), (self.name,))

    def deliver(self, result: Any) -> None:
        self.answer = result

    def fail(self) -> None:
        self.failed = True


class Feeder:
    def __init__(self) -> None:
        self.items: list[Item] = []
        self.heard_back: list[bool] = []

    def take(self) -> list[Pending]:
        taken: list[Pending] = list(self.items)
        self.items = []
        return taken

    def urgent(self) -> bool:
        return bool(self.items)

    def lazy(self) -> bool:
        return False

    def heard(self, replicas: int, back: bool, lost: bool) -> None:
        self.heard_back.append(back)


def engine_over(link: Scripted, tasks: Tasks) -> tuple[RedisEngine, Feeder]:
    engine = RedisEngine(link, spawn=tasks.spawn, prefix="t:")
    feeder = Feeder()
    engine.attach(feeder)
    return engine, feeder


async def test_what_meets_while_a_round_trip_is_in_flight_goes_in_the_next_one() -> None:
    link, tasks = Scripted(), Tasks()
    engine, feeder = engine_over(link, tasks)
    first = asyncio.ensure_future(engine.call(Call(None, (), ("first",))))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the first round trip is in flight
    later = [asyncio.ensure_future(engine.call(Call(None, (), (n,)))) for n in ("b", "c")]
    item = Item("fed")
    feeder.items.append(item)
    engine.kick()
    await asyncio.sleep(0)
    link.release.set()
    assert await first == ("first",) and [await w for w in later] == [("b",), ("c",)]
    await tasks.idle()
    assert [[c.args[0] for c in trip] for trip in link.trips] == [["first"], ["fed", "b", "c"]]
    assert item.answer == ("fed",)


async def test_an_outage_fails_every_waiter_and_the_heartbeat_that_answers_ends_it() -> None:
    link, tasks = Scripted(), Tasks()
    link.release.set()
    engine, feeder = engine_over(link, tasks)
    link.error = rx.ConnectionError("Error 111 connecting")
    item = Item("fed")
    feeder.items.append(item)
    engine.kick()
    assert await engine.call(Call(None, (), ("x",))) is None  # unanswered, not hung
    await tasks.idle()
    assert item.failed and engine.state() == "degraded" and not engine.usable
    assert await engine.call(Call(None, (), ("y",))) is None  # down: not even sent
    sent = len(link.trips)
    link.error = None
    await engine.housekeeping()  # the heartbeat is the probe
    assert len(link.trips) == sent + 1 and engine.state() == "shared"
    assert feeder.heard_back == [True] and engine.replicas == 1
