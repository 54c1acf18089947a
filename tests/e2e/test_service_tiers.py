"""Service tiers over real sockets, with the openai SDK and `tokengate sim` (which reports
the tier it served, as OpenAI does): passed upstream where the domain serves the tier,
taken out and served by the gateway's own classes where it does not, per-key allowed and
forced tiers, a price per served tier, and flex's 429 when there is no spare capacity."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest

from tests.support.procs import Gateway, GatewaySpec, Sim
from tests.support.scrape import metric_sum, samples

Make = Callable[..., Gateway]
PROMPT = [{"role": "user", "content": "Which tier served this line?"}]
ALL_TIERS = ["auto", "default", "flex", "priority"]
PRICES: dict[str, Any] = {
    "gpt-4o": {
        "input": "2.50",
        "output": "10.00",
        "tiers": {
            "flex": {"input": "1.25", "output": "5.00"},
            "priority": {"input": "4.25", "output": "17.00"},
        },
    }
}
KEYS: dict[str, dict[str, Any]] = {
    "web": {"service_tiers": ["auto", "default", "priority"]},
    "background": {"service_tier": "flex"},
    "anyone": {},
    "flex": {},
}


def spec(serves: list[str], **toml: Any) -> GatewaySpec:
    return GatewaySpec(
        keys=KEYS,
        settings={"billing": {"prices": PRICES}},
        toml={"scale_up": {"service_tiers": serves}, **toml},
    )


def hand_cost(usage: Any, tier: str) -> str:
    price = PRICES["gpt-4o"] if tier == "default" else PRICES["gpt-4o"]["tiers"][tier]
    million = usage.prompt_tokens * Decimal(price["input"]) + usage.completion_tokens * Decimal(
        price["output"]
    )
    return f"{(million / Decimal(10**6)).normalize():f} USD"


class Clients:
    """One openai client per key, closed at the end (no socket left to the collector)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.made: dict[str, Any] = {}

    def __call__(self, alias: str, **kwargs: Any) -> Any:
        if alias not in self.made:
            self.made[alias] = self.gw.openai(alias, **kwargs)
        return self.made[alias]

    def close(self) -> None:
        for client in self.made.values():
            client.close()


@pytest.fixture
def clients() -> Any:
    made: list[Clients] = []

    def make(gw: Gateway) -> Clients:
        made.append(Clients(gw))
        return made[-1]

    yield make
    for c in made:
        c.close()


def sent_tier(sim: Sim) -> object:
    (record,) = [r for r in sim.records("/v1/chat/completions")]
    sim.clear()
    return record["body"].get("service_tier", "(none)")


def test_a_domain_serving_tiers_gets_them_and_each_answer_is_priced_by_its_tier(
    sim: Sim, make_gateway: Make, clients: Any
) -> None:
    gw = make_gateway(spec(ALL_TIERS), sim.url)
    client = clients(gw)
    for tier in ("flex", "priority", "default"):
        raw = client("anyone").chat.completions.with_raw_response.create(
            model="gpt-4o", messages=PROMPT, max_tokens=6, service_tier=tier
        )
        answer = raw.parse()
        assert answer.service_tier == tier  # the sim served it in that tier
        assert sent_tier(sim) == tier
        assert raw.headers["x-tokengate-cost"] == hand_cost(answer.usage, tier)
        assert gw.access()[-1]["service_tier"] == tier
    # a stream is priced by the tier its chunks report
    chunks = list(
        client("anyone").chat.completions.create(
            model="gpt-4o",
            messages=PROMPT,
            max_tokens=5,
            service_tier="flex",
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert sent_tier(sim) == "flex"
    line = gw.access()[-1]
    assert line["service_tier"] == "flex"
    assert f"{line['cost']} USD" == hand_cost(chunks[-1].usage, "flex")


def test_keys_may_be_refused_a_tier_or_have_one_forced(
    sim: Sim, make_gateway: Make, clients: Any
) -> None:
    gw = make_gateway(spec(ALL_TIERS), sim.url)
    client = clients(gw)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        client("web").chat.completions.create(
            model="gpt-4o", messages=PROMPT, max_tokens=4, service_tier="flex"
        )
    assert refused.value.code == "service_tier_not_allowed"
    assert sim.records("/v1/chat/completions") == []
    with pytest.raises(openai.BadRequestError) as bad:
        client("anyone").chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=PROMPT,
            max_tokens=4,
            extra_body={"service_tier": "platinum"},
        )
    assert bad.value.body["param"] == "service_tier"  # type: ignore[index]
    answer = client("background").chat.completions.create(
        model="gpt-4o", messages=PROMPT, max_tokens=4, service_tier="priority"
    )
    assert sent_tier(sim) == "flex" and answer.service_tier == "flex"
    client("background").chat.completions.create(model="gpt-4o", messages=PROMPT, max_tokens=4)
    assert sent_tier(sim) == "flex"  # forced on a request that asked for none too


def test_a_domain_serving_no_tier_gets_none_and_bills_what_it_served(
    sim: Sim, make_gateway: Make, clients: Any
) -> None:
    gw = make_gateway(spec([]), sim.url)
    client = clients(gw)
    raw = client("anyone").chat.completions.with_raw_response.create(
        model="gpt-4o", messages=PROMPT, max_tokens=6, service_tier="priority"
    )
    answer = raw.parse()
    assert sent_tier(sim) == "(none)"
    assert answer.service_tier == "default"  # served (and billed) at default
    assert raw.headers["x-tokengate-cost"] == hand_cost(answer.usage, "default")


def inflight(gw: Gateway) -> float:
    return metric_sum(gw.metrics(), "tokengate_inflight")


def test_flex_without_spare_capacity_gets_openais_flex_429(
    make_sim: Callable[..., Sim], make_gateway: Make, clients: Any
) -> None:
    slow = make_sim("--latency-ms", "4000")
    toml = {
        "token_scheduler": {
            "max_inflight": 1,
            "max_queue_wait_ms": 200,
            "flex_max_queue_wait_ms": 400,
        }
    }
    gw = make_gateway(spec([], **toml), slow.url)
    client = clients(gw)
    busy = threading.Thread(
        target=lambda: client("anyone", timeout=30).chat.completions.create(
            model="gpt-4o", messages=PROMPT, max_tokens=4
        )
    )
    busy.start()
    deadline = time.monotonic() + 20
    while inflight(gw) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert inflight(gw) == 1
    with pytest.raises(openai.RateLimitError) as err:
        client("flex").chat.completions.create(
            model="gpt-4o", messages=PROMPT, max_tokens=4, service_tier="flex"
        )
    busy.join(30)
    assert err.value.code == "resource_unavailable"
    assert err.value.response.headers["x-should-retry"] == "true"
    assert "Resource Unavailable" in err.value.message
    line = [x for x in gw.access() if x["status"] == 429][-1]
    assert (line["error"], line["cost"]) == ("resource_unavailable", "0")
    assert len(slow.records("/v1/chat/completions")) == 1  # the flex one never went upstream
    assert httpx.get(f"{gw.url}/health", timeout=10).status_code == 200


def test_an_upstream_429_to_flex_is_flexs_429_and_cools_nothing_down(
    sim: Sim, make_gateway: Make, clients: Any
) -> None:
    gw = make_gateway(spec(ALL_TIERS), sim.url)
    client = clients(gw)
    sim.faults(status=429, count=1, retry_after=30)  # the upstream's flex capacity is short
    with pytest.raises(openai.RateLimitError) as err:
        client("anyone").chat.completions.create(
            model="gpt-4o", messages=PROMPT, max_tokens=4, service_tier="flex"
        )
    assert err.value.code == "resource_unavailable"
    answer = client("anyone").chat.completions.create(model="gpt-4o", messages=PROMPT, max_tokens=4)
    assert answer.choices  # served
    throttled = samples(gw.metrics(), "tokengate_upstream_throttled_total")
    assert all(s.value == 0 for s in throttled)  # no domain cool-down
