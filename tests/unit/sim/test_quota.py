"""The simulator's quota, as providers enforce it: a fixed window or a token bucket per
kind, OpenAI's x-ratelimit-* headers, and a prepaid balance (`insufficient_quota`);
pure, with the clock passed in, then through the sim's ASGI app."""

from __future__ import annotations

import httpx
import pytest

from app.sim.knobs import SimKnobs
from app.sim.quota import Quota
from app.sim.simulator import create_sim_app


def test_a_fixed_window_admits_its_share_then_waits_for_the_next_window() -> None:
    quota = Quota(600, None, 1.0, "window")  # 10 per aligned second
    assert all(quota.take(1, 100.05 + i * 0.01) is None for i in range(10))
    wait = quota.take(1, 100.5)
    assert wait == pytest.approx(0.5)  # until 101.0, not a token's refill
    assert quota.take(1, 101.0) is None  # a new window counts afresh


def test_a_bucket_refills_continuously() -> None:
    quota = Quota(600, None, 1.0, "bucket")  # holds 10, refills 10/s
    assert all(quota.take(1, 100.0) is None for _ in range(10))
    assert quota.take(1, 100.0) == pytest.approx(0.1)
    assert quota.take(1, 100.1) is None


def test_tokens_and_requests_both_limit_and_the_headers_say_what_is_left() -> None:
    quota = Quota(600, 6000, 1.0, "window")  # 10 requests and 100 tokens a second
    assert quota.take(60, 100.0) is None
    assert quota.take(60, 100.1) == pytest.approx(0.9)  # tokens ran out first
    headers = quota.headers(100.2)
    assert headers["x-ratelimit-limit-requests"] == "600"
    assert headers["x-ratelimit-remaining-requests"] == "9"
    assert headers["x-ratelimit-remaining-tokens"] == "40"
    assert headers["x-ratelimit-reset-tokens"] == "800ms"


def test_a_balance_runs_out() -> None:
    quota = Quota(None, None, 1.0, balance=30)
    quota.spend(20)
    assert not quota.exhausted
    quota.spend(20)
    assert quota.exhausted


def chat() -> dict[str, object]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def post(knobs: SimKnobs, n: int) -> list[httpx.Response]:
    app = create_sim_app(knobs)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        return [
            await client.post(
                "/v1/chat/completions", json=chat(), headers={"authorization": "Bearer k"}
            )
            for _ in range(n)
        ]


async def test_answers_carry_the_rate_headers_and_a_429_its_wait() -> None:
    knobs = SimKnobs(rpm=120, quota_window_sec=1.0, quota_mode="window", record=False)
    first, second, third = await post(knobs, 3)  # 2 per window
    assert first.status_code == 200 and first.headers["x-ratelimit-limit-requests"] == "120"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert second.status_code == 200
    assert third.status_code == 429
    assert third.json()["error"]["code"] == "rate_limit_exceeded"
    assert 0 < int(third.headers["retry-after-ms"]) <= 1000
    assert third.headers["x-ratelimit-remaining-requests"] == "0"


async def test_bare_429s_carry_no_headers_at_all() -> None:
    knobs = SimKnobs(rpm=60, quota_mode="window", quota_headers="none", quota_window_sec=1.0)
    ok, refused = await post(knobs, 2)
    assert ok.status_code == 200 and "x-ratelimit-limit-requests" not in ok.headers
    assert refused.status_code == 429
    assert not any(h.startswith(("retry-after", "x-ratelimit")) for h in refused.headers)


async def test_an_empty_balance_is_openais_insufficient_quota() -> None:
    (refused,) = await post(SimKnobs(balance=0, record=False), 1)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["type"] == error["code"] == "insufficient_quota"
    assert "retry-after" not in refused.headers
