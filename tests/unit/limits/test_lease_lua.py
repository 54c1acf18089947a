"""`lease.lua` on a real redis-server, through two shared stores (two replicas): a key's
cap holds across both, a lease that is not renewed expires (a dead replica's slots come
back), live caps reach every replica, and with Redis gone each counts its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from app.config.schema import RedisConfig
from app.limits.concurrency import SharedSlots
from app.limits.shared_store import SharedStore
from tests.support.procs import Redis, redis_server
from tests.support.redis_shapes import sharing

tasks: set[asyncio.Task[None]] = set()


def spawn(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[SharedStore, SharedStore, Redis]]:
    with redis_server() as server:
        cfg = RedisConfig(url=server.url)
        stores = tuple(
            SharedStore.from_config(cfg, spawn=spawn, on_state=None, replica=f"r{i}")
            for i in range(2)
        )
        for store in stores:
            await sharing(store)
        yield stores[0], stores[1], server
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for store in stores:
            await store.close()


async def test_the_cap_holds_across_replicas_and_a_release_frees_a_slot(
    pair: tuple[SharedStore, SharedStore, Redis],
) -> None:
    a, b = (SharedSlots(s.engine, "t:") for s in pair[:2])
    assert await a.take("k", 2, "a1") and await b.take("k", 2, "b1")
    assert not await a.take("k", 2, "a2") and not await b.take("k", 2, "b2")
    assert await a.take("other", 2, "a3")  # per key
    await b.give_back("k", "b1")
    assert await a.take("k", 2, "a2")


async def test_leases_expire_unless_renewed(pair: tuple[SharedStore, SharedStore, Redis]) -> None:
    """A renewal far longer than the test keeps its lease; a lease nobody renews is gone
    once its time is up. Slowness only lengthens the wait: it holds at any speed."""
    store = SharedSlots(pair[0].engine, "t:")
    kept, lost = "t:conc:{kept}", "t:conc:{lost}"
    assert await store.lease(kept, ["take", 1, 150, "dead-replica"]) == 1
    assert await store.lease(lost, ["take", 1, 150, "dead-replica"]) == 1
    assert await store.lease(kept, ["take", 1, 150, "x"]) == 0
    assert await store.lease(kept, ["renew", 60_000, "dead-replica"]) == 1
    await asyncio.sleep(0.3)  # past the 150 ms the unrenewed lease was given
    assert await store.lease(kept, ["take", 1, 150, "x"]) == 0  # renewed: still held
    assert await store.lease(lost, ["take", 1, 150, "x"]) == 1  # not renewed: expired


async def test_live_caps_are_shared(pair: tuple[SharedStore, SharedStore, Redis]) -> None:
    a, b = (SharedSlots(s.engine, "t:") for s in pair[:2])
    await a.save_cap("alice", 3)
    await a.save_cap("bob", 1)
    assert await b.load_caps() == {"alice": 3, "bob": 1}
    await b.drop_cap("alice")  # cleared on one replica, gone for the other
    assert await a.load_caps() == {"bob": 1}


async def test_without_redis_each_replica_counts_its_own(
    pair: tuple[SharedStore, SharedStore, Redis],
) -> None:
    store, _, server = pair
    slots = SharedSlots(store.engine, "t:")
    server.kill()
    assert await slots.take("k", 1, "l1")
    assert not await slots.take("k", 1, "l2")
    await slots.give_back("k", "l1")  # released locally, without Redis
    assert await slots.take("k", 1, "l2")
    assert await slots.load_caps() is None  # unknown, not "none": the caps known stay
