"""Shared limits over real sockets, through what an operator's Redis really does: four
`tokengate serve` replicas across a Redis restart, a three-master Redis Cluster, and a
Sentinel failover. Every Redis is a real server on loopback."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.support.procs import Gateway, GatewaySpec, Sim
from tests.support.redis_shapes import cli, cluster, sentinel_setup, server, wait_for
from tests.support.refill import refilled

Make = Callable[..., Gateway]
ADMIN = "admin-test-key-0123456789"
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 4}


def replicas(make: Make, sim: Sim, url: str, n: int, *, rpm: int) -> list[Gateway]:
    spec = GatewaySpec(
        keys={"k": {"requests_per_minute": rpm, "tokens_per_minute": 10_000_000}},
        settings={"admin_key": ADMIN, "health_check": {"enabled": False}},
        env={"TOKENGATE_REDIS_URL": url},
    )
    first = make(spec, sim.url)
    spec.secrets = first.keys  # one client key, valid on every replica
    rest = [make(spec, sim.url, wait=False) for _ in range(n - 1)]  # they boot side by side
    return [first, *(gw.ready() for gw in rest)]


def ready(gw: Gateway) -> dict[str, object]:
    return dict(httpx.get(f"{gw.url}/health/ready", timeout=5).json()["redis"])


def usage(gw: Gateway) -> int:
    r = httpx.get(f"{gw.url}/admin/usage", headers={"authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    return sum(int(row["requests"]) for row in r.json()["data"] if row["key"] == "k")


async def send(client: httpx.AsyncClient, gw: Gateway) -> tuple[float, int]:
    """(when it was sent, the answer's status)."""
    sent = time.monotonic()
    r = await client.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=gw.headers())
    return sent, r.status_code


@pytest.mark.slow
async def test_four_replicas_across_a_redis_restart_stay_within_the_limit(
    sim: Sim, make_gateway: Make, tmp_path: Path
) -> None:
    """A key at 60 requests/min, four replicas, 100 requests in bursts of 10 concurrent ones
    over half a minute, Redis killed 6 s in and started again (AOF: its data kept) 9 s later.

    What is counted: a token bucket holds a minute's allowance, so it legitimately admits
    its initial full bucket at once; that is spent first (the drain), and from then on the
    bucket is empty and refills at 60/min, one a second. No 30-second window starting at an
    empty bucket may then admit more than 30 (plus the sliver of refill under one request).
    The one window measured starts at the end of the drain and contains the whole outage;
    it may hold at most 1.25 x 30 (the margin covers the outage's approximations: each
    replica seeds its share from the level it last saw, which another replica may have
    lowered since). Without the shares (every replica enforcing the full limit while Redis
    is away), the outage alone would admit ~4 x 9 here.

    Half a minute proves what a whole one would, at twice the rate: every figure scales
    with it (the level at the kill, the shares' refill, the margin), and the suite spends
    30 s less on it.
    """
    rpm, window = 60, 30
    allowed = rpm * window // 60
    redis = server(tmp_path / "redis", persist=True)
    try:
        gws = replicas(make_gateway, sim, redis.url, 4, rpm=rpm)
        wait_for(lambda: all(ready(g)["replicas"] == 4 for g in gws), "4 replicas seen")
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as c:
            began = time.monotonic()
            drain = await asyncio.gather(*(send(c, gws[i % 4]) for i in range(rpm + 20)))
            drained = Counter(s for _, s in drain)[200]
            # the full bucket, exact, plus what refilled while they were sent
            assert rpm <= drained <= rpm + refilled(began, rpm)
            start = time.monotonic()
            results, outage = [], {}
            for n in range(window // 3):  # 10 bursts x 10 = 100 requests over 30 s
                await asyncio.sleep(max(0.0, start + 3 * n - time.monotonic()))
                if n == 2:
                    redis.kill()
                if n == 3:
                    outage = ready(gws[0])
                if n == 5:
                    redis.start()  # same port and directory: the AOF is replayed
                burst = (send(c, gws[(n + i) % 4]) for i in range(10))
                results += await asyncio.gather(*burst)
            await asyncio.sleep(max(0.0, start + window - time.monotonic()))
        statuses = Counter(s for _, s in results)
        assert set(statuses) <= {200, 429}, statuses  # served throughout, never a 5xx
        admitted = sorted(t - start for t, s in results if s == 200)
        assert len([t for t in admitted if t < window]) <= 1.25 * allowed, admitted
        assert any(6 <= t < 15 for t in admitted), admitted  # fail open: served meanwhile
        assert len(admitted) >= allowed / 2, admitted  # and not starved either
        assert outage["state"] == "degraded" and outage["divisor"] == 4, outage
        wait_for(lambda: all(ready(g)["state"] == "shared" for g in gws), "recovered")
        # every admitted request is on the books: the ledger never depended on Redis
        assert sum(usage(g) for g in gws) == drained + len(admitted)
    finally:
        redis.kill()


async def test_two_replicas_on_a_three_master_cluster_share_limits_exactly(
    sim: Sim, make_gateway: Make, tmp_path: Path
) -> None:
    with cluster(tmp_path / "cluster") as c:
        gws = replicas(make_gateway, sim, c.url, 2, rpm=20)
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as cl:
            began = time.monotonic()
            answers = await asyncio.gather(*(send(cl, gws[i % 2]) for i in range(50)))
        statuses = Counter(s for _, s in answers)
        # 20 and not one more, but for what refilled (one every 3 s) while the 50 went out
        assert set(statuses) == {200, 429} and 20 <= statuses[200] <= 20 + refilled(began, 20)
        assert [ready(g)["state"] for g in gws] == ["shared", "shared"]
        # /admin/usage answers (it was a 500), with every admitted request
        assert sum(usage(g) for g in gws) == statuses[200]
        for g in gws:
            text = g.workdir.joinpath("gateway.log").read_text()
            assert "MOVED" not in text and "CROSSSLOT" not in text and "unreachable" not in text
            assert "tokengate_redis_misconfigured 0.0" in g.metrics()


async def test_a_gateway_on_sentinel_follows_a_failover(
    sim: Sim, make_gateway: Make, tmp_path: Path
) -> None:
    with sentinel_setup(tmp_path / "sentinel") as setup:
        (gw,) = replicas(make_gateway, sim, setup.url, 1, rpm=600)
        async with httpx.AsyncClient(timeout=30) as c:
            assert {s for _, s in await asyncio.gather(*(send(c, gw) for _ in range(5)))} == {200}
            setup.failover()
            wait_for(lambda: ready(gw)["state"] == "shared", "shared after the failover")
            statuses = {s for _, s in await asyncio.gather(*(send(c, gw) for _ in range(5)))}
        assert statuses == {200} and ready(gw)["state"] == "shared"
        promoted = setup.master_port()
        keys = cli(promoted, "--scan", "--pattern", "tokengate:rl:*")
        assert "tokengate:rl:{k}:requests" in keys  # the limits live on the new master


@pytest.mark.slow
async def test_a_flapping_redis_never_multiplies_a_limit(
    sim: Sim, make_gateway: Make, tmp_path: Path
) -> None:
    """Two replicas share a key at 40 requests/min while Redis flaps: unresponsive
    (`DEBUG SLEEP`), killed, back (AOF: its data kept), unresponsive again, with bursts
    of concurrent requests on both replicas while it is away. The drain spends the full
    bucket first; from then on half a minute may hold at most 1.25 x 20 requests that
    reached the upstream (the sim's own records: what it received, not what the gateway
    says). Without a degraded-mode bucket kept across flaps, every timed-out call
    started a fresh share, and each burst got one per request. (Half a minute at twice
    the rate proves what a minute would: the figures scale with it.)"""
    rpm, window = 40, 30
    debug = ("--enable-debug-command", "local")
    redis = server(tmp_path / "redis", persist=True, extra=debug)
    stalls: list[subprocess.Popen[bytes]] = []

    def stall(seconds: float) -> None:
        stalls.append(redis.stall(seconds))

    try:
        gws = replicas(make_gateway, sim, redis.url, 2, rpm=rpm)
        wait_for(lambda: all(ready(g)["replicas"] == 2 for g in gws), "2 replicas seen")
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=128)) as c:
            began = time.monotonic()
            drain = await asyncio.gather(*(send(c, gws[i % 2]) for i in range(rpm + 10)))
            # the full bucket, exact, plus what refilled while they were sent
            assert rpm <= Counter(s for _, s in drain)[200] <= rpm + refilled(began, rpm)
            sim.clear()
            t0, start = time.time(), time.monotonic()
            # (second, what happens to Redis, then requests per replica at once)
            plan: list[tuple[float, Callable[[], object] | None, int]] = [
                (7, lambda: stall(3), 30),  # slow: every call times out
                (12, redis.kill, 10),  # gone: refused at once
                (14, None, 10),
                (16, redis.start, 2),  # back
                (20, lambda: stall(3), 30),  # slow again
                (24, lambda: stall(2), 20),
                (27.5, None, 10),
            ]
            sent: list[asyncio.Task[tuple[float, int]]] = []
            for at, event, per_replica in plan:
                await asyncio.sleep(max(0.0, start + at - time.monotonic()))
                if event is not None:
                    await asyncio.to_thread(event)
                sent += [asyncio.create_task(send(c, gws[i % 2])) for i in range(2 * per_replica)]
            statuses = Counter(s for _, s in await asyncio.gather(*sent))
        assert set(statuses) <= {200, 429}, statuses  # served throughout, never a 5xx
        received = [r["at"] for r in sim.records("/v1/chat/completions") if r["at"] >= t0]
        in_window = [at for at in received if at < t0 + window]
        assert len(in_window) <= 1.25 * rpm * window / 60, (len(in_window), statuses)
        assert statuses[200] >= 1  # fail open: served while Redis was away
    finally:
        for p in stalls:
            p.wait(10)
        redis.kill()
