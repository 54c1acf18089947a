"""`anthropic-beta` on a strict upstream, over real sockets with the Anthropic SDK: a
beta the upstream does not know is dropped (not fatal) either by the domain's policy
before it is sent or, refused in a 400 that names it, on one retry without it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import anthropic
import pytest

from tests.support.procs import Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
KNOWN = "claude-code-*,interleaved-thinking-*"
NEW = "context-1m-2026-11-01"  # released after the upstream's last update
ASK: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.fixture
def strict(make_sim: Callable[..., Sim]) -> Sim:
    return make_sim("--betas", KNOWN)


def gateway(make_gateway: Make, sim: Sim, policy: dict[str, Any] | None = None) -> Gateway:
    scale_up: dict[str, Any] = {"api_style": "anthropic"}
    if policy is not None:
        scale_up["headers"] = {"anthropic-beta": policy}
    return make_gateway(GatewaySpec(toml={"scale_up": scale_up}), sim.url)


def ask(gw: Gateway, *, stream: bool) -> str:
    betas = ["claude-code-20250219", "interleaved-thinking-2025-05-14", NEW]
    with anthropic.Anthropic(base_url=gw.url, api_key=gw.key, max_retries=0) as client:
        if stream:
            with client.beta.messages.stream(
                model="claude-sonnet", max_tokens=64, messages=ASK, betas=betas
            ) as s:
                return s.get_final_message().stop_reason or ""
        return (
            client.beta.messages.create(
                model="claude-sonnet", max_tokens=64, messages=ASK, betas=betas
            ).stop_reason
            or ""
        )


def refused_count(gw: Gateway) -> float:
    pattern = (
        r'tokengate_header_values_refused_total\{domain="[^"]+",header="anthropic-beta"\} (\S+)'
    )
    found = re.search(pattern, gw.metrics())
    return float(found.group(1)) if found else 0.0


def test_a_beta_refused_by_name_is_retried_without_it_then_dropped_up_front(
    make_gateway: Make, strict: Sim
) -> None:
    gw = gateway(make_gateway, strict)
    assert ask(gw, stream=True) == "end_turn"
    first, retry = strict.records("/v1/messages")
    assert first["status"] == 400 and NEW in first["headers"]["anthropic-beta"]
    assert retry["status"] == 200
    assert retry["headers"]["anthropic-beta"] == (
        "claude-code-20250219,interleaved-thinking-2025-05-14"
    )
    assert refused_count(gw) == 1.0
    # learned: the next request goes once, without it, and nothing more is counted
    assert ask(gw, stream=False) == "end_turn"
    assert [r["status"] for r in strict.records("/v1/messages")] == [400, 200, 200]
    assert NEW not in strict.records("/v1/messages")[2]["headers"]["anthropic-beta"]
    assert refused_count(gw) == 1.0


def test_an_allow_list_with_a_year_rule_sends_only_matching_betas(
    make_gateway: Make, strict: Sim
) -> None:
    gw = gateway(make_gateway, strict, {"allow": ["claude-code-*", "*-2025-*"]})
    assert ask(gw, stream=False) == "end_turn"
    (rec,) = strict.records("/v1/messages")  # one request: nothing refused
    assert (
        rec["headers"]["anthropic-beta"] == "claude-code-20250219,interleaved-thinking-2025-05-14"
    )


def test_without_the_retry_the_client_sees_the_upstreams_400(
    make_gateway: Make, strict: Sim
) -> None:
    gw = gateway(make_gateway, strict, {"retry_refused": False})
    with pytest.raises(anthropic.BadRequestError) as err:
        ask(gw, stream=False)
    assert NEW in str(err.value)
    assert len(strict.records("/v1/messages")) == 1
