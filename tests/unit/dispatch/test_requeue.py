"""A request the upstream refused with 429 goes back to the head of its class, its key
refunded, and waits out the domain's cool-down (queue in isolation, then the
dispatcher on a real event loop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from app.dispatch.dispatcher import Dispatcher
from app.dispatch.job import Job
from app.dispatch.queue import DomainQueue
from app.errors import ServiceUnavailable
from app.kinds import QueueClass
from app.limits.pacing import LocalPacer, PaceState, Throttle
from app.metrics import Metrics, new_registry
from tests.support.clock import FakeClock
from tests.support.waiting import eventually


def job(key: str, priority: QueueClass = QueueClass.NORMAL, cost: int = 100) -> Job:
    return Job(key, priority, cost, 0.0, granted=asyncio.get_running_loop().create_future())


def keys(q: DomainQueue, n: int) -> list[str]:
    out = []
    for _ in range(n):
        popped = q.pop()
        assert popped is not None
        out.append(popped.key)
    return out


def two_keys() -> DomainQueue:
    q = DomainQueue(100)
    for _ in range(4):
        q.push(job("a"))
        q.push(job("b"))
    return q


async def test_a_requeued_job_goes_next_and_its_key_keeps_its_fair_share() -> None:
    q = two_keys()
    first = q.pop()
    assert first is not None and first.key == "a"
    q.push_front(first)  # the upstream said 429
    # a goes again at once, and is not charged twice: a and b still alternate.
    assert keys(q, 8) == ["a", "b", "a", "b", "a", "b", "a", "b"]


async def test_without_the_refund_the_key_would_lose_turns() -> None:
    # The control for the test above: a job pushed back as a new arrival waits its turn.
    q = two_keys()
    first = q.pop()
    assert first is not None
    q.push(first)
    assert keys(q, 3) == ["b", "a", "b"]


async def test_a_requeued_job_keeps_its_class_and_ignores_capacity() -> None:
    q = DomainQueue(1)
    low = job("l", QueueClass.LOW)
    q.push(low)
    popped = q.pop()
    assert popped is low
    high = job("h", QueueClass.HIGH)
    assert q.push(high)
    assert not q.push(job("x"))  # full
    q.push_front(low)  # admitted already: a requeue never fails
    assert len(q) == 2
    assert keys(q, 2) == ["h", "l"]  # the higher class still goes first


async def test_a_cancelled_requeued_job_is_skipped() -> None:
    q = DomainQueue(10)
    a, b = job("a"), job("b")
    q.push(a)
    q.push(b)
    popped = q.pop()
    assert popped is a
    q.push_front(a)
    q.cancel(a)
    assert len(q) == 1 and keys(q, 1) == ["b"] and q.pop() is None


def dispatcher(
    pacer: LocalPacer, max_wait_ms: int = 5000, clock: Callable[[], float] = time.monotonic
) -> Dispatcher:
    d = Dispatcher(
        "d",
        group_size=4,
        group_window_ms=0,
        queue_capacity=100,
        max_queue_wait_ms=max_wait_ms,
        max_inflight=4,
        pacer=pacer,
        metrics=Metrics(new_registry()),
        clock=clock,
    )
    d.start()
    return d


async def test_requeued_requests_wait_for_the_cool_down_and_go_before_newcomers() -> None:
    # The pacer's and the dispatcher's clock is the test's: the cool-down lasts until the
    # test moves it on, however long the machine takes meanwhile.
    clock = FakeClock(100.0)
    pacer = LocalPacer(PaceState(None, None, 1.0), clock)
    d = dispatcher(pacer, clock=clock)
    slot = await d.acquire("a", QueueClass.NORMAL, 1)
    await pacer.throttled(Throttle(0.2, slot.sent_at))
    again = asyncio.ensure_future(d.requeue(slot))
    newcomer = asyncio.ensure_future(d.acquire("b", QueueClass.NORMAL, 1))
    await asyncio.sleep(0.05)
    assert not again.done() and not newcomer.done()  # cooling: nobody goes, no fast path
    order: list[str] = []
    again.add_done_callback(lambda _: order.append("requeued"))
    newcomer.add_done_callback(lambda _: order.append("newcomer"))
    clock.advance(0.2)  # the cool-down is over
    first = await again
    second = await newcomer
    assert order == ["requeued", "newcomer"]
    first.release()
    second.release()
    await d.stop()


async def test_the_queue_wait_counts_from_the_first_arrival() -> None:
    pacer = LocalPacer(PaceState(None, None, 1.0))
    d = dispatcher(pacer, max_wait_ms=300)
    slot = await d.acquire("a", QueueClass.NORMAL, 1)
    await asyncio.sleep(0.2)
    await pacer.throttled(Throttle(0.25, slot.sent_at))  # ends within 0.3 s of the start?
    with pytest.raises(ServiceUnavailable) as refused:
        await d.requeue(slot)  # 0.2 + 0.25 > 0.3: no use waiting
    assert refused.value.code == "upstream_rate_limited"
    await d.stop()


async def test_only_max_queue_wait_ends_a_requeued_wait() -> None:
    clock = FakeClock(100.0)
    pacer = LocalPacer(PaceState(None, None, 1.0), clock)
    d = dispatcher(pacer, max_wait_ms=300, clock=clock)
    slot2 = await d.acquire("b", QueueClass.NORMAL, 1)
    await pacer.throttled(Throttle(0.05, slot2.sent_at))
    with pytest.raises(ServiceUnavailable) as expired:
        # Fits the deadline, but the domain cools down again meanwhile, and the test's
        # clock never lets that cool-down end: only the queue's own deadline can.
        await asyncio.gather(d.requeue(slot2), _cool_again(pacer))
    assert expired.value.code == "queue_timeout"
    await d.stop()


async def _cool_again(pacer: LocalPacer) -> None:
    await asyncio.sleep(0)  # the requeue has checked the deadline and waits
    pacer.state._cool(pacer.now() + 3600)


async def test_requeues_after_later_turns_do_not_let_a_key_starve_the_others() -> None:
    # Two of a's requests are in flight and the older one gets a 429, again and again:
    # its charge must come on top of the newer one's, or every requeue wins a a free turn.
    q = DomainQueue(1000)
    for _ in range(40):
        q.push(job("a"))
        q.push(job("b"))
    order, in_flight = [], []
    for _ in range(40):
        popped = q.pop()
        assert popped is not None
        order.append(popped.key)
        if popped.key == "a":
            in_flight.append(popped)
            if len(in_flight) == 2:
                q.push_front(in_flight[0])
                in_flight.clear()
    # Per cycle a is served twice (once again after its 429) and b once: equal new work.
    assert order.count("b") >= 12, "".join(order)


class GatedPacer:
    """A pacer whose bookings wait (like a Redis round trip) until the test opens the
    gate, and that lets arrivals take a free slot at once: the interleaving the test
    needs, with no clock to race."""

    shared = True
    state = PaceState(None, None, 1.0)

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.calls = 0
        self.block_from: int | None = None  # the first booking (1-based) that waits
        self.waiting = 0

    def bounded(self) -> bool:
        return True

    def ready(self, tokens: int) -> bool:
        return True

    def cooling(self) -> float:
        return 0.0

    async def reserve(self, requests: int, tokens: int) -> float:
        self.calls += 1
        if self.block_from is not None and self.calls >= self.block_from:
            self.waiting += 1
            await self.gate.wait()
        return 0.0


async def test_a_slot_taken_during_the_pacing_round_trip_is_not_granted_twice() -> None:
    pacer = GatedPacer()
    d = Dispatcher(
        "d",
        group_size=4,
        group_window_ms=0,
        queue_capacity=10,
        max_queue_wait_ms=5000,
        max_inflight=2,
        pacer=pacer,  # type: ignore[arg-type]
        metrics=Metrics(new_registry()),
    )
    d.start()
    first = await d.acquire("a", QueueClass.NORMAL, 1)
    second = await d.acquire("b", QueueClass.NORMAL, 1)
    queued = asyncio.ensure_future(d.acquire("c", QueueClass.NORMAL, 1))
    await eventually(lambda: len(d.queue) == 1, "c queued")
    # the group's booking goes through; `c`'s own (after it is popped) waits at the gate
    pacer.block_from = pacer.calls + 2
    first.release()  # the loop books for the group, pops `c` and books for it
    await eventually(lambda: pacer.waiting == 1, "c's booking under way")
    # the queue is empty meanwhile: an arrival takes the free slot (and books too)
    arriving = asyncio.ensure_future(d.acquire("d", QueueClass.NORMAL, 1))
    await eventually(lambda: pacer.waiting == 2, "the arrival's booking under way")
    pacer.gate.set()  # both round trips answer
    arrival = await arriving
    await eventually(lambda: len(d.queue) == 1, "c back in the queue")
    assert d.inflight == 2 and not queued.done()  # `c` went back, it did not overbook
    second.release()
    third = await asyncio.wait_for(queued, 1)
    assert d.inflight == 2
    for slot in (arrival, third):
        slot.release()
    await d.stop()
