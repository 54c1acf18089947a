"""Per-key limits and accounting over real sockets, in-process and through Redis."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Callable

import httpx
import openai
import pytest

from tests.support.procs import Gateway, GatewaySpec, Redis, Sim
from tests.support.refill import refilled
from tests.support.scrape import metric_sum
from tests.support.waiting import eventually

Make = Callable[..., Gateway]
ADMIN = "admin-test-key-0123456789"
PING = [{"role": "user", "content": "ping"}]


def chat(tokens: int = 4, stream: bool = False) -> dict[str, object]:
    return {"model": "gpt-4o", "messages": PING, "max_tokens": tokens, "stream": stream}


async def burst(
    gw: Gateway, n: int, body: dict[str, object] | None = None, alias: str | None = None
) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=200)) as c:
        return list(
            await asyncio.gather(
                *(
                    c.post(
                        f"{gw.url}/v1/chat/completions",
                        json=body or chat(),
                        headers=gw.headers(alias),
                    )
                    for _ in range(n)
                )
            )
        )


def counter(metrics: str, name: str, **labels: str) -> float:
    return metric_sum(metrics, name, **labels)


def usage(gw: Gateway) -> list[dict[str, object]]:
    r = httpx.get(f"{gw.url}/admin/usage", headers={"authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    return list(r.json()["data"])


async def test_exactly_the_limit_is_admitted_under_concurrency(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(GatewaySpec(keys={"k": {"requests_per_minute": 20}}), sim.url)
    began = time.monotonic()
    responses = await burst(gw, 60)
    statuses = Counter(r.status_code for r in responses)
    admitted = statuses[200]  # 20, and one more for every 3 s the burst took
    assert set(statuses) == {200, 429} and 20 <= admitted <= 20 + refilled(began, 20)
    assert statuses[429] == 60 - admitted
    for r in responses:
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "rate_limit_exceeded"
            assert 1 <= int(r.headers["retry-after"]) <= 60
            assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert len(sim.records("/v1/chat/completions")) == admitted
    refused = counter(gw.metrics(), "tokengate_rate_limited_total", key="k", limit="requests")
    assert refused == 60 - admitted


def test_sdk_raises_rate_limit_error(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(keys={"k": {"requests_per_minute": 1}}), sim.url)
    client = gw.openai()
    client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=2)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=2)


def test_reservations_are_corrected_to_real_usage(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    # Each request reserves ~4 + 400 tokens but really uses 4 + 16 (the sim's reply).
    # Uncorrected, 1000 tokens/min would admit 2 of them; corrected, all 25 fit.
    sim = make_sim("--reply-tokens", "16")
    gw = make_gateway(GatewaySpec(keys={"k": {"tokens_per_minute": 1000}}), sim.url)
    client = gw.openai()
    for _ in range(25):
        client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=400)
    with pytest.raises(openai.RateLimitError):  # yet the limit is real
        for _ in range(40):
            client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=400)


def test_too_large_request_is_429_saying_so(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(keys={"k": {"tokens_per_minute": 100}}), sim.url)
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=chat(tokens=1000), headers=gw.headers())
    assert r.status_code == 429 and "whole allowance" in r.json()["error"]["message"]
    assert r.headers["x-should-retry"] == "false"
    assert sim.records("/v1/chat/completions") == []


def test_stream_usage_is_counted_exactly_and_not_forced_on_the_client(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(GatewaySpec(settings={"admin_key": ADMIN}), sim.url)
    client = gw.openai()
    for _ in range(3):
        chunks = list(
            client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=7, stream=True)
        )
        assert all(c.usage is None for c in chunks)
    sent = sim.records("/v1/chat/completions")
    assert all(r["body"]["stream_options"] == {"include_usage": True} for r in sent)
    metrics = gw.metrics()
    assert counter(metrics, "tokengate_tokens_total", key="alice", kind="completion") == 21
    assert counter(metrics, "tokengate_tokens_total", key="alice", kind="prompt") == 3 * 4
    (row,) = usage(gw)
    assert (row["requests"], row["completion_tokens"]) == (3, 21)


def test_ledger_survives_a_restart(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(settings={"admin_key": ADMIN}), sim.url)
    client = gw.openai()
    for _ in range(2):
        client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=5)
    gw.restart()
    gw.openai().chat.completions.create(model="gpt-4o", messages=PING, max_tokens=5)
    (row,) = usage(gw)
    assert (row["key"], row["model"], row["requests"], row["completion_tokens"]) == (
        "alice",
        "gpt-4o",
        3,
        15,
    )


def test_ratelimit_headers_on_every_proxied_answer(gateway: Gateway) -> None:
    raw = gateway.openai().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=PING, max_tokens=2
    )
    for name in ("requests", "tokens"):
        assert int(raw.headers[f"x-ratelimit-limit-{name}"]) > 0
        assert int(raw.headers[f"x-ratelimit-remaining-{name}"]) >= 0
        assert re.fullmatch(r"(\d+m)?[\d.]+m?s", raw.headers[f"x-ratelimit-reset-{name}"])


async def test_two_gateways_on_one_redis_enforce_one_limit(
    sim: Sim, make_gateway: Make, redis: Redis
) -> None:
    spec = GatewaySpec(
        keys={"k": {"requests_per_minute": 10}}, env={"TOKENGATE_REDIS_URL": redis.url}
    )
    one = make_gateway(spec, sim.url)
    spec.secrets = one.keys  # the same client key works on both replicas
    two = make_gateway(spec, sim.url)
    began = time.monotonic()
    results = await asyncio.gather(burst(one, 10), burst(two, 10))
    statuses = Counter(r.status_code for rs in results for r in rs)
    # one limit for both: 10 (+ one for every 6 s the bursts took), never 10 each
    assert set(statuses) == {200, 429} and 10 <= statuses[200] <= 10 + refilled(began, 10)
    assert len(sim.records("/v1/chat/completions")) == statuses[200]


async def test_redis_outage_fails_open_visibly_and_recovers(
    sim: Sim, make_gateway: Make, redis: Redis
) -> None:
    gw = make_gateway(
        GatewaySpec(
            keys={"k": {"requests_per_minute": 600}},
            settings={"admin_key": ADMIN},
            env={"TOKENGATE_REDIS_URL": redis.url},
        ),
        sim.url,
    )
    assert (await burst(gw, 3))[0].status_code == 200
    # /admin/usage waits for the settles still in flight
    assert usage(gw)[0]["requests"] == 3
    redis.kill()
    responses = await burst(gw, 3)
    assert [r.status_code for r in responses] == [200] * 3  # fail-open: still served
    ready = httpx.get(f"{gw.url}/health/ready").json()
    assert ready["redis"] == {
        "up": False, "fail_mode": "open", "state": "degraded", "replicas": 1, "divisor": 1
    }  # fmt: skip
    metrics = gw.metrics()
    assert "tokengate_redis_up 0.0" in metrics and "tokengate_redis_degraded 1.0" in metrics
    redis.start()
    await eventually(lambda: "tokengate_redis_up 1.0" in gw.metrics(), "recovery, no restart")
    assert [r.status_code for r in await burst(gw, 2)] == [200, 200]
    assert httpx.get(f"{gw.url}/health/ready").json()["redis"]["state"] == "shared"
    assert "tokengate_redis_degraded 0.0" in gw.metrics()
    # the ledger is not in Redis: a Redis restart loses no row
    (row,) = usage(gw)
    assert row["requests"] == 3 + 3 + 2


async def test_redis_outage_fail_closed_refuses_with_503(
    sim: Sim, make_gateway: Make, redis: Redis
) -> None:
    gw = make_gateway(
        GatewaySpec(
            settings={"redis": {"fail_mode": "closed"}}, env={"TOKENGATE_REDIS_URL": redis.url}
        ),
        sim.url,
    )
    redis.kill()
    (r,) = await burst(gw, 1)
    assert r.status_code == 503 and r.json()["error"]["code"] == "redis_unavailable"
    assert "retry-after" in r.headers
    ready = httpx.get(f"{gw.url}/health/ready")
    assert ready.status_code == 503 and ready.json()["redis"]["state"] == "refusing"
