"""The Redis store on a real redis-server: round trips shared by concurrent requests,
limits exact across processes, an outage served at each replica's share and charged
on recovery, fail closed, a misconfigured Redis, and a client that raises anything."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import exceptions as rx

from app.config.schema import RedisConfig
from app.errors import ServiceUnavailable
from app.limits.bucket import Limits
from app.limits.shared_store import SharedStore
from app.state.link import Call, RedisLink, connect
from app.state.redis_engine import SETTLE_LAG, RedisEngine, RedisState
from tests.support.redis_shapes import Server, server
from tests.support.refill import refilled

LIMITS = Limits(requests_per_minute=50, tokens_per_minute=100_000)
# Slow refills, for the cases that tell a settle from none by what remains
FEW_TOKENS = Limits(requests_per_minute=50, tokens_per_minute=6_000)  # 100 a second
FEW_REQUESTS = Limits(requests_per_minute=6, tokens_per_minute=100_000)  # one in 10 s


class Refill:
    """What a key's buckets may have refilled since the test started them (Redis' clock,
    which no test can stop: see tests/support/refill.py)."""

    def __init__(self, limits: Limits) -> None:
        self.limits, self.started = limits, time.monotonic()

    def requests(self) -> int:
        return refilled(self.started, self.limits.requests_per_minute)

    def tokens(self) -> int:
        return refilled(self.started, self.limits.tokens_per_minute)


class Tasks:
    """The lifecycle owner's part: runs what the store spawns, and waits for it."""

    def __init__(self) -> None:
        self.running: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def idle(self) -> None:
        while self.running:
            await asyncio.gather(*self.running)


@pytest.fixture(scope="module")
def redis_aof(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = server(tmp_path_factory.mktemp("redis"), persist=True)
    yield s
    s.kill()


@pytest.fixture
async def make(redis_aof: Server) -> AsyncIterator[Callable[..., Coroutine[Any, Any, SharedStore]]]:
    redis_aof.cli("FLUSHALL")
    made: list[SharedStore] = []
    tasks = Tasks()

    async def build(**kw: Any) -> SharedStore:
        states: list[RedisState] = []
        cfg = RedisConfig(url=redis_aof.url, **kw)
        replica = f"replica-{len(made)}"  # one process plays several here
        store = SharedStore.from_config(
            cfg, spawn=tasks.spawn, on_state=states.append, replica=replica
        )
        store.states = states  # type: ignore[attr-defined]
        store.tasks = tasks  # type: ignore[attr-defined]
        await store.start()
        made.append(store)
        return store

    yield build
    if redis_aof.proc is None:
        redis_aof.start()
    await tasks.idle()
    for store in made:
        await store.close()


def commands(s: Server, name: str) -> int:
    for line in s.cli("INFO", "commandstats").splitlines():
        if line.startswith(f"cmdstat_{name}:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


async def test_concurrent_reservations_of_a_key_are_exact_in_one_round_trip(
    make: Any, redis_aof: Server
) -> None:
    store = await make()
    before = commands(redis_aof, "evalsha")
    decisions = await asyncio.gather(*(store.reserve("k", LIMITS, 10) for _ in range(200)))
    assert sum(d.allowed for d in decisions) == 50
    assert commands(redis_aof, "evalsha") - before == 1  # 200 requests, one call
    remaining = [d.requests_remaining for d in decisions if d.allowed]
    assert sorted(remaining) == list(range(50))  # decided one by one, in order


async def test_settles_ride_with_the_next_reservation_or_go_within_the_lag(
    make: Any, redis_aof: Server
) -> None:
    store = await make()
    refill = Refill(FEW_TOKENS)
    one = await store.reserve("k", FEW_TOKENS, 1000)
    assert one.tokens_remaining == 5_000
    store.settle("k", FEW_TOKENS, -990, 0)  # the answer used 10 of the 1000 reserved
    before = commands(redis_aof, "evalsha")
    two = await store.reserve("k", FEW_TOKENS, 1000)
    # 4,990 with the settle, 4,000 without (plus what refilled meanwhile: 100 a second)
    assert 5_000 - 10 <= two.tokens_remaining <= 5_000 - 10 + refill.tokens()
    assert commands(redis_aof, "evalsha") - before == 1  # the settle rode along
    store.settle("k", FEW_TOKENS, -1000, -1)  # refunded entirely, nothing reserves after it
    await asyncio.sleep(SETTLE_LAG * 4)
    await store.tasks.idle()
    level = float(redis_aof.cli("HGET", "tokengate:rl:{k}:tokens", "level"))
    assert 5_990 <= level <= min(6_000, 5_990 + refill.tokens())


async def test_a_request_that_leaves_while_waiting_is_refunded(
    make: Any, redis_aof: Server
) -> None:
    store = await make()
    waiting = asyncio.ensure_future(store.reserve("k", LIMITS, 500))
    await asyncio.sleep(0)  # enqueued; its round trip is spawned, not yet answered
    waiting.cancel()
    await store.tasks.idle()  # admitted in Redis for nobody: the refund is pending
    await asyncio.sleep(SETTLE_LAG * 4)
    await store.tasks.idle()
    fresh = await store.reserve("k", LIMITS, 1)
    assert (fresh.requests_remaining, fresh.tokens_remaining) == (49, 99_999)


async def test_replicas_see_each_other_and_an_outage_gives_each_its_share(
    make: Any, redis_aof: Server
) -> None:
    """Two replicas drain half of a key's bucket, Redis dies: each then admits a quarter
    of what was left (its half of the half), never the whole limit; when Redis is back
    (its data kept by AOF) what they admitted meanwhile is charged to the shared bucket."""
    one, two = await make(), await make()
    refill = Refill(LIMITS)
    for store in (one, two):
        await store.housekeeping()
    assert one.fallback.replicas == two.fallback.replicas == 2
    await asyncio.gather(*(s.reserve("k", LIMITS, 10) for s in (one, two) for _ in range(12)))
    await one.reserve("k", LIMITS, 10)
    await two.reserve("k", LIMITS, 10)  # both have seen the shared level lately: 24 left
    redis_aof.kill()
    alone = [await s.reserve("k", LIMITS, 10) for s in (one, two) for _ in range(40)]
    assert one.engine.state() == two.engine.state() == "degraded"
    assert one.health()["redis"] == {
        "up": False, "fail_mode": "open", "state": "degraded", "replicas": 2, "divisor": 2,
    }  # fmt: skip
    assert one.states[-1] == RedisState(up=False, degraded=True, misconfigured=False, replicas=2)
    admitted_alone = sum(d.allowed for d in alone)
    # 24 left in Redis: 12 each (+ what refilled since: each its share of the rate)
    assert 23 <= admitted_alone <= 26 + refill.requests()
    redis_aof.start()
    for store in (one, two):
        await store.housekeeping()  # the heartbeat ends the outage
        assert store.engine.state() == "shared"
    await asyncio.sleep(SETTLE_LAG * 4)
    await one.tasks.idle()
    after = await one.reserve("k", LIMITS, 10)
    # the outage's admissions are on the books
    assert after.requests_remaining <= 2 + refill.requests()


async def test_fail_closed_refuses_with_503_while_down(make: Any, redis_aof: Server) -> None:
    store = await make(fail_mode="closed")
    redis_aof.kill()
    with pytest.raises(ServiceUnavailable) as err:
        await store.reserve("k", LIMITS, 1)
    assert err.value.code == "redis_unavailable" and store.refusing()
    assert store.health()["redis"]["state"] == "refusing"


async def test_a_cluster_node_configured_as_one_server_is_a_loud_config_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = server(tmp_path, extra=("--cluster-enabled", "yes"))
    try:
        tasks, states = Tasks(), list[RedisState]()
        cfg = RedisConfig(url=node.url)
        store = SharedStore.from_config(cfg, spawn=tasks.spawn, on_state=states.append)
        with caplog.at_level(logging.ERROR, "tokengate.redis"):
            await store.start()
            for _ in range(5):
                assert (await store.reserve("k", LIMITS, 1)).allowed  # served: fail open
                await store.housekeeping()  # no call that could raise
        assert store.engine.state() == "misconfigured" and not store.refusing()
        assert states[-1].misconfigured and states[-1].degraded and states[-1].up
        loud = [r for r in caplog.records if "MISCONFIGURED" in r.getMessage()]
        assert len(loud) == 1 and "redis.cluster = true" in loud[0].getMessage()
        await store.close()
    finally:
        node.kill()


class Broken(RedisLink):
    """A client that fails as redis-py did under a TLS burst: with a bug, not an error."""

    async def run(self, calls: Any) -> list[Any]:
        raise AttributeError("'NoneType' object has no attribute 'write'")


async def test_anything_the_client_raises_is_served_by_the_fail_mode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    link = connect(RedisConfig(url="redis://127.0.0.1:1/0"))
    tasks = Tasks()
    store = SharedStore(RedisEngine(Broken(link.client, link.target), spawn=tasks.spawn))
    with caplog.at_level(logging.ERROR, "tokengate.redis"):
        decisions = [await store.reserve("k", LIMITS, 1) for _ in range(4)]
        store.settle("k", LIMITS, 5, 0)
    assert all(d.allowed for d in decisions)
    assert store.engine.state() == "degraded"  # three in a row: an outage
    logged = [r for r in caplog.records if "AttributeError" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None  # once, with its traceback
    await store.close()


async def test_a_restart_that_lost_the_scripts_is_answered_after_reloading_them(
    make: Any, redis_aof: Server
) -> None:
    store = await make()
    redis_aof.cli("SCRIPT", "FLUSH")
    decision = await store.reserve("k", LIMITS, 1)
    assert decision.allowed and store.engine.state() == "shared"
    (raw,) = await store.engine.link.run([Call(None, (), ("PING",))])
    assert raw is True


class Flaky(RedisLink):
    """The real link, but the next `fail` calls time out (or answer nonsense)."""

    fail = 0
    nonsense = False

    async def run(self, calls: Any) -> list[Any]:
        if self.fail:
            self.fail -= 1
            if self.nonsense:
                return [["not", "a", "decision"] for _ in calls]
            raise rx.TimeoutError("Timeout reading from socket")
        return await super().run(calls)


@pytest.mark.parametrize("nonsense", [False, True], ids=["timeout", "nonsense"])
async def test_one_failed_call_is_decided_at_the_share_and_charged_to_redis_at_once(
    redis_aof: Server, nonsense: bool
) -> None:
    redis_aof.cli("FLUSHALL")
    tasks = Tasks()
    real = connect(RedisConfig(url=redis_aof.url))
    link = Flaky(real.client, real.target)
    store = SharedStore(RedisEngine(link, spawn=tasks.spawn))
    await store.start()
    try:
        refill = Refill(FEW_REQUESTS)
        await store.reserve("k", FEW_REQUESTS, 10)
        link.fail, link.nonsense = 1, nonsense
        served = await store.reserve("k", FEW_REQUESTS, 10)  # no hang, no exception
        assert served.allowed and store.engine.state() == "shared"  # one failure is no outage
        assert not store.fallback.active  # nothing stays local
        await asyncio.sleep(SETTLE_LAG * 4)
        await tasks.idle()
        after = await store.reserve("k", FEW_REQUESTS, 10)
        # the one served alone is on the books: 3 left, 4 without it (+ a refill in 10 s)
        assert 6 - 3 <= after.requests_remaining <= 6 - 3 + refill.requests()
    finally:
        await tasks.idle()
        await store.close()
