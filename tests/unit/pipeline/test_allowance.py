"""What a request holds against budgets and the output cap it is sent with
(`app/pipeline/allowance.py`), in process against a fake upstream that keeps the bodies."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from app.errors import BudgetExceeded
from app.gateway import Gateway
from app.pipeline.request import CHAT, RESPONSES
from app.pipeline.wire import parse_call
from tests.support.inproc import MakeGateway

MESSAGES = [{"role": "user", "content": "cap me"}]
ANSWER = {
    "id": "c",
    "object": "chat.completion",
    "model": "m-1",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1},
}
BASE = {
    "model_route": {"default": "m-1"},
    "retry_policy": {"max_attempts": 1},
    "scale_up": {"models": ["m-1"]},
    "rate_limit": {"default_max_tokens": 300},
    "billing": {"prices": {"m-1": {"input": 2, "output": 8}}},
}


class Upstream:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        return httpx.Response(200, json=ANSWER)


async def chat(gw: Gateway, **body: Any) -> None:
    await gw.start()
    raw = json.dumps({"messages": MESSAGES, **body}).encode()
    call = parse_call(CHAT, raw, gw.runtime.keys[0], "req", {}, time.perf_counter())
    await gw.pipeline.handle(call)


def keyed(budget: dict[str, Any] | None) -> dict[str, Any]:
    key = {"alias": "k", "key_sha256": "f" * 64, "budgets": [budget] if budget else []}
    return {**BASE, "keys": [key]}


async def test_without_a_budget_the_clients_bytes_go_upstream_untouched(
    make_local_gateway: MakeGateway,
) -> None:
    upstream = Upstream()
    gw = make_local_gateway(keyed(None), handler=upstream)
    await chat(gw, model="m-1")
    assert "max_tokens" not in upstream.bodies[0]


async def test_a_budget_sends_the_allowance_it_holds_as_the_cap(
    make_local_gateway: MakeGateway,
) -> None:
    upstream = Upstream()
    budget = {"period": "day", "max_tokens": 230, "on_short": "cap"}
    gw = make_local_gateway(keyed(budget), handler=upstream)
    prompt = parse_call(
        CHAT, json.dumps({"messages": MESSAGES}).encode(), gw.runtime.keys[0], "r", {}, 0.0
    ).prompt_tokens
    await chat(gw, model="m-1")  # no cap asked: what is left of 230 (not 300) held and sent
    await chat(gw, model="m-1", max_completion_tokens=200)  # fits: in the field the client used
    await chat(gw, model="m-1", max_tokens=220)  # 12 spent: capped to what is left
    sent = [(b.get("max_tokens"), b.get("max_completion_tokens")) for b in upstream.bodies]
    assert sent == [(230 - prompt, None), (None, 200), (230 - 12 - prompt, None)]


async def test_a_refusing_budget_refuses_what_its_whole_allowance_does_not_fit(
    make_local_gateway: MakeGateway,
) -> None:
    upstream = Upstream()
    gw = make_local_gateway(keyed({"period": "day", "max_tokens": 250}), handler=upstream)
    with pytest.raises(BudgetExceeded, match="needs up to"):
        await chat(gw, model="m-1")  # 300 by default: more than the 250 of the budget
    await chat(gw, model="m-1", max_tokens=100)
    assert upstream.bodies == [{"model": "m-1", "messages": MESSAGES, "max_tokens": 100}]


async def test_a_background_response_always_goes_with_max_output_tokens(
    make_local_gateway: MakeGateway,
) -> None:
    upstream = Upstream()
    gw = make_local_gateway(
        {**keyed(None), "scale_up": {"models": ["m-1"], "responses": True}}, handler=upstream
    )
    await gw.start()
    raw = json.dumps({"model": "m-1", "input": "hi", "background": True}).encode()
    call = parse_call(RESPONSES, raw, gw.runtime.keys[0], "req", {}, time.perf_counter())
    await gw.pipeline.handle(call)
    assert upstream.bodies[0]["max_output_tokens"] == 300


PEAK = {
    "windows": {"peak": {"start": "08:00", "end": "20:00"}},
    "prices": {"m-1": {"input": 2, "output": 8, "windows": {"peak": {"output": 16}}}},
}
NOON = datetime(2026, 12, 5, 12, 0, tzinfo=UTC).timestamp()
NIGHT = datetime(2026, 12, 5, 2, 0, tzinfo=UTC).timestamp()


def _at(gw: Gateway, t: float) -> None:
    gw.pipeline.pricing.wall_clock = gw.pipeline.allowance.clock = lambda: t


async def test_a_cost_hold_is_priced_in_the_window_in_force(
    make_local_gateway: MakeGateway,
) -> None:
    """300 output tokens cost 0.0024 at the base price and 0.0048 at peak: a 0.003 budget
    holds one at night and refuses one at noon (priced at the base, it was let through and
    could spend past the budget)."""
    upstream = Upstream()
    settings = {**keyed({"period": "day", "max_cost": 0.003}), "billing": PEAK}
    gw = make_local_gateway(settings, handler=upstream)
    _at(gw, NOON)
    with pytest.raises(BudgetExceeded, match="needs up to"):
        await chat(gw, model="m-1")
    assert upstream.bodies == []
    _at(gw, NIGHT)
    await chat(gw, model="m-1")
    assert upstream.bodies[0]["max_tokens"] == 300


async def test_a_window_beginning_before_the_request_can_be_served_is_priced_in(
    make_local_gateway: MakeGateway,
) -> None:
    upstream = Upstream()
    settings = {**keyed({"period": "day", "max_cost": 0.003}), "billing": PEAK}
    gw = make_local_gateway(settings, handler=upstream)
    eight = datetime(2026, 12, 5, 8, 0, tzinfo=UTC).timestamp()
    _at(gw, eight - 5)  # peak begins within the queue wait and the upstream's timeout
    with pytest.raises(BudgetExceeded):
        await chat(gw, model="m-1")
    _at(gw, eight - 6 * 3600)  # hours before it: the night's price
    await chat(gw, model="m-1")
    assert len(upstream.bodies) == 1
