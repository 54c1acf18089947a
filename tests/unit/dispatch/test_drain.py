"""The Retry-After of a full or slow queue: how long the queue ahead really takes to drain,
from the measured time a slot is held, the slots and the pace (fake clock, no sleeps)."""

from __future__ import annotations

import asyncio

import pytest

from app.dispatch.dispatcher import Dispatcher
from app.dispatch.drain import DrainEstimate
from app.errors import ServiceUnavailable
from app.kinds import QueueClass
from app.limits.pacing import LocalPacer, PaceState
from app.metrics import Metrics, new_registry
from tests.support.clock import FakeClock


def test_before_any_answer_a_one_second_hold_is_assumed() -> None:
    assert DrainEstimate().seconds(ahead=7, slots=2) == pytest.approx(3.5)


def test_the_first_measured_hold_replaces_the_prior_then_a_mean_follows() -> None:
    drain = DrainEstimate()
    drain.released(3.0)
    assert drain.seconds(ahead=4, slots=2) == pytest.approx(6.0)
    for _ in range(40):
        drain.released(0.5)
    assert drain.seconds(ahead=4, slots=2) == pytest.approx(1.0, rel=0.01)


def test_the_pace_and_a_cool_down_bound_the_drain() -> None:
    drain = DrainEstimate()
    drain.released(0.1)
    # ten slots would drain 5 requests in 0.05 s; a pace of 1/s takes 5 s, after the cool-down
    assert drain.seconds(ahead=5, slots=10, pace=1.0, cooling=2.0) == pytest.approx(7.0)


def test_the_estimate_stays_within_what_sdks_honour() -> None:
    drain = DrainEstimate()
    drain.released(120.0)
    assert drain.seconds(ahead=100, slots=1) == 60.0
    fast = DrainEstimate()
    fast.released(0.0)
    assert fast.seconds(ahead=1, slots=64) == 0.05


async def test_a_full_queue_advertises_the_time_it_really_takes_to_drain() -> None:
    clock = FakeClock(0.0)
    d = Dispatcher(
        "d",
        group_size=8,
        group_window_ms=0,
        queue_capacity=4,
        max_queue_wait_ms=60_000,
        max_inflight=2,
        pacer=LocalPacer(PaceState(None, None, 1.0)),
        metrics=Metrics(new_registry()),
        clock=clock,
    )
    d.start()
    clock.advance(100.0)  # a quiet spell, then a burst
    busy = [await d.acquire("k", QueueClass.NORMAL, 1) for _ in range(2)]
    waiting = [asyncio.ensure_future(d.acquire("k", QueueClass.NORMAL, 1)) for _ in range(2)]
    await asyncio.sleep(0)
    clock.advance(1.5)  # each answer takes 1.5 s upstream
    for slot in busy:
        slot.release()
    granted = await asyncio.gather(*waiting)
    queued = [asyncio.ensure_future(d.acquire("k", QueueClass.NORMAL, 1)) for _ in range(4)]
    await asyncio.sleep(0)
    assert len(d.queue) == 4
    with pytest.raises(ServiceUnavailable) as refused:
        await d.acquire("k", QueueClass.NORMAL, 1)
    # four ahead and the newcomer, two slots, 1.5 s each: 3.75 s (after a quiet spell the
    # rate of releases per second over the last window said a minute)
    assert refused.value.code == "queue_full"
    assert refused.value.retry_after == pytest.approx(3.75)
    assert refused.value.response_headers()["retry-after"] == "4"
    for task in queued:
        task.cancel()
    for slot in granted:
        slot.release()
    await d.stop()
