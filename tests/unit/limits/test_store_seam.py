"""What the gateway asks of a limit store without asking which one it holds."""

from __future__ import annotations

from app.config.schema import RedisConfig
from app.limits.bucket import Limits
from app.limits.redis_conn import connect
from app.limits.redis_store import RedisStore
from app.limits.store import MemoryStore


async def test_a_memory_store_is_local_and_always_admits() -> None:
    store = MemoryStore()
    await store.start()
    try:
        assert not store.shared and store.health() == {} and not store.refusing()
        store.settle("k", Limits(10, 100), 5, 0)
        await store.save_override("k", Limits(1, 1))  # nothing to share
        assert await store.housekeeping() == {}
    finally:
        await store.close()


def test_a_redis_store_is_shared_and_refuses_only_when_down_in_closed_mode() -> None:
    for mode, down_refuses in (("open", False), ("closed", True)):
        link = connect(RedisConfig(url="redis://127.0.0.1:1/0"))  # never connected here
        store = RedisStore(link, spawn=lambda coro: coro.close(), fail_mode=mode)
        assert store.shared and not store.refusing()
        assert store.health()["redis"] == {
            "up": True,
            "fail_mode": mode,
            "state": "shared",
            "replicas": 0,
            "divisor": 1,
        }
        store.up = False
        health = store.health()["redis"]
        assert isinstance(health, dict)
        assert health["state"] == ("refusing" if down_refuses else "degraded")
        assert store.refusing() is down_refuses
