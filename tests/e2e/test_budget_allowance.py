"""A budget is never exceeded, over real sockets (issue #31, findings 4, 5 and 13).

Against a budget a request holds its whole output allowance (never the key's trainable
output estimate) and the gateway sends that cap upstream; a background response is
capped by what it is charged; a key with a cost budget is never served by an unpriced
fallback. What was spent is read from the sim's own books (`billed`, `balance`) as well
as from the gateway's ledger, never from the gateway's word alone.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis as RedisClient

from tests.support.procs import Gateway, GatewaySpec, Redis, Sim

Make = Callable[..., Gateway]
ADMIN = "admin-allowance-key-0123456789"
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
PROMPT = [{"role": "user", "content": "Write about budgets."}]
PRICES = {"gpt-4o": {"input": "2.50", "output": "10.00"}}


def spec(budget: dict[str, Any], **settings: Any) -> GatewaySpec:
    base = {"admin_key": ADMIN, "billing": {"currency": "USD", "prices": PRICES}}
    return GatewaySpec(keys={"k": {"budgets": [budget]}}, settings={**base, **settings})


def spent(gw: Gateway) -> tuple[int, int]:
    """(spent, limit) of the key's one budget, from the ledger (`/admin/budgets`)."""
    r = httpx.get(f"{gw.url}/admin/budgets", headers=ADMIN_H, timeout=10)
    r.raise_for_status()
    (owner,) = [o for o in r.json()["data"] if o["name"] == "k"]
    (budget,) = owner["budgets"]
    return int(budget["spent"]), int(budget["limit"])


def billed(sim: Sim) -> int:
    b = sim.stats()["billed"]
    return int(b["prompt_tokens"]) + int(b["completion_tokens"])


async def six_at_once(gw: Gateway, max_tokens: int) -> list[httpx.Response]:
    body = {"model": "gpt-4o", "messages": PROMPT, "max_tokens": max_tokens}
    async with httpx.AsyncClient(timeout=60) as c:
        url = f"{gw.url}/v1/chat/completions"
        return list(
            await asyncio.gather(*(c.post(url, json=body, headers=gw.headers()) for _ in range(6)))
        )


def train(gw: Gateway) -> None:
    """Teach the key's output estimate that its answers are one token long."""
    client = gw.openai()
    for _ in range(6):
        client.chat.completions.create(model="gpt-4o", messages=PROMPT, max_tokens=1)


@pytest.mark.parametrize("on_short", ["refuse", "cap"])
async def test_six_concurrent_requests_never_spend_past_what_the_budget_has_left(
    make_sim: Callable[..., Sim], make_gateway: Make, on_short: str
) -> None:
    sim = make_sim("--reply-tokens", "1500")
    gw = make_gateway(spec({"period": "day", "max_tokens": 3200, "on_short": on_short}), sim.url)
    train(gw)
    used, limit = spent(gw)
    left, before = limit - used, billed(sim)
    assert 2900 < left < 3200
    answers = await six_at_once(gw, 1400)
    ok = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 429]
    assert len(ok) + len(refused) == 6 and ok and refused
    assert all(r.json()["error"]["code"] == "budget_exceeded" for r in refused)
    assert billed(sim) - before <= left  # what the upstream generated and billed
    assert spent(gw)[0] <= limit  # and what the ledger recorded
    shown = httpx.get(f"{gw.url}/admin/budgets", headers=ADMIN_H).json()["data"][0]["budgets"]
    assert shown[0]["on_short"] == on_short
    caps = [r["body"].get("max_tokens") for r in sim.records("/v1/chat/completions")[6:]]
    if on_short == "refuse":
        assert caps == [1400] * len(ok)  # each held its whole allowance, or was refused
    else:  # the last one admitted was capped at what was left
        assert len(ok) == 3 and sorted(caps)[1:] == [1400, 1400] and sorted(caps)[0] < 1400


@pytest.mark.parametrize("on_short", ["refuse", "cap"])
async def test_two_replicas_on_redis_hold_whole_allowances_too(
    make_sim: Callable[..., Sim], make_gateway: Make, redis: Redis, tmp_path: Path, on_short: str
) -> None:
    sim = make_sim("--reply-tokens", "1500")
    shared = spec({"period": "day", "max_tokens": 3000, "on_short": on_short})
    shared.settings["database"] = {"path": str(tmp_path / "shared.sqlite3")}
    shared.env = {"TOKENGATE_REDIS_URL": redis.url}
    one = make_gateway(shared, sim.url)
    shared.secrets = one.keys
    two = make_gateway(shared, sim.url)
    train(one)
    train(two)
    client = RedisClient.from_url(redis.url)
    left, before = 3000 - spent_in_redis(client), billed(sim)
    answers = [
        r
        for pair in await asyncio.gather(six_at_once(one, 1400), six_at_once(two, 1400))
        for r in pair
    ]
    ok = [r for r in answers if r.status_code == 200]
    assert ok and all(
        r.json()["error"]["code"] == "budget_exceeded" for r in answers if r not in ok
    )
    assert billed(sim) - before <= left  # the sim's books
    assert spent_in_redis(client) <= 3000 and held_in_redis(client) == 0
    await asyncio.sleep(2.5)  # flushed to the shared database and read back
    assert spent(one)[0] <= 3000  # and the ledger's


async def test_a_request_without_max_tokens_is_capped_at_what_it_holds(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--reply-tokens", "3000")
    budget = {"period": "day", "max_tokens": 2000, "on_short": "cap"}
    gw = make_gateway(spec(budget, rate_limit={"default_max_tokens": 1500}), sim.url)
    client = gw.openai()
    first = client.chat.completions.create(model="gpt-4o", messages=PROMPT)
    assert first.usage is not None and first.usage.completion_tokens == 1500
    second = client.chat.completions.create(model="gpt-4o", messages=PROMPT)
    assert second.choices[0].finish_reason == "length"
    assert billed(sim) <= 2000 and spent(gw)[0] <= 2000
    sent = [r["body"].get("max_tokens") for r in sim.records("/v1/chat/completions")]
    assert sent[0] == 1500 and sent[1] < 1500


async def test_background_responses_are_capped_upstream_by_what_they_are_charged(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--reply-tokens", "2500", "--balance", "1000000")
    gw = make_gateway(spec({"period": "day", "max_tokens": 3000}), sim.url)
    client = gw.openai()
    admitted = 0
    for _ in range(4):
        try:
            queued = client.responses.create(model="gpt-4o", input="a long essay", background=True)
        except Exception as exc:
            assert getattr(exc, "code", None) == "budget_exceeded", exc
            continue
        assert queued.status in ("queued", "in_progress")
        admitted += 1
    assert admitted == 2  # each held 1024 tokens and its prompt against 3000
    generated = 1_000_000 - int(sim.stats()["balance"])
    assert generated <= 3000  # the sim generated no more than the budget allowed
    assert spent(gw)[0] <= 3000
    sent = [r["body"].get("max_output_tokens") for r in sim.records("/v1/responses")]
    assert sent == [1024, 1024]


def test_a_key_with_a_cost_budget_is_never_served_by_an_unpriced_fallback(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    broken, unpriced = make_sim("--models", "gpt-4o"), make_sim("--models", "claude-sonnet")
    budget = {"period": "day", "max_cost": "1"}
    gw = make_gateway(
        GatewaySpec(
            keys={"k": {"budgets": [budget]}, "free": {}},
            toml={
                "scale_up": [
                    {"domain": "a", "api_base": broken.url, "api_key_env": "TAOTOKEN_API_KEY"},
                    {"domain": "b", "api_base": unpriced.url, "api_key_env": "TAOTOKEN_API_KEY"},
                ]
            },
            settings={
                "admin_key": ADMIN,
                "billing": {"currency": "USD", "prices": PRICES},
                "model_route": {"default": "gpt-4o", "fallback": "claude-sonnet"},
                "retry_policy": {"max_attempts": 1, "backoff_ms": 10},
            },
        )
    )
    broken.faults(status=503, rate=1.0)
    body = {"model": "gpt-4o", "messages": PROMPT, "max_tokens": 4}
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers("k"))
    assert r.status_code >= 500  # the primary failed, and the unpriced fallback was skipped
    assert unpriced.records("/v1/chat/completions") == []
    # a key without a cost budget still falls back to it
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers("free"))
    assert r.status_code == 200 and r.headers["x-tokengate-domain"] == "b"


def held_in_redis(client: RedisClient, field: str = "held_t") -> int:
    """Tokens held in Redis against the key's budgets (every period)."""
    names = [n for n in client.scan_iter("tokengate:budget:{key:k}:*") if b":holds" not in n]
    return sum(int(client.hget(n, field) or 0) for n in names)


def spent_in_redis(client: RedisClient) -> int:
    return held_in_redis(client, "spent_t")


def ask_once(gw: Gateway, stream: bool) -> tuple[int, str]:
    """One request, read to its very end: (status, the error message if refused)."""
    body: dict[str, Any] = {"model": "claude-sonnet", "messages": PROMPT, "max_tokens": 8}
    if stream:
        body["stream"] = True
    url = f"{gw.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=gw.headers(), timeout=60) as r:
        data = r.read()
    message = "" if r.status_code == 200 else json.loads(data)["error"]["message"]
    return r.status_code, message


def test_two_replicas_spend_a_budget_to_its_end_not_early(
    sim: Sim, make_gateway: Make, redis: Redis, tmp_path: Path
) -> None:
    """Sequential requests, alternating replicas, streamed and not, on an unpriced model
    (its holds cost 0): each answer's hold is gone from Redis by the time the client has
    the answer's end, and the budget is refused only once it is spent."""
    shared = spec({"period": "day", "max_tokens": 300})
    shared.settings["database"] = {"path": str(tmp_path / "shared.sqlite3")}
    shared.env = {"TOKENGATE_REDIS_URL": redis.url}
    one = make_gateway(shared, sim.url)
    shared.secrets = one.keys
    two = make_gateway(shared, sim.url)
    client = RedisClient.from_url(redis.url)
    lingering, refusal = [], ""
    for i in range(60):
        status, message = ask_once((one, two)[i % 2], stream=i % 3 != 0)
        if status != 200:
            assert status == 429, message
            refusal = message
            break
        lingering.append(held_in_redis(client))
    assert refusal, "the budget was never refused"
    assert lingering == [0] * len(lingering)  # no hold outlives its answer
    assert "held by requests in flight" not in refusal  # refused for spend, not for holds
    figures = re.search(r"has ([\d,]+) tokens of ([\d,]+) .* up to ([\d,]+) tokens", refusal)
    assert figures is not None, refusal
    spent, limit, need = (int(v.replace(",", "")) for v in figures.groups())
    assert limit - need < spent <= limit  # what is left is less than one more request


def test_a_cost_hold_is_priced_in_the_billing_window_in_force(sim: Sim, make_gateway: Make) -> None:
    """All day is `peak` here, where output costs 20.00 instead of 10.00: 100 output tokens
    hold 0.002 at peak, which a 0.0015 budget can not hold (at the base price, 0.001, it
    could: the hold used to be priced so, and the request went through)."""
    peak = {"input": "2.50", "output": "20.00"}
    billing = {
        "currency": "USD",
        "windows": {"peak": {"start": "00:00", "end": "00:00"}},
        "prices": {"gpt-4o": {**PRICES["gpt-4o"], "windows": {"peak": peak}}},
    }
    gw = make_gateway(spec({"period": "day", "max_cost": "0.0015"}, billing=billing), sim.url)
    body = {"model": "gpt-4o", "messages": PROMPT, "max_tokens": 100}
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers(), timeout=30)
    assert r.status_code == 429 and r.json()["error"]["code"] == "budget_exceeded", r.text
    assert billed(sim) == 0  # nothing reached the upstream
    body["max_tokens"] = 40  # 0.0008 at peak + the prompt: fits
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers(), timeout=30)
    assert r.status_code == 200, r.text
