"""Upstream 429s over real sockets: the official openai SDK -> `tokengate serve` (one or
two replicas, Redis) -> a `tokengate sim` that quantizes its quota to 10 requests per
1-second window, as providers do."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.support.procs import Gateway, GatewaySpec, Redis, Sim
from tests.support.scrape import metric_sum

Make = Callable[..., Gateway]
KEYS = {f"key-{i}": {"requests_per_minute": 100_000} for i in range(4)}
QUOTA = ("--rpm", "600", "--quota-window-sec", "1", "--quota-mode", "window")


def domain(sim: Sim, **extra: object) -> dict[str, object]:
    return {"domain": "quota", "api_base": sim.url, "api_key_env": "TAOTOKEN_API_KEY", **extra}


def spec(sim: Sim, env: dict[str, str] | None = None, **extra: object) -> GatewaySpec:
    return GatewaySpec(
        toml={"scale_up": [domain(sim, **extra)]},
        settings={"model_route": {"default": "gpt-4o", "fallback": None}},
        keys=KEYS,
        env=env or {},
    )


async def offer(gateways: list[Gateway], count: int, per_sec: float = 50.0) -> list[Any]:
    """`count` chat completions arriving at `per_sec` (the issue's 50/s, 5x the quota),
    spread over the keys (and the replicas). The SDK's own retries are off, so every
    429 or 503 the gateway answered shows here."""
    clients = [gw.async_openai(alias) for gw in gateways for alias in KEYS]

    async def one(i: int) -> Any:
        client = clients[i % len(clients)]
        await asyncio.sleep(i / per_sec)
        try:
            return await client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=4
            )
        except openai.APIStatusError as exc:
            return exc

    try:
        return list(await asyncio.gather(*(one(i) for i in range(count))))
    finally:
        for c in clients:
            await c.close()


def counter(metrics: str, name: str) -> float:
    return metric_sum(metrics, name, domain="quota")


async def test_a_burst_without_a_configured_quota_is_served_not_failed(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim(*QUOTA, "--quota-headers", "none")  # bare 429s: nothing to go by
    gw = make_gateway(spec(sim))
    answers = await offer([gw], 40)
    assert [a for a in answers if isinstance(a, Exception)] == []
    upstream_429 = sim.stats()["statuses"].get("429", 0)
    assert 1 <= upstream_429 <= 4  # learned from the first: at most 10 % of the offer
    ready = httpx.get(f"{gw.url}/health/ready").json()
    assert ready["status"] == "ready"
    assert ready["domains"]["quota"]["breaker"] == "closed"
    assert ready["domains"]["quota"]["pace"]["learned"] is True
    metrics = gw.metrics()
    assert counter(metrics, "tokengate_upstream_throttled_total") == upstream_429
    assert counter(metrics, "tokengate_upstream_cooldown_seconds_total") >= 1.0
    pace = counter(metrics, "tokengate_domain_pace_requests_per_second")
    assert 1.0 <= pace <= 12.0  # about the upstream's real 10/s, not +Inf any more


@pytest.mark.parametrize("shared", [True, False])
async def test_replicas_on_one_upstream_key_share_its_quota_through_redis(
    make_sim: Callable[..., Sim], make_gateway: Make, redis: Redis, shared: bool
) -> None:
    # Each replica is told the key's whole quota, as in the article's troubleshooting case.
    sim = make_sim(*QUOTA, "--quota-headers", "retry-after")
    env = {"TOKENGATE_REDIS_URL": redis.url} if shared else {}
    gateways = [make_gateway(spec(sim, env, requests_per_minute=600)) for _ in range(2)]
    answers = await offer(gateways, 30)
    assert [a for a in answers if isinstance(a, Exception)] == []
    upstream_429 = sim.stats()["statuses"].get("429", 0)
    if shared:
        assert upstream_429 == 0  # one pace for both: the upstream never had to refuse
        pace = httpx.get(f"{gateways[0].url}/health/ready").json()["domains"]["quota"]["pace"]
        assert pace["shared"] is True
    else:
        assert upstream_429 > 0  # the control: each alone paces to the whole quota


async def test_an_empty_upstream_balance_is_refused_at_once_until_a_top_up(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--balance", "0")
    gw = make_gateway(spec(sim))
    with gw.openai(next(iter(KEYS)), max_retries=2) as client:  # the SDK's retries on
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "x"}]
            )
        assert refused.value.code == "insufficient_quota"
        assert "balance is exhausted" in refused.value.message
        assert refused.value.response.headers["x-should-retry"] == "false"
        assert len(sim.records("/v1/chat/completions")) == 1  # no gateway or SDK retry
        ready = httpx.get(f"{gw.url}/health/ready").json()
        assert ready["domains"]["quota"]["state"] == "quota_exhausted"
        assert ready["status"] == "ready"  # a top-up, not a restart, is what it needs
        sim.balance(None)
        answer = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}]
        )
    assert answer.choices
    ready = httpx.get(f"{gw.url}/health/ready").json()
    assert ready["domains"]["quota"]["state"] != "quota_exhausted"
