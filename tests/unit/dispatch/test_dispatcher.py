"""Dispatcher behaviour on a real event loop, without sleeps in the tests themselves."""

from __future__ import annotations

import asyncio

import pytest

from app.dispatch.dispatcher import Dispatcher
from app.errors import ServiceUnavailable
from app.kinds import QueueClass
from app.limits.pacing import LocalPacer, PaceState
from app.metrics import Metrics, new_registry


def make(**kw: object) -> tuple[Dispatcher, Metrics]:
    metrics = Metrics(new_registry())
    opts: dict[str, object] = dict(
        group_size=4,
        group_window_ms=0,
        queue_capacity=100,
        max_queue_wait_ms=5000,
        max_inflight=100,
        pacer=LocalPacer(PaceState(None, None, 1.0)),
        metrics=metrics,
    )
    opts.update(kw)
    d = Dispatcher("d", **opts)  # type: ignore[arg-type]
    d.start()
    return d, metrics


def batches(metrics: Metrics) -> list[tuple[float, float]]:
    """(le, cumulative count) of the batch-size histogram."""
    out = []
    for family in metrics.registry.collect():
        if family.name == "tokengate_batch_size":
            out = [
                (float(s.labels["le"]), s.value)
                for s in family.samples
                if s.name.endswith("_bucket")
            ]
    return out


async def test_a_free_slot_is_taken_at_once_even_when_the_domain_is_busy() -> None:
    # A long window: any request that went through the queue would wait for it.
    d, metrics = make(group_size=4, group_window_ms=10_000, max_inflight=8)
    slots = [await asyncio.wait_for(d.acquire("k", QueueClass.NORMAL, 1), 1) for _ in range(8)]
    assert d.inflight == 8 and len(d.queue) == 0
    assert dict(batches(metrics))[1.0] == 8  # each went alone, none waited for a group
    for s in slots:
        s.release()
    await d.stop()


async def test_queued_requests_are_released_in_groups_of_at_most_batch_size() -> None:
    d, metrics = make(group_size=4, max_inflight=12)
    held = [await d.acquire("k", QueueClass.NORMAL, 1) for _ in range(12)]  # the domain is full
    waiters = [asyncio.ensure_future(d.acquire("k", QueueClass.NORMAL, 1)) for _ in range(10)]
    await asyncio.sleep(0)
    assert len(d.queue) == 10
    for s in held:  # twelve slots free up at once: the queue goes out in groups
        s.release()
    slots = await asyncio.gather(*waiters)
    assert len(slots) == 10 and d.inflight == 10
    hist = dict(batches(metrics))
    assert hist[4.0] == hist[float("inf")]  # no group above batch_size
    assert hist[4.0] - hist[2.0] >= 2  # groups did fill: at least two of 3-4
    for s in slots:
        s.release()
    assert d.inflight == 0
    await d.stop()


async def test_batch_work_over_its_share_queues_behind_a_free_slot() -> None:
    d, _ = make(max_inflight=4, batch_share=0.5)
    batch = [await asyncio.wait_for(d.acquire("b", QueueClass.BATCH, 1), 1) for _ in range(2)]
    third = asyncio.ensure_future(d.acquire("b", QueueClass.BATCH, 1))
    await asyncio.sleep(0.01)
    assert not third.done() and len(d.queue) == 1  # 2 of 4 slots is the batch share
    interactive = await asyncio.wait_for(d.acquire("i", QueueClass.NORMAL, 1), 1)  # not held back
    batch[0].release()
    (await asyncio.wait_for(third, 1)).release()
    for s in (batch[1], interactive):
        s.release()
    await d.stop()


async def test_max_inflight_is_never_exceeded() -> None:
    d, _ = make(max_inflight=3, group_size=16)
    peak = 0

    async def work() -> None:
        nonlocal peak
        slot = await d.acquire("k", QueueClass.NORMAL, 1)
        peak = max(peak, d.inflight)
        await asyncio.sleep(0)
        slot.release()

    await asyncio.gather(*(work() for _ in range(30)))
    assert peak == 3
    await d.stop()


async def test_queue_full_raises_503_with_retry_after() -> None:
    d, _ = make(max_inflight=1, queue_capacity=2)
    held = await d.acquire("k", QueueClass.NORMAL, 1)
    waiting = [asyncio.ensure_future(d.acquire("k", QueueClass.NORMAL, 1)) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(ServiceUnavailable) as err:
        await d.acquire("k", QueueClass.NORMAL, 1)
    assert err.value.code == "queue_full" and err.value.retry_after is not None
    assert 0 < err.value.retry_after <= 60
    held.release()
    for w in waiting:
        (await w).release()
    await d.stop()


async def test_queue_wait_expiry_is_503() -> None:
    d, _ = make(max_inflight=1, max_queue_wait_ms=30)
    held = await d.acquire("k", QueueClass.NORMAL, 1)
    with pytest.raises(ServiceUnavailable) as err:
        await d.acquire("k", QueueClass.NORMAL, 1)
    assert err.value.code == "queue_timeout"
    assert len(d.queue) == 0
    held.release()
    await d.stop()


async def test_time_already_waited_in_another_line_counts_against_max_queue_wait() -> None:
    """A request that spent its whole `max_queue_wait_ms` in its key's `max_concurrent`
    line gets no second budget in the domain's queue."""
    d, _ = make(max_inflight=1, max_queue_wait_ms=10_000)
    held = await d.acquire("k", QueueClass.NORMAL, 1)
    with pytest.raises(ServiceUnavailable) as err:
        await d.acquire("k", QueueClass.NORMAL, 1, waited=10.0)
    assert err.value.code == "queue_timeout"
    fresh = asyncio.ensure_future(d.acquire("k", QueueClass.NORMAL, 1, waited=9.0))
    await asyncio.sleep(0.05)
    assert not fresh.done()  # a second of the budget is left: still waiting
    held.release()
    (await fresh).release()
    await d.stop()


async def test_cancelled_waiter_leaves_the_queue_and_is_never_granted() -> None:
    d, _ = make(max_inflight=1)
    held = await d.acquire("k", QueueClass.NORMAL, 1)
    waiter = asyncio.ensure_future(d.acquire("gone", QueueClass.NORMAL, 1))
    await asyncio.sleep(0)
    assert len(d.queue) == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(d.queue) == 0
    held.release()
    await asyncio.sleep(0)
    assert d.inflight == 0
    await d.stop()


async def test_pacing_holds_requests_over_the_quota() -> None:
    # 60/min over a 1 s window: one request per second with a burst of ~1.
    d, _ = make(pacer=LocalPacer(PaceState(60, None, 1.0)), max_inflight=10)
    loop = asyncio.get_running_loop()
    start = loop.time()
    a = await d.acquire("k", QueueClass.NORMAL, 1)
    b = await d.acquire("k", QueueClass.NORMAL, 1)
    assert loop.time() - start >= 0.9  # the second waited for the quota to refill
    a.release()
    b.release()
    await d.stop()


async def test_wait_idle_returns_when_drained() -> None:
    d, _ = make(max_inflight=1)
    held = await d.acquire("k", QueueClass.NORMAL, 1)
    waiter = asyncio.ensure_future(d.acquire("k", QueueClass.NORMAL, 1))
    idle = asyncio.ensure_future(d.wait_idle())
    await asyncio.sleep(0)
    assert not idle.done()
    held.release()
    (await waiter).release()
    await asyncio.wait_for(idle, 1)
    await d.stop()
