"""Coding agents' traffic over real sockets, with the official SDKs: tool calls in every
dialect (streamed and not) passed through unchanged, Anthropic's count_tokens and model
list, anthropic-beta reaching the upstream, and prompt-cache tokens counted once."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.procs import Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
ADMIN = "admin-test-key-0123456789"
READ: Any = {  # an Anthropic tool, for the plain and the beta client alike
    "name": "Read",
    "description": "Read a file",
    "input_schema": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}},
        "required": ["file_path"],
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture
def gw(sim: Sim, make_gateway: Make) -> Gateway:
    spec = GatewaySpec(toml={"scale_up": {"api_style": "both"}}, settings={"admin_key": ADMIN})
    return make_gateway(spec, sim.url)


@pytest.fixture
def claude(gw: Gateway) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gw.url, api_key=gw.key, max_retries=0) as client:
        yield client


def test_anthropic_tool_use_round_trip_streamed_and_not(
    gw: Gateway, sim: Sim, claude: anthropic.Anthropic
) -> None:
    client = claude
    ask: list[Any] = [{"role": "user", "content": "Use Read on /tmp/agent/notes.txt"}]
    first = client.messages.create(
        model="claude-sonnet", max_tokens=16_000, tools=[READ], messages=ask
    )
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "Read" and use.input == {"file_path": "/tmp/agent/notes.txt"}
    with client.messages.stream(
        model="claude-sonnet", max_tokens=16_000, tools=[READ], messages=ask
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [b.input for b in streamed.content if b.type == "tool_use"] == [use.input]
    result: Any = {"type": "tool_result", "tool_use_id": use.id, "content": "42"}
    answer = client.messages.create(
        model="claude-sonnet",
        max_tokens=16_000,
        tools=[READ],
        messages=[
            *ask,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ],
    )
    assert answer.stop_reason == "end_turn" and answer.content[0].type == "text"
    sent = sim.records("/v1/messages")
    assert [r["body"]["tools"] for r in sent] == [[READ]] * 3  # passed through unchanged
    assert sent[2]["body"]["messages"][2]["content"] == [result]


@pytest.fixture
def chatgpt(gw: Gateway) -> Iterator[Any]:
    with gw.openai() as client:
        yield client


def test_openai_tool_calls_round_trip_streamed_and_not(gw: Gateway, sim: Sim, chatgpt: Any) -> None:
    client = chatgpt
    ask: list[Any] = [{"role": "user", "content": "call get_weather for Paris"}]
    first = client.chat.completions.create(model="gpt-4o", messages=ask, tools=[WEATHER])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    arguments = ""
    for chunk in client.chat.completions.create(
        model="gpt-4o", messages=ask, tools=[WEATHER], stream=True
    ):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            arguments += delta.function.arguments or ""
    assert arguments == call.function.arguments
    follow = [
        *ask,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    answer = client.chat.completions.create(model="gpt-4o", messages=follow, tools=[WEATHER])
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content
    assert sim.records("/v1/chat/completions")[2]["body"]["messages"][2]["tool_call_id"] == call.id


def test_count_tokens_and_models_through_the_anthropic_sdk(
    gw: Gateway, sim: Sim, claude: anthropic.Anthropic
) -> None:
    client = claude
    raw = client.beta.messages.with_raw_response.count_tokens(
        model="claude-sonnet",
        messages=[{"role": "user", "content": "how many tokens is this"}],
        tools=[READ],
        betas=["token-counting-2024-11-01"],
    )
    (rec,) = sim.records("/v1/messages/count_tokens")
    # the simulator's own count (5 words + 3 framing, 5 of the tool): forwarded, not estimated
    assert raw.parse().input_tokens == 13 and "x-tokengate-estimated" not in raw.headers
    assert "token-counting-2024-11-01" in rec["headers"]["anthropic-beta"]
    assert rec["headers"]["x-api-key"] == sim.api_key and gw.key not in json.dumps(rec)
    assert {m.id for m in client.models.list()} >= {"claude-sonnet", "gpt-4o"}
    r = httpx.get(
        f"{gw.url}/v1/models", headers={"anthropic-version": "2023-06-01", "x-api-key": gw.key}
    )
    assert r.json()["data"][0]["type"] == "model"
    used = httpx.get(f"{gw.url}/admin/usage", headers={"authorization": f"Bearer {ADMIN}"})
    # a count is a request of the key's (issue 31), but consumes and costs no tokens
    (row,) = used.json()["data"]
    assert row["requests"] == 1 and row["prompt_tokens"] == row["completion_tokens"] == 0


def test_anthropic_beta_and_the_beta_query_reach_the_upstream(gw: Gateway, sim: Sim) -> None:
    betas = "claude-code-20250219,interleaved-thinking-2025-05-14"
    r = httpx.post(
        f"{gw.url}/v1/messages?beta=true",
        headers={"x-api-key": gw.key, "anthropic-version": "2023-06-01", "anthropic-beta": betas},
        json={
            "model": "claude-sonnet",
            "max_tokens": 32_000,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert r.status_code == 200 and "message_stop" in r.text
    (rec,) = sim.records("/v1/messages")
    assert rec["headers"]["anthropic-beta"] == betas


def test_prompt_cache_tokens_count_once_in_limits_ledger_and_metrics(
    gw: Gateway, sim: Sim, claude: anthropic.Anthropic
) -> None:
    system = [{"type": "text", "text": "rules " * 1500, "cache_control": {"type": "ephemeral"}}]
    body: Any = {
        "model": "claude-sonnet",
        "max_tokens": 100,
        "system": system,
        "messages": [{"role": "user", "content": "hi"}],
    }
    client = claude
    first = client.messages.create(**body)
    second = client.messages.create(**body)
    assert (
        first.usage.cache_creation_input_tokens == 1500 and first.usage.cache_read_input_tokens == 0
    )
    assert second.usage.cache_read_input_tokens == 1500 and second.usage.input_tokens == 4
    rows = httpx.get(f"{gw.url}/admin/usage", headers={"authorization": f"Bearer {ADMIN}"})
    (row,) = rows.json()["data"]
    assert row["prompt_tokens"] == 2 * 1504  # input + cache read + cache creation, once each
    assert row["cached_tokens"] == 1500  # of which read from the cache
    metrics = gw.metrics()
    assert (
        'tokengate_tokens_total{key="alice",kind="prompt",model="claude-sonnet"} 3008.0' in metrics
    )
    assert 'tokengate_prompt_cache_tokens_total{domain="domain-a",kind="read"} 1500.0' in metrics
    assert 'tokengate_prompt_cache_tokens_total{domain="domain-a",kind="write"} 1500.0' in metrics
