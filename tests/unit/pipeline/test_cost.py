"""What a request costs, as the pipeline prices and records it: the cost header, the
ledger's cost and estimated flags, and the honest count when usage never arrives."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from app.db.usage import UsageQuery
from app.errors import BudgetExceeded, UpstreamFailed
from app.gateway import Gateway
from app.limits.estimate import chat_prompt_tokens
from app.pipeline.answer import StreamAnswer
from app.pipeline.replies import JsonAnswer
from app.pipeline.request import CHAT
from app.pipeline.wire import parse_call
from tests.support.clock import FakeClock
from tests.support.inproc import MakeGateway, ledger_rows

PRICED = {
    "model_aliases": {"m": "m-1"},
    "model_route": {"default": "m"},
    "retry_policy": {"max_attempts": 1},
    "scale_up": {"models": ["m-1"]},
    # per million: input 2, output 8, cached 0.5
    "billing": {"prices": {"m-1": {"input": 2, "output": 8, "cached_input": 0.5}}},
}
MESSAGES = [{"role": "user", "content": "How much does this cost?"}]
ANSWER = {
    "id": "c",
    "object": "chat.completion",
    "model": "m-1-2026-01-01",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "About nothing."}}],
    "usage": {
        "prompt_tokens": 2000,
        "completion_tokens": 500,
        "prompt_tokens_details": {"cached_tokens": 1500},
    },
}
Make = Callable[..., Gateway]


@pytest.fixture
def make(make_local_gateway: MakeGateway) -> Make:
    def build(handler: Any, **extra: Any) -> Gateway:
        # the key's rate-limit buckets stand still: what remains is exact at any speed
        return make_local_gateway({**PRICED, **extra}, handler=handler, clock=FakeClock())

    return build


async def by_status(gw: Gateway) -> list[dict[str, Any]]:
    return await gw.ledger.report(UsageQuery(group_by=("status",)))


async def ask(gw: Gateway, **body: Any) -> JsonAnswer | StreamAnswer:
    await gw.start()
    raw = json.dumps({"messages": MESSAGES, **body}).encode()
    key = gw.keys.anonymous if not gw.runtime.keys else gw.runtime.keys[0]
    call = parse_call(CHAT, raw, key, "req_c", {}, time.perf_counter())
    return await gw.pipeline.handle(call)


async def test_a_json_answer_carries_its_cost_and_the_ledger_has_it_exactly(make: Make) -> None:
    gw = make(lambda r: httpx.Response(200, json=ANSWER))
    answer = await ask(gw)
    # 500 plain x 2 + 1500 cached x 0.5 + 500 out x 8 = 1000 + 750 + 4000 per million
    assert isinstance(answer, JsonAnswer)
    assert answer.headers["x-tokengate-cost"] == "0.00575 USD"
    (row,) = await ledger_rows(gw)
    assert row["cost_nanos"] == 5_750_000 and row["unpriced_requests"] == 0
    assert (row["prompt_tokens"], row["cached_tokens"]) == (2000, 1500)  # cached counted once


async def test_a_model_without_a_price_costs_unknown_never_zero(make: Make) -> None:
    gw = make(lambda r: httpx.Response(200, json=ANSWER), billing={"prices": {}})
    answer = await ask(gw)
    assert isinstance(answer, JsonAnswer) and answer.headers["x-tokengate-cost"] == "unknown"
    (row,) = await ledger_rows(gw)
    assert (row["unpriced_requests"], row["cost_nanos"]) == (1, 0)


async def test_a_200_without_usage_is_counted_from_what_it_delivered(make: Make) -> None:
    bare = {k: v for k, v in ANSWER.items() if k != "usage"}
    gw = make(lambda r: httpx.Response(200, json=bare))
    await ask(gw, max_tokens=4000)
    (row,) = await ledger_rows(gw)
    assert row["estimated_requests"] == 1
    assert row["prompt_tokens"] == chat_prompt_tokens(MESSAGES)  # the prompt estimate
    assert row["completion_tokens"] == 4  # "About nothing." (14 chars), never max_tokens
    assert row["cost_nanos"] == (row["prompt_tokens"] * 2 + 4 * 8) * 1000


async def test_a_stream_cut_after_tokens_is_charged_what_was_delivered_with_its_own_status(
    make: Make,
) -> None:
    sse = (
        b'data: {"model":"m-1","choices":[{"index":0,"delta":{"content":"twelve chars"}}]}\n\n'
        b'data: {"model":"m-1","choices":[{"index":0,"delta":{"content":"and eight"}}]}\n\n'
    )  # no usage, no [DONE]: the upstream closed early
    gw = make(
        lambda r: httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})
    )
    answer = await ask(gw, stream=True)
    assert isinstance(answer, StreamAnswer)
    out = b"".join([c async for c in answer.body()])
    assert b"stream_interrupted" in out
    (row,) = await by_status(gw)
    assert (row["status"], row["requests"], row["estimated_requests"]) == (502, 1, 1)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (0, 0)  # nothing billed twice
    assert row["failed_prompt_tokens"] == chat_prompt_tokens(MESSAGES)
    assert row["failed_completion_tokens"] == 6  # 21 characters of text
    assert row["cost_nanos"] == (row["failed_prompt_tokens"] * 2 + 6 * 8) * 1000


async def test_a_client_gone_while_the_upstream_had_its_request_is_charged_the_prompt(
    make: Make,
) -> None:
    started = asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        started.set()
        await asyncio.sleep(60)
        raise AssertionError

    gw = make(slow)
    task = asyncio.ensure_future(ask(gw))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (row,) = await by_status(gw)
    assert (row["status"], row["estimated_requests"]) == (499, 1)
    assert (row["failed_prompt_tokens"], row["failed_completion_tokens"]) == (
        chat_prompt_tokens(MESSAGES),
        0,
    )


async def test_a_request_the_upstream_read_but_never_answered_is_charged_its_prompt_once(
    make: Make,
) -> None:
    """A reset after the request was written: the upstream may have billed the prompt, so
    the ledger keeps the prompt estimate as failed and estimated."""
    sent = 0

    def reset(request: httpx.Request) -> httpx.Response:
        nonlocal sent
        sent += 1
        raise httpx.ReadError("connection reset by peer")

    gw = make(reset)
    with pytest.raises(UpstreamFailed):
        await ask(gw)
    assert sent == 1  # never re-sent (retry_unanswered is off)
    (row,) = await by_status(gw)
    assert (row["status"], row["estimated_requests"]) == (502, 1)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (0, 0)
    assert row["failed_prompt_tokens"] == chat_prompt_tokens(MESSAGES)
    assert row["cost_nanos"] == row["failed_prompt_tokens"] * 2 * 1000


async def test_a_request_that_never_left_the_gateway_is_charged_nothing(make: Make) -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    gw = make(refused)
    with pytest.raises(UpstreamFailed):
        await ask(gw)
    (row,) = await by_status(gw)
    assert (row["estimated_requests"], row["failed_prompt_tokens"], row["cost_nanos"]) == (0, 0, 0)


async def test_over_budget_no_upstream_call_and_the_rate_limit_is_given_back(make: Make) -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(200, json=ANSWER)

    key = {"alias": "k", "key_sha256": "f" * 64, "budgets": [{"period": "day", "max_cost": 0.01}]}
    gw = make(handler, keys=[key])
    await ask(gw, max_tokens=600)  # reserves (7+3+6 prompt x 2 + 600 x 8) ~ 0.0048; costs 0.00575
    with pytest.raises(BudgetExceeded, match=r"0\.00575 USD of 0\.01 USD spent"):
        await ask(gw, max_tokens=600)
    assert calls == 1
    left = gw.admission.use(gw.runtime.keys[0]).remaining
    assert left is not None and left.requests == 599  # the refused one was refunded


async def test_the_access_log_line_carries_the_cost(
    make: Make, caplog: pytest.LogCaptureFixture
) -> None:
    gw = make(lambda r: httpx.Response(200, json=ANSWER))
    with caplog.at_level(logging.INFO, logger="tokengate.access"):
        await ask(gw)
    (line,) = [r for r in caplog.records if r.name == "tokengate.access"]
    fields = line.fields  # type: ignore[attr-defined]
    assert (fields["cost"], fields["currency"], fields["usage_estimated"]) == (
        "0.00575",
        "USD",
        False,
    )


async def test_anthropic_cache_reads_and_writes_are_prompt_tokens_priced_at_their_rates(
    make: Make,
) -> None:
    from app.pipeline.request import MESSAGES as MESSAGES_API

    answer = {
        "id": "msg_1",
        "type": "message",
        "model": "m-1",
        "content": [{"type": "text", "text": "ok"}],
        "usage": {
            "input_tokens": 100,
            "cache_read_input_tokens": 2000,
            "cache_creation_input_tokens": 500,
            "output_tokens": 50,
        },
    }
    prices = {"m-1": {"input": 3, "output": 15, "cached_input": 0.3, "cache_write": 3.75}}
    gw = make(
        lambda r: httpx.Response(200, json=answer),
        billing={"prices": prices},
        scale_up={"models": ["m-1"], "api_style": "anthropic"},
    )
    await gw.start()
    raw = json.dumps({"model": "m", "max_tokens": 64, "messages": MESSAGES}).encode()
    call = parse_call(MESSAGES_API, raw, gw.keys.anonymous, "req_a", {}, time.perf_counter())
    reply = await gw.pipeline.handle(call)
    # 100 x 3 + 2000 x 0.30 + 500 x 3.75 + 50 x 15 = 300 + 600 + 1875 + 750 = 3525 / million
    assert isinstance(reply, JsonAnswer) and reply.headers["x-tokengate-cost"] == "0.003525 USD"
    (row,) = await ledger_rows(gw)
    # each prompt token once: input + cache read + cache creation (the limits settle the same)
    assert (row["prompt_tokens"], row["cached_tokens"], row["cache_write_tokens"]) == (
        2600,
        2000,
        500,
    )
