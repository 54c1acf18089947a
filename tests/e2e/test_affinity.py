"""Prompt-cache affinity over real sockets: three `tokengate sim` domains, each with its
own prompt cache. Multi-turn sessions keep to one domain, so every turn after the first
is served from its cache; a domain that goes down moves its own sessions and no other."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.support.procs import Gateway, GatewaySpec, Sim
from tests.support.scrape import metric_sum
from tests.support.waiting import wait_until

Make = Callable[..., Gateway]
Conversation = list[dict[str, Any]]


def start(make_sim: Callable[..., Sim], make_gateway: Make) -> tuple[Gateway, list[Sim]]:
    sims = [make_sim() for _ in range(3)]
    domains = [
        {"domain": f"d{i}", "api_base": s.url, "api_key_env": "TAOTOKEN_API_KEY"}
        for i, s in enumerate(sims)
    ]
    settings = {
        "health_check": {"interval_sec": 0.3, "timeout_ms": 500},
        "retry_policy": {"max_attempts": 1},
    }
    return make_gateway(GatewaySpec(toml={"scale_up": domains}, settings=settings)), sims


def conversations(n: int) -> list[Conversation]:
    """Each with a long prefix of its own (past the simulator's 1024-token minimum)."""
    return [
        [
            {"role": "system", "content": f"project {i}: " + "context " * 1200},
            {"role": "user", "content": f"task {i}"},
        ]
        for i in range(n)
    ]


def turn(client: httpx.Client, gw: Gateway, conv: Conversation, n: int) -> tuple[str, int, int]:
    """One turn: (serving domain, prompt tokens, cached tokens); the answer and the next
    user message are appended to the conversation."""
    r = client.post(
        f"{gw.url}/v1/chat/completions",
        headers=gw.headers(),
        json={"model": "gpt-4o", "messages": conv, "max_tokens": 8},
    )
    r.raise_for_status()
    body = r.json()
    conv += [body["choices"][0]["message"], {"role": "user", "content": f"turn {n}"}]
    usage = body["usage"]
    return (
        r.headers["x-tokengate-domain"],
        usage["prompt_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"],
    )


def test_turns_hit_their_domains_cache_and_a_failure_moves_only_its_sessions(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    gw, sims = start(make_sim, make_gateway)
    convs = conversations(12)
    home: dict[int, str] = {}
    last = dict.fromkeys(range(len(convs)), 0)
    cached = ideal = 0
    with httpx.Client(timeout=30) as client:
        for n in range(4):
            for i, conv in enumerate(convs):
                domain, prompt, hit = turn(client, gw, conv, n)
                assert home.setdefault(i, domain) == domain  # every turn on one domain
                cached, ideal = cached + hit, ideal + last[i]  # ideal: all of the last turn
                last[i] = prompt
        assert len(set(home.values())) == 3  # the sessions spread over the three
        assert cached == ideal > 0

        down = home[0]
        sims[int(down[1:])].stop()
        wait_until(
            lambda: (
                httpx.get(f"{gw.url}/health/ready").json()["domains"][down]["state"] == "unhealthy"
            ),
            "the stopped domain to show unhealthy",
        )
        for i, conv in enumerate(convs):
            domain, _, hit = turn(client, gw, conv, 9)
            if home[i] == down:
                assert domain != down and hit == 0  # moved, to a cold cache
            else:
                assert domain == home[i] and hit == last[i]  # unmoved, still cached
    failovers = metric_sum(gw.metrics(), "tokengate_affinity_total", outcome="failover")
    assert failovers == sum(1 for d in home.values() if d == down)
