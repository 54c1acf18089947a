"""What the gateway asks of a limit store without asking which one it holds."""

from __future__ import annotations

from pathlib import Path

from app.limits.bucket import Limits
from app.limits.ledger import LocalLedger, UsageEntry
from app.limits.redis_store import RedisStore
from app.limits.store import MemoryStore


async def test_a_memory_store_is_local_always_admits_and_flushes_its_ledger(
    tmp_path: Path,
) -> None:
    ledger = LocalLedger(tmp_path / "ledger.db", 60)
    store = MemoryStore(ledger)
    await store.start()
    try:
        assert not store.shared and store.health() == {} and not store.refusing()
        store.settle_sync("k", Limits(10, 100), 5, 0, UsageEntry("k", "m", prompt_tokens=5))
        await store.save_override("k", Limits(1, 1))  # nothing to share
        assert await store.housekeeping() == {}
        assert [r.prompt_tokens for r in await LocalLedger(tmp_path / "ledger.db").rows()] == [5]
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
