"""What the gateway asks of a limit store without asking which one it holds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

from app.config.schema import RedisConfig
from app.limits.bucket import Limits
from app.limits.limit_store import MemoryStore
from app.limits.shared_store import SharedStore
from app.state.link import connect
from app.state.redis_engine import RedisEngine
from tests.support.procs import redis_server
from tests.support.redis_shapes import sharing


async def test_a_memory_store_is_local_and_always_admits() -> None:
    store = MemoryStore()
    await store.start()
    try:
        assert not store.shared and store.health() == {} and not store.refusing()
        store.settle("k", Limits(10, 100), 5, 0)
        await store.housekeeping()  # nothing to keep up
    finally:
        await store.close()


def test_a_redis_store_is_shared_and_refuses_only_when_down_in_closed_mode() -> None:
    for mode, down_refuses in (("open", False), ("closed", True)):
        link = connect(RedisConfig(url="redis://127.0.0.1:1/0"))  # never connected here
        store = SharedStore(RedisEngine(link, spawn=lambda coro: coro.close(), fail_mode=mode))
        assert store.shared and not store.refusing()
        assert store.health()["redis"] == {
            "up": True,
            "fail_mode": mode,
            "state": "shared",
            "replicas": 0,
            "divisor": 1,
        }
        store.engine.up = False
        health = store.health()["redis"]
        assert isinstance(health, dict)
        assert health["state"] == ("refusing" if down_refuses else "degraded")
        assert store.refusing() is down_refuses


async def test_a_memory_store_knows_no_other_replica_and_reads_its_buckets() -> None:
    store = MemoryStore()
    assert await store.replicas() == {}
    assert store.peek("k", Limits(10, 100)) == (10, 100)
    await store.reserve("k", Limits(10, 100), 30)
    assert store.peek("k", Limits(10, 100)) == (9, 70)


async def test_redis_replicas_announce_themselves_and_leave_on_close() -> None:
    tasks: set[asyncio.Task[None]] = set()

    def spawn(coro: Coroutine[Any, Any, None]) -> None:
        tasks.add(asyncio.ensure_future(coro))

    with redis_server() as server:
        cfg = RedisConfig(url=server.url)
        a = SharedStore.from_config(cfg, spawn=spawn, on_state=None, replica="host-a:1")
        b = SharedStore.from_config(cfg, spawn=spawn, on_state=None, replica="host-b:2")
        await sharing(a)  # the first heartbeat is part of starting
        await sharing(b)
        try:
            seen = await a.replicas()
            assert set(seen) == {"host-a:1", "host-b:2"}
            assert all(abs(at - time.time()) < 30 for at in seen.values())
            # Up, the buckets are in Redis: this process does not pretend to know them.
            assert a.peek("k", Limits(10, 100)) is None
        finally:
            await b.close()
        assert set(await a.replicas()) == {"host-a:1"}  # a clean stop leaves at once
        a.engine.up = False  # fail open: its own share of the buckets decides now, shown as such
        assert a.peek("k", Limits(10, 100)) is None  # not used since
        await a.reserve("k", Limits(10, 100), 30)
        assert a.peek("k", Limits(10, 100)) == (9, 70)
        await asyncio.gather(*tasks)
        await a.close()
