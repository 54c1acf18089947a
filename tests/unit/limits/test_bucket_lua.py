"""One table of token-bucket cases, run through the Python buckets (`MemoryBuckets` over
`app/limits/bucket.py`) and through `app/limits/token_bucket.lua` on a real redis-server.

The script's clock is Redis' `TIME`, which a test cannot stop, so the cases are clock-
independent by construction: every step happens at "one instant", and the Lua side is
allowed exactly the refill that the real time spent on the case could have added
(`capacity / 60` per second elapsed) and that much less waiting. Counts reported to
clients (remaining requests and tokens, allowed or not, which limit refused) must be
identical: the cases keep levels at whole numbers, so a sliver of refill never changes
them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import NamedTuple, Protocol

import pytest
import redis

from app.limits.bucket import Decision, Limits
from app.limits.limit_store import MemoryBuckets
from app.limits.shared_store import BUCKET, _decision
from tests.support.clock import FakeClock
from tests.support.procs import redis_server

KEY = "k"
NAMES = ("requests", "tokens")


class Reserve(NamedTuple):
    cost: int
    allowed: bool
    remaining: tuple[int, int]  # requests, tokens: what the x-ratelimit headers report
    limit: str | None = None  # which limit refused
    retry_after: float = 0.0
    limits: Limits | None = None  # the key's limits changed live before this step


class Settle(NamedTuple):
    tokens: int  # usage minus reservation: more used (positive) or a refund (negative)
    requests: int
    levels: tuple[float, float]  # both buckets right after it


Step = Reserve | Settle


class Case(NamedTuple):
    name: str
    limits: Limits
    steps: tuple[Step, ...]


CASES = [
    Case(
        "exhaust-then-refuse",
        Limits(3, 600),
        (
            Reserve(1, True, (2, 599)),
            Reserve(1, True, (1, 598)),
            Reserve(1, True, (0, 597)),
            Reserve(1, False, (0, 597), "requests", 20.0),  # 3/min: one every 20 s
        ),
    ),
    Case(
        "a-refused-request-uses-up-nothing",
        Limits(10, 100),
        (
            Reserve(90, True, (9, 10)),
            Reserve(50, False, (9, 10), "tokens", 24.0),  # 40 missing at 100/min
            Reserve(10, True, (8, 0)),
        ),
    ),
    Case(
        "more-than-a-minute-of-tokens-never-fits",
        Limits(10, 100),
        (
            Reserve(101, False, (10, 100), "tokens", math.inf),
            Reserve(100, True, (9, 0)),
        ),
    ),
    Case(
        "remaining-right-after-reservation",
        Limits(60, 600),
        (Reserve(60, True, (59, 540)), Reserve(540, True, (58, 0))),
    ),
    Case(
        "settling-more-usage-goes-into-bounded-debt",
        Limits(10, 100),
        (
            Reserve(50, True, (9, 50)),
            Settle(100, 0, (9, 100 - 50 - 100)),
            Reserve(1, False, (9, 0), "tokens", 30.6),  # 51 missing at 100/min
            Settle(1000, 0, (9, -100)),  # at most one capacity of debt
        ),
    ),
    Case(
        "a-refund-never-overfills",
        Limits(10, 100),
        (
            Reserve(50, True, (9, 50)),
            Settle(-1000, -5, (10, 100)),
            Reserve(100, True, (9, 0)),
        ),
    ),
    Case(
        "a-live-limit-change-keeps-the-fraction-used",
        Limits(10, 100),
        (
            Reserve(50, True, (9, 50)),
            Reserve(50, True, (17, 50), limits=Limits(20, 200)),  # 18/20 and 100/200, less 1/50
            Reserve(1, True, (7, 24), limits=Limits(10, 100)),  # 8.5/10 and 25/100, less 1/1
        ),
    ),
    Case(
        "both-short-the-longer-wait-names-the-limit",
        Limits(1, 100),
        (
            Reserve(100, True, (0, 0)),
            Reserve(50, False, (0, 0), "requests", 60.0),  # 60 s for a request, 30 s for tokens
        ),
    ),
]


class Side(Protocol):
    def reserve(self, limits: Limits, cost: int) -> Decision: ...
    def settle(self, limits: Limits, tokens: int, requests: int) -> None: ...
    def levels(self) -> tuple[float, float]: ...
    def slack(self) -> float: ...  # seconds of refill the side's clock may have added


class PythonSide:
    def __init__(self) -> None:
        self.buckets = MemoryBuckets(FakeClock())  # one instant: no refill at all

    def reserve(self, limits: Limits, cost: int) -> Decision:
        return self.buckets.reserve(KEY, limits, cost)

    def settle(self, limits: Limits, tokens: int, requests: int) -> None:
        self.buckets.settle(KEY, limits, tokens, requests)

    def levels(self) -> tuple[float, float]:
        b = self.buckets._keys[KEY]
        return b.requests.level, b.tokens.level

    def slack(self) -> float:
        return 0.0


class LuaSide:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        text = BUCKET.source()
        self.client = client
        self.script = client.register_script(text)
        self.keys = [f"{prefix}:{n}" for n in NAMES]
        self.started = time.monotonic()

    def reserve(self, limits: Limits, cost: int) -> Decision:
        raw = self.script(keys=self.keys, args=[*limits, 0, 0, cost])
        return _decision(raw, limits)  # the Redis store's own reading of the script's answer

    def settle(self, limits: Limits, tokens: int, requests: int) -> None:
        assert self.script(keys=self.keys, args=[*limits, tokens, requests]) == []

    def levels(self) -> tuple[float, float]:
        found = [self.client.hget(k, "level") for k in self.keys]
        return float(str(found[0])), float(str(found[1]))

    def slack(self) -> float:
        return time.monotonic() - self.started + 0.01


@pytest.fixture(scope="module")
def client() -> Iterator[redis.Redis]:
    with redis_server() as server:
        c = redis.Redis.from_url(server.url, decode_responses=True)
        yield c
        c.close()


def run(case: Case, side: Side) -> None:
    limits = case.limits
    for n, step in enumerate(case.steps):
        where = f"{case.name}, step {n + 1}"
        if isinstance(step, Settle):
            side.settle(limits, step.tokens, step.requests)
            slack = side.slack()
            for got, want, cap in zip(side.levels(), step.levels, limits, strict=True):
                assert want - 1e-9 <= got <= want + slack * cap / 60, (where, side.levels())
            continue
        limits = step.limits or limits
        d = side.reserve(limits, step.cost)
        decided = (d.allowed, d.limit, (d.requests_remaining, d.tokens_remaining))
        assert decided == (step.allowed, step.limit, step.remaining), where
        assert d.too_large == math.isinf(step.retry_after), where
        if math.isinf(step.retry_after):
            assert math.isinf(d.retry_after), where
        else:
            # waiting shrinks by the real time spent; Lua rounds milliseconds up
            low, high = step.retry_after - side.slack() - 1e-9, step.retry_after + 0.001
            assert low <= d.retry_after <= high, (where, d.retry_after)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_python_buckets(case: Case) -> None:
    run(case, PythonSide())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_lua_script(case: Case, client: redis.Redis) -> None:
    run(case, LuaSide(client, f"parity:{case.name}"))


def test_one_call_decides_its_reservations_in_order_after_its_settle(client: redis.Redis) -> None:
    """What the store batches into one call (the settled usage of a key, then every
    reservation that met in one round trip) decides exactly as the same steps one by one."""
    limits, costs = Limits(5, 1000), [300, 300, 500, 100, 100, 100]
    one_by_one, batched = LuaSide(client, "order:single"), LuaSide(client, "order:batched")
    one_by_one.reserve(limits, 200)
    batched.reserve(limits, 200)
    one_by_one.settle(limits, -150, 0)  # the first answer used 150 fewer tokens
    expected = [one_by_one.reserve(limits, c) for c in costs]
    raw = batched.script(keys=batched.keys, args=[*limits, -150, 0, *costs])
    got = [_decision(raw[7 * i : 7 * i + 7], limits) for i in range(len(costs))]
    summary = [(d.allowed, d.limit, d.requests_remaining, d.tokens_remaining) for d in got]
    assert summary == [
        (d.allowed, d.limit, d.requests_remaining, d.tokens_remaining) for d in expected
    ]
    assert [d.allowed for d in got] == [True, True, False, True, True, False]
