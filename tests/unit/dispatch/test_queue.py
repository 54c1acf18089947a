"""Queue ordering: strict priority between classes, deficit round robin within one."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from app.dispatch.job import Job
from app.dispatch.queue import DomainQueue
from app.kinds import QueueClass


def job(key: str, priority: QueueClass = QueueClass.NORMAL, cost: int = 100) -> Job:
    return Job(key, priority, cost, 0.0, granted=asyncio.get_running_loop().create_future())


def drain(q: DomainQueue) -> list[Job]:
    out = []
    while (j := q.pop()) is not None:
        out.append(j)
    return out


async def test_higher_class_always_first() -> None:
    q = DomainQueue(100)
    lows = [job("l", QueueClass.LOW) for _ in range(20)]
    for j in lows:
        q.push(j)
    normal, high = job("n"), job("h", QueueClass.HIGH)
    q.push(normal)
    q.push(high)
    assert drain(q)[:2] == [high, normal]


async def test_round_robin_between_keys_of_one_class() -> None:
    q = DomainQueue(1000)
    for _ in range(50):
        q.push(job("flood"))
    for _ in range(5):
        q.push(job("quiet"))
    first_ten = [j.key for j in drain(q)[:10]]
    assert Counter(first_ten) == {"flood": 5, "quiet": 5}


async def test_fair_queuing_shares_tokens_not_requests() -> None:
    q = DomainQueue(1000)
    for _ in range(40):
        q.push(job("big", cost=1000))
    for _ in range(400):
        q.push(job("small", cost=100))
    served: Counter[str] = Counter()
    for j in drain(q)[:110]:
        served[j.key] += j.cost
    assert abs(served["big"] - served["small"]) <= 1000


async def test_fifo_within_a_key() -> None:
    q = DomainQueue(10)
    jobs = [job("a") for _ in range(5)]
    for j in jobs:
        q.push(j)
    assert drain(q) == jobs


async def test_capacity_and_cancel_keep_the_count_exact() -> None:
    q = DomainQueue(3)
    a, b, c = job("a"), job("b"), job("c")
    assert q.push(a) and q.push(b) and q.push(c)
    assert not q.push(job("d"))
    q.cancel(b)
    assert len(q) == 2
    q.cancel(b)  # twice is harmless
    assert len(q) == 2
    assert q.push(job("e"))
    popped = drain(q)
    assert b not in popped and len(popped) == 3 and len(q) == 0


async def test_cancel_after_pop_does_not_touch_the_count() -> None:
    q = DomainQueue(3)
    a = job("a")
    q.push(a)
    q.push(job("b"))
    assert q.pop() is a
    q.cancel(a)
    assert len(q) == 1


@pytest.mark.parametrize("huge", [10**7])
async def test_a_huge_request_still_gets_its_turn(huge: int) -> None:
    q = DomainQueue(100)
    q.push(job("huge", cost=huge))
    for _ in range(50):
        q.push(job("tiny", cost=10))
    q.push(job("huge", cost=10))
    order = [j.key for j in drain(q)]
    assert order[0] == "huge"  # it came first: its size does not starve it
    assert order[-1] == "huge"  # but its key's next request waits until the others caught up


async def test_free_dispatch_slots_count_as_room() -> None:
    q = DomainQueue(2)
    assert q.push(job("a")) and q.push(job("b"))
    assert not q.push(job("c"))
    assert q.push(job("c"), slack=1)  # one slot is free: the dispatcher takes one at once
    assert not q.push(job("d"), slack=1)
