"""Per-key concurrency caps that queue: the key's line is FIFO, a lease ending lets the
next one in, the wait ends in 503 queue_timeout with Retry-After, a client that leaves
gives its place up, and keys do not wait for each other."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from app.errors import ServiceUnavailable
from app.limits.concurrency import ConcurrencyGate, Lease, LocalSlots

tasks: set[asyncio.Task[Any]] = set()


def spawn(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


def gate() -> ConcurrencyGate:
    return ConcurrencyGate(LocalSlots(), spawn)


async def test_requests_past_the_cap_wait_in_order_for_a_lease_to_end() -> None:
    g = gate()
    held = [(await g.acquire("k", 2, 5.0))[0] for _ in range(2)]
    order: list[int] = []

    async def later(n: int) -> Lease:
        lease, waited = await g.acquire("k", 2, 5.0)
        order.append(n)
        assert waited > 0
        return lease

    waiting = [asyncio.ensure_future(later(n)) for n in range(3)]
    await asyncio.sleep(0.01)
    assert order == [] and g.waiting("k") == 3
    other, _ = await g.acquire("other-key", 2, 5.0)  # another key does not wait behind k
    held[0].release()
    await asyncio.sleep(0.01)
    assert order == [0]
    held[1].release()
    await asyncio.sleep(0.01)
    assert order == [0, 1]
    first = await waiting[0]
    first.release()
    first.release()  # idempotent: releases one slot only
    await asyncio.sleep(0.01)
    assert order == [0, 1, 2]
    for lease in [await waiting[1], await waiting[2], other]:
        lease.release()
    assert g.slots.held == {} and g.held == {}  # type: ignore[attr-defined]


async def test_the_wait_ends_in_503_queue_timeout_with_retry_after() -> None:
    g = gate()
    lease, _ = await g.acquire("k", 1, 5.0)
    with pytest.raises(ServiceUnavailable) as err:
        await g.acquire("k", 1, 0.05)
    assert err.value.code == "queue_timeout" and err.value.retry_after is not None
    assert "max_concurrent" in err.value.message and g.waiting("k") == 0
    lease.release()
    again, waited = await g.acquire("k", 1, 0.05)
    assert waited == 0.0
    again.release()


async def test_a_waiter_that_leaves_gives_its_place_to_the_next() -> None:
    g = gate()
    lease, _ = await g.acquire("k", 1, 5.0)
    gone = asyncio.ensure_future(g.acquire("k", 1, 5.0))
    next_one = asyncio.ensure_future(g.acquire("k", 1, 5.0))
    await asyncio.sleep(0.01)
    gone.cancel()
    await asyncio.sleep(0.01)
    assert g.waiting("k") == 1
    lease.release()
    granted, _ = await asyncio.wait_for(next_one, 1)
    granted.release()


async def test_live_caps_override_the_configured_one() -> None:
    g = gate()
    assert g.cap("k", 4) == 4 and g.cap("k", None) is None
    await g.set_cap("k", 1)
    assert g.cap("k", 4) == 1
