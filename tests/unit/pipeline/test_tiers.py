"""Service tiers in-process: the key's policy, where a request waits on a domain that
serves the tier or not, the body sent upstream, flex's 429 and prices per served tier."""

from __future__ import annotations

import json
from dataclasses import replace

import orjson
import pytest
from pydantic import SecretStr

from app.billing.prices import PriceList, Tokens
from app.config.billing import PriceConfig
from app.errors import FlexUnavailable, InvalidRequest, PermissionDenied, ServiceUnavailable
from app.kinds import Priority, QueueClass, ServiceTier
from app.pipeline.request import CHAT
from app.pipeline.tiers import ServiceTiers
from app.pipeline.wire import parse_call
from app.runtime import DomainSpec, KeySpec

KEY = KeySpec("k", ("0" * 64,), 1000, 1000, priority=Priority.LOW)
SERVES = DomainSpec(
    "served", "http://x", SecretStr("s"), "E", None, 4, service_tiers=frozenset(ServiceTier)
)
PLAIN = replace(SERVES, name="plain", service_tiers=frozenset())


def call(body: dict[str, object], key: KeySpec = KEY):  # type: ignore[no-untyped-def]
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **body}
    return parse_call(CHAT, json.dumps(body).encode(), key, "r", {}, 0.0)


def test_the_key_may_refuse_or_force_a_tier_and_nonsense_is_a_400() -> None:
    assert call({}).service_tier is None
    assert call({"service_tier": "flex"}).service_tier is ServiceTier.FLEX
    with pytest.raises(InvalidRequest) as bad:
        call({"service_tier": "gold"})
    assert bad.value.param == "service_tier"
    with pytest.raises(InvalidRequest):
        call({"service_tier": 3})
    web = replace(KEY, service_tiers=frozenset({ServiceTier.DEFAULT}))
    with pytest.raises(PermissionDenied) as refused:
        call({"service_tier": "priority"}, web)
    assert refused.value.code == "service_tier_not_allowed"
    assert call({"service_tier": "default"}, web).service_tier is ServiceTier.DEFAULT
    forced = replace(KEY, service_tier=ServiceTier.FLEX)
    assert call({}, forced).service_tier is ServiceTier.FLEX
    assert call({"service_tier": "priority"}, forced).service_tier is ServiceTier.FLEX


def test_where_a_request_waits_and_what_goes_upstream() -> None:
    tiers = ServiceTiers()
    tiers.configure(30_000, 600_000)
    flex, prio, auto = (call({"service_tier": t}) for t in ("flex", "priority", "auto"))
    assert tiers.place(flex, SERVES) == (QueueClass.LOW, True, 0.0)  # the key's own class
    assert tiers.place(flex, PLAIN) == (QueueClass.BATCH, False, 570.0)
    assert tiers.place(prio, PLAIN) == (QueueClass.HIGH, False, 0.0)
    assert tiers.place(auto, PLAIN) == (QueueClass.LOW, False, 0.0)
    assert orjson.loads(flex.body_for("m", True))["service_tier"] == "flex"
    assert "service_tier" not in orjson.loads(flex.body_for("m", False))
    plain = call({})
    assert plain.body_for("m", True) is plain.raw  # nothing to change: the client's bytes
    forced = call({"service_tier": "priority"}, replace(KEY, service_tier=ServiceTier.FLEX))
    assert orjson.loads(forced.body_for("m", True))["service_tier"] == "flex"


def test_only_a_flex_request_without_capacity_gets_flexs_429() -> None:
    full = ServiceUnavailable("queue full", code="queue_full", retry_after=3.0)
    flex = call({"service_tier": "flex"})
    refused = ServiceTiers.refusal(flex, full)
    assert isinstance(refused, FlexUnavailable)
    assert (refused.status, refused.code, refused.retry_after) == (429, "resource_unavailable", 3.0)
    assert refused.response_headers()["x-should-retry"] == "true"
    assert ServiceTiers.refusal(call({}), full) is full
    down = ServiceUnavailable("no domain", code="no_healthy_domain")
    assert ServiceTiers.refusal(flex, down) is down


def test_prices_follow_the_served_tier_and_a_tier_wins_over_a_window() -> None:
    cfg = PriceConfig.model_validate(
        {
            "input": 2,
            "output": 10,
            "cached_input": 1,
            "windows": {"night": {"input": 1.5, "output": 6}},
            "tiers": {"flex": {"input": 1, "output": 5}, "priority": {"output": 20}},
        }
    )
    prices = PriceList({"m": cfg})
    t = Tokens(prompt=1_000_000, completion=1_000_000)
    assert prices.cost(t, "m", tier="default") == 12 * 10**9
    assert prices.cost(t, "m", tier="flex") == 6 * 10**9
    assert prices.cost(t, "m", tier="priority") == 22 * 10**9
    assert prices.cost(t, "m", tier="scale") == 12 * 10**9  # unknown tier: the model's price
    assert prices.cost(t, "m", window="night") == int(7.5 * 10**9)
    assert prices.cost(t, "m", window="night", tier="priority") == int(21.5 * 10**9)
    assert prices.cost(t, "m", window="night", tier="flex") == 6 * 10**9
