"""Cost control over real sockets: prices, budgets, reports, the `tokengate usage` CLI.

The upstream is `tokengate sim`; each test computes costs by hand from the usage the sim
reported in its answers, and compares them with what the gateway priced.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.limits.estimate import chat_prompt_tokens
from tests.support.procs import Gateway, GatewaySpec, Redis, Sim, free_port, run_cli
from tests.support.scrape import samples

Make = Callable[..., Gateway]
ADMIN = "admin-test-key-0123456789"
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
PROMPT = [{"role": "user", "content": "Write a short line about budgets, please."}]
# per million tokens
PRICES = {
    "gpt-4o": {"input": "2.50", "output": "10.00", "cached_input": "1.25"},
    "claude-sonnet": {"input": "3", "output": "15", "cached_input": "0.30", "cache_write": "3.75"},
}


def spec(keys: dict[str, dict[str, Any]], **settings: Any) -> GatewaySpec:
    """A gateway pricing PRICES, with the admin API; `settings` on top."""
    base = {"admin_key": ADMIN, "billing": {"currency": "USD", "prices": PRICES}}
    return GatewaySpec(keys=keys, settings={**base, **settings})


def hand_cost(usage: dict[str, Any], model: str) -> Decimal:
    """The cost of one OpenAI-style usage object, by the book (in USD)."""
    price = {k: Decimal(v) for k, v in PRICES[model].items()}
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0)
    plain = usage["prompt_tokens"] - cached
    million: Decimal = (
        plain * price["input"]
        + cached * price["cached_input"]
        + usage["completion_tokens"] * price["output"]
    )
    return million / Decimal(10**6)


def estimate(max_tokens: int, model: str = "gpt-4o") -> Decimal:
    """What admission holds: the prompt estimate at input, all of max_tokens at output."""
    price = {k: Decimal(v) for k, v in PRICES[model].items()}
    million = chat_prompt_tokens(PROMPT) * price["input"] + max_tokens * price["output"]
    return million / Decimal(10**6)


def budgets(gw: Gateway) -> dict[tuple[str, str], dict[str, Any]]:
    r = httpx.get(f"{gw.url}/admin/budgets", headers=ADMIN_H, timeout=10)
    r.raise_for_status()
    return {(o["scope"], o["name"]): o for o in r.json()["data"]}


def test_costs_are_the_hand_computed_costs_of_the_sims_usage(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(spec({"alice": {"team": "ml"}}, teams=[{"name": "ml"}]), sim.url)
    client = gw.openai()
    expected = Decimal(0)
    for max_tokens in (5, 9, 16):
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=PROMPT, max_tokens=max_tokens
        )
        answer = raw.parse()
        cost = hand_cost(answer.usage.model_dump(), "gpt-4o")
        assert raw.headers["x-tokengate-cost"] == f"{cost.normalize():f} USD"
        expected += cost
    chunks = list(
        client.chat.completions.create(
            model="gpt-4o",
            messages=PROMPT,
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    expected += hand_cost(chunks[-1].usage.model_dump(), "gpt-4o")
    r = httpx.get(f"{gw.url}/admin/usage", headers=ADMIN_H, params={"group_by": "team"})
    body = r.json()
    (row,) = body["data"]
    assert (row["team"], row["requests"], row["unpriced_requests"]) == ("ml", 4, 0)
    assert Decimal(str(row["cost"])) == expected
    assert Decimal(str(body["totals"]["cost"])) == expected
    (metric,) = samples(gw.metrics(), "tokengate_cost_total")
    assert (metric.labels["key"], metric.labels["model"]) == ("alice", "gpt-4o")
    assert metric.value == pytest.approx(float(expected))
    line = gw.access()[-1]
    assert (line["currency"], line["team"]) == ("USD", "ml")
    assert Decimal(line["cost"]) == hand_cost(chunks[-1].usage.model_dump(), "gpt-4o")


def test_the_sdk_gets_budget_exceeded_and_sends_the_refused_request_once(
    sim: Sim, make_gateway: Make
) -> None:
    # One answer of max_tokens 16 fits in 0.0002 USD; after it, the next estimate does not.
    key = {"budgets": [{"period": "month", "max_cost": "0.0003"}]}
    gw = make_gateway(spec({"k": key}), sim.url)
    client = gw.openai(max_retries=3)  # the SDK would retry a plain 429
    client.chat.completions.create(model="gpt-4o", messages=PROMPT, max_tokens=16)
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model="gpt-4o", messages=PROMPT, max_tokens=16)
    err = refused.value
    assert err.code == "budget_exceeded" and err.type == "insufficient_quota"
    assert err.response.headers["x-should-retry"] == "false"
    assert "the month cost budget of key 'k'" in err.message and "It resets at" in err.message
    assert len(sim.records("/v1/chat/completions")) == 1  # never reached the upstream
    refusals = [ln for ln in gw.access() if ln["status"] == 429]
    assert len(refusals) == 1  # exactly one request reached the gateway
    metrics = gw.metrics()
    assert 'tokengate_budget_exceeded_total{budget="month_cost",name="k",scope="key"} 1.0' in (
        metrics
    )


async def test_sixty_concurrent_requests_overshoot_only_by_their_estimate_errors(
    sim: Sim, make_gateway: Make
) -> None:
    limit = Decimal("0.002")
    key = {"budgets": [{"period": "day", "max_cost": str(limit)}]}
    gw = make_gateway(spec({"k": key}), sim.url)
    body = {"model": "gpt-4o", "messages": PROMPT, "max_tokens": 12}
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=100)) as c:
        answers = await asyncio.gather(
            *(
                c.post(f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers())
                for _ in range(60)
            )
        )
    ok = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 429]
    assert len(ok) + len(refused) == 60 and ok and refused
    assert all(r.json()["error"]["code"] == "budget_exceeded" for r in refused)
    costs = [hand_cost(r.json()["usage"], "gpt-4o") for r in ok]
    spent = sum(costs, Decimal(0))
    error = sum((max(Decimal(0), c - estimate(12)) for c in costs), Decimal(0))
    assert spent <= limit + error
    (month,) = budgets(gw)[("key", "k")]["budgets"]
    assert Decimal(str(month["spent"])) == spent and month["reserved"] == 0


async def burst(gws: list[Gateway], n: int, max_tokens: int = 12) -> list[httpx.Response]:
    """`n` chat requests spread over the replicas, all at once."""
    body = {"model": "gpt-4o", "messages": PROMPT, "max_tokens": max_tokens}
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=100)) as c:
        return list(
            await asyncio.gather(
                *(
                    c.post(
                        f"{gws[i % len(gws)].url}/v1/chat/completions",
                        json=body,
                        headers=gws[i % len(gws)].headers(),
                    )
                    for i in range(n)
                )
            )
        )


def spent_of(answers: list[httpx.Response]) -> tuple[Decimal, Decimal]:
    """What the admitted ones cost, and by how much they passed their estimates."""
    costs = [hand_cost(r.json()["usage"], "gpt-4o") for r in answers if r.status_code == 200]
    error = sum((max(Decimal(0), c - estimate(12)) for c in costs), Decimal(0))
    return sum(costs, Decimal(0)), error


async def test_two_replicas_sharing_redis_hold_one_budget_across_a_redis_restart(
    sim: Sim, make_gateway: Make, redis: Redis, tmp_path: Any
) -> None:
    limit = Decimal("0.002")  # about 12 estimates of 0.000165
    key = {"budgets": [{"period": "day", "max_cost": str(limit)}]}
    shared = spec({"k": key}, database={"path": str(tmp_path / "shared.sqlite3")})
    shared.env = {"TOKENGATE_REDIS_URL": redis.url}
    one = make_gateway(shared, sim.url)
    shared.secrets = one.keys  # the same client key on both replicas
    two = make_gateway(shared, sim.url)
    answers = await burst([one, two], 60)
    spent, error = spent_of(answers)
    refused = [r for r in answers if r.status_code == 429]
    assert refused and all(r.json()["error"]["code"] == "budget_exceeded" for r in refused)
    # alone, each replica would have let about the whole budget through
    assert spent <= limit + error
    await asyncio.sleep(2.5)  # flushed to the ledger and read back by both replicas
    redis.kill()
    redis.start()  # empty: nothing persisted
    # the budget is rebuilt from the durable spend: what is left still holds
    more = await burst([one, two], 30)
    extra, more_error = spent_of(more)
    assert spent + extra <= limit + error + more_error
    states = {httpx.get(f"{g.url}/health/ready").json()["redis"]["state"] for g in (one, two)}
    assert states == {"shared"}


def test_spend_survives_a_restart_of_the_gateway(sim: Sim, make_gateway: Make) -> None:
    key = {"budgets": [{"period": "week", "max_tokens": 200}]}
    gw = make_gateway(spec({"k": key}), sim.url)
    client = gw.openai()
    used = 0
    for _ in range(3):
        answer = client.chat.completions.create(model="gpt-4o", messages=PROMPT, max_tokens=16)
        used += answer.usage.total_tokens
    before = budgets(gw)[("key", "k")]["budgets"][0]
    assert before["spent"] == used
    gw.restart()  # SIGTERM, then a new process on the same database
    after = budgets(gw)[("key", "k")]["budgets"][0]
    assert after["spent"] == used and after["period_id"] == before["period_id"]
    with pytest.raises(openai.RateLimitError, match="week tokens budget"):
        for _ in range(10):
            gw.openai().chat.completions.create(model="gpt-4o", messages=PROMPT, max_tokens=16)


def test_tokengate_usage_prints_a_table_csv_and_json(sim: Sim, make_gateway: Make) -> None:
    keys = {"alice": {"team": "ml"}, "bob": {}}
    gw = make_gateway(spec(keys, teams=[{"name": "ml"}]), sim.url)
    for alias in ("alice", "bob", "alice"):
        gw.openai(alias).chat.completions.create(model="gpt-4o", messages=PROMPT, max_tokens=8)

    def usage(*args: str) -> str:
        done = run_cli(
            "usage",
            "--target",
            gw.url,
            *args,
            env={"TOKENGATE_ADMIN_KEY": ADMIN, "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    table = usage("--since", "1d", "--by", "key")
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["key", "requests", "errors"]
    assert lines[1].split()[:2] == ["alice", "2"] and lines[2].split()[:2] == ["bob", "1"]
    assert lines[-1].split()[:2] == ["total", "3"] and lines[-1].endswith("USD")
    rows = list(csv.DictReader(io.StringIO(usage("--by", "team", "--format", "csv"))))
    assert [(r["team"], r["requests"]) for r in rows] == [("-", "1"), ("ml", "2"), ("total", "3")]
    data = json.loads(usage("--by", "model", "--granularity", "day", "--format", "json"))
    (row,) = data["data"]
    assert row["model"] == "gpt-4o" and row["period"].startswith(row["period"][:10])
    assert data["totals"]["requests"] == 3 and data["totals"]["cost"] > 0
    refused = run_cli(
        "usage", "--target", gw.url, env={"TOKENGATE_ADMIN_KEY": "wrong", "PATH": "/usr/bin:/bin"}
    )
    assert refused.returncode == 1 and "401" in refused.stdout


def test_models_without_a_price_are_named_by_check_and_at_start(
    sim: Sim, make_gateway: Make, tmp_path: Path
) -> None:
    only_gpt = json.dumps({"gpt-4o": PRICES["gpt-4o"]})
    env = {
        "PATH": "/usr/bin:/bin",
        "TAOTOKEN_API_KEY": sim.api_key,
        "TOKENGATE_API_ENDPOINT": sim.url,
        "TOKENGATE_BILLING__PRICES": only_gpt,
        # what `serve` needs on this host, which check verifies too (issue #26)
        "TOKENGATE_LOGGING__OUTPUT": "stderr",
        "TOKENGATE_KEYS": json.dumps([{"alias": "a", "key_sha256": "a" * 64}]),
        "TOKENGATE_DATABASE__PATH": str(tmp_path / "tokengate.sqlite3"),
    }
    done = run_cli("check", "--port", str(free_port()), env=env)
    assert done.returncode == 0, done.stdout
    out = done.stdout
    # the seed routes claude-sonnet (default) and gpt-4o (fallback); the sim lists three
    assert "warning: no price in billing.prices for 1 model(s): claude-sonnet" in out
    assert "for 2 model(s): claude-sonnet, text-embedding-3-small" in out
    gw = make_gateway(GatewaySpec(env={"TOKENGATE_BILLING__PRICES": only_gpt}), sim.url)
    (line,) = [x for x in gw.log_lines() if x.get("msg", "").startswith("billing: no price")]
    assert "claude-sonnet, text-embedding-3-small" in line["msg"] and line["level"] == "warning"
    answer = gw.openai().chat.completions.with_raw_response.create(
        model="claude-sonnet", messages=PROMPT, max_tokens=4
    )
    assert answer.headers["x-tokengate-cost"] == "unknown"  # served, never priced at zero


def test_cached_tokens_of_the_sims_prompt_cache_are_priced_at_their_own_rate(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--cache-min-tokens", "64")
    gw = make_gateway(spec({"alice": {}}), sim.url)
    long = " ".join(f"word{i}" for i in range(600))  # well past 64 of the sim's tokens
    messages = [{"role": "system", "content": long}, *PROMPT]
    client, usages = gw.openai(), []
    expected = Decimal(0)
    for _ in range(2):  # the second reads the first's prefix from the sim's cache
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=messages, max_tokens=8
        )
        usage = raw.parse().usage.model_dump()
        usages.append(usage)
        cost = hand_cost(usage, "gpt-4o")
        assert raw.headers["x-tokengate-cost"] == f"{cost.normalize():f} USD"
        expected += cost
    cached = (usages[1].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    assert cached > 0 and usages[1]["prompt_tokens"] == usages[0]["prompt_tokens"]
    (row,) = httpx.get(f"{gw.url}/admin/usage", headers=ADMIN_H).json()["data"]
    assert row["cached_tokens"] == cached and row["prompt_tokens"] == 2 * usages[0]["prompt_tokens"]
    assert Decimal(str(row["cost"])) == expected
