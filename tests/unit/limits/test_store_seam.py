"""What the gateway asks of a limit store without asking which one it holds."""

from __future__ import annotations

from app.limits.bucket import Limits
from app.limits.redis_store import RedisStore
from app.limits.store import MemoryStore


async def test_a_memory_store_is_local_and_always_admits() -> None:
    store = MemoryStore()
    await store.start()
    try:
        assert not store.shared and store.health() == {} and not store.refusing()
        store.settle_sync("k", Limits(10, 100), 5, 0)
        await store.save_override("k", Limits(1, 1))  # nothing to share
        await store.delete_override("k")
        assert await store.housekeeping() is None  # nothing learned: keep what is held
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
