"""What the gateway asks of a limit store without asking which one it holds."""

from __future__ import annotations

import time

from app.limits.bucket import Limits
from app.limits.redis_store import RedisStore
from app.limits.store import MemoryStore
from tests.support.procs import redis_server


async def test_a_memory_store_is_local_and_always_admits() -> None:
    store = MemoryStore()
    await store.start()
    try:
        assert not store.shared and store.health() == {} and not store.refusing()
        store.settle_sync("k", Limits(10, 100), 5, 0)
        await store.save_override("k", Limits(1, 1))  # nothing to share
        assert await store.housekeeping() == {}
    finally:
        await store.close()


def test_a_redis_store_is_shared_and_refuses_only_when_down_in_closed_mode() -> None:
    for mode, down_refuses in (("open", False), ("closed", True)):
        store = RedisStore("redis://127.0.0.1:1/0", fail_mode=mode)  # never connected here
        assert store.shared and store.health() == {"redis": {"up": True, "fail_mode": mode}}
        assert not store.refusing()
        store.up = False
        assert store.health() == {"redis": {"up": False, "fail_mode": mode}}
        assert store.refusing() is down_refuses


async def test_a_memory_store_knows_no_other_replica_and_reads_its_buckets() -> None:
    store = MemoryStore()
    assert await store.replicas() == {}
    assert store.peek("k", Limits(10, 100)) == (10, 100)
    await store.reserve("k", Limits(10, 100), 30)
    assert store.peek("k", Limits(10, 100)) == (9, 70)


async def test_redis_replicas_announce_themselves_and_leave_on_close() -> None:
    with redis_server() as server:
        a = RedisStore(server.url, replica="host-a:1")
        b = RedisStore(server.url, replica="host-b:2")
        await a.start()
        await b.start()
        try:
            assert await a.replicas() == {}  # nobody said anything yet
            await a.housekeeping()
            await b.housekeeping()
            seen = await a.replicas()
            assert set(seen) == {"host-a:1", "host-b:2"}
            assert all(abs(at - time.time()) < 30 for at in seen.values())
            # Up, the buckets are in Redis: this process does not pretend to know them.
            assert a.peek("k", Limits(10, 100)) is None
        finally:
            await b.close()
        assert set(await a.replicas()) == {"host-a:1"}  # a clean stop leaves at once
        a.up = False  # fail open: its own buckets decide now, so it can show them
        assert a.peek("k", Limits(10, 100)) == (10, 100)
        await a.close()
