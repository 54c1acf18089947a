"""The simulator's tool calls and prompt cache through its ASGI app: chat `tool_calls`
and Messages `tool_use`, streamed and not, a text answer once a tool's result is in,
cached tokens reported the way each API reports them, and count_tokens."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.sim.knobs import SimKnobs
from app.sim.server import create_sim_app
from app.sim.tools import Tool, choose

READ: dict[str, Any] = {
    "name": "Read",
    "input_schema": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["file_path"],
    },
}
BASH = {
    "name": "Bash",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}


def test_choice_follows_the_forced_tool_then_the_prompt_then_the_first() -> None:
    tools = [Tool("Bash", {}), Tool("Read", READ["input_schema"])]
    assert choose(tools, None, "please use Read on /tmp/w/hello.txt, thanks").name == "Read"  # type: ignore[union-attr]
    call = choose(tools, None, "Read /tmp/w/hello.txt.")
    assert call is not None and call.arguments == {"file_path": "/tmp/w/hello.txt"}
    assert choose(tools, "Bash", "Read it").name == "Bash"  # type: ignore[union-attr]
    assert choose(tools, None, "nothing named").name == "Bash"  # type: ignore[union-attr]
    assert choose([], None, "x") is None
    again = choose(tools, None, "Read /tmp/w/hello.txt.")
    assert again == call  # deterministic, id included


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = create_sim_app(SimKnobs(cache_min_tokens=0))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://sim"
    ) as c:
        yield c


KEY = {"authorization": "Bearer k", "x-api-key": "k"}


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data: {")]


async def test_chat_with_tools_answers_a_tool_call_streamed_and_not(
    client: httpx.AsyncClient,
) -> None:
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "call get_weather for Paris"}],
        "tools": [WEATHER],
    }
    r = await client.post("/v1/chat/completions", json=body, headers=KEY)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "sim-city", "unit": "c"}
    s = await client.post("/v1/chat/completions", json={**body, "stream": True}, headers=KEY)
    chunks = events(s.text)
    args = "".join(
        tc["function"].get("arguments", "")
        for c in chunks
        for tc in c["choices"][0]["delta"].get("tool_calls", [])
    )
    assert args == call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_chat_answers_in_text_once_the_tool_result_is_in(client: httpx.AsyncClient) -> None:
    messages = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    body = {"model": "gpt-4o", "messages": messages, "tools": [WEATHER]}
    r = await client.post("/v1/chat/completions", json=body, headers=KEY)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"]
    none = {**body, "messages": messages[:1], "tool_choice": "none"}
    r = await client.post("/v1/chat/completions", json=none, headers=KEY)
    assert r.json()["choices"][0]["finish_reason"] == "stop"


async def test_every_request_offering_tools_gets_a_call_by_default(
    client: httpx.AsyncClient,
) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = {"model": "gpt-4o", "messages": ask, "tools": [WEATHER]}
    r = await client.post("/v1/chat/completions", json=body, headers=KEY)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    msgs = {"model": "claude-sonnet", "max_tokens": 99, "messages": ask, "tools": [BASH, READ]}
    r = await client.post("/v1/messages", json=msgs, headers=KEY)
    assert r.json()["stop_reason"] == "tool_use" and r.json()["content"][0]["name"] == "Bash"
    responses = {
        "model": "gpt-4o",
        "input": "What is the weather?",
        "tools": [
            {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]
        ],
    }
    r = await client.post("/v1/responses", json=responses, headers=KEY)
    assert r.json()["output"][-1]["type"] == "function_call"


@pytest.fixture
async def named_client() -> AsyncIterator[httpx.AsyncClient]:
    app = create_sim_app(SimKnobs(cache_min_tokens=0, tool_calls="named"))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://sim"
    ) as c:
        yield c


async def test_named_mode_calls_only_a_tool_named_or_demanded(
    named_client: httpx.AsyncClient,
) -> None:
    """Agents send every tool on every request: with --tool-calls named an unrelated
    prompt gets text (as Claude Code's "say hi" needs, to stay one request)."""
    client = named_client
    ask = [{"role": "user", "content": "say hi"}]
    body = {"model": "gpt-4o", "messages": ask, "tools": [WEATHER]}
    r = await client.post("/v1/chat/completions", json=body, headers=KEY)
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    responses = {
        "model": "gpt-4o",
        "input": "say hi",
        "tools": [
            {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]
        ],
    }
    r = await client.post("/v1/responses", json=responses, headers=KEY)
    assert r.json()["output"][-1]["type"] == "message"
    named = {**responses, "input": "call get_weather please"}
    r = await client.post("/v1/responses", json=named, headers=KEY)
    assert r.json()["output"][-1]["name"] == "get_weather"
    r = await client.post(
        "/v1/chat/completions", json={**body, "tool_choice": "required"}, headers=KEY
    )
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls"
    msgs = {"model": "claude-sonnet", "max_tokens": 99, "messages": ask, "tools": [BASH, READ]}
    r = await client.post("/v1/messages", json=msgs, headers=KEY)
    assert r.json()["stop_reason"] == "end_turn"
    forced = {**msgs, "tool_choice": {"type": "tool", "name": "Read"}}
    r = await client.post("/v1/messages", json=forced, headers=KEY)
    assert r.json()["content"][0]["name"] == "Read"


async def test_messages_tool_use_round_trip_streamed(client: httpx.AsyncClient) -> None:
    ask = {"role": "user", "content": [{"type": "text", "text": "Read /tmp/w/a.txt"}]}
    body = {"model": "claude-sonnet", "max_tokens": 100, "tools": [BASH, READ], "messages": [ask]}
    r = await client.post("/v1/messages", json=body, headers=KEY)
    message = r.json()
    assert message["stop_reason"] == "tool_use"
    (block,) = message["content"]
    assert block["name"] == "Read" and block["input"] == {"file_path": "/tmp/w/a.txt"}
    s = await client.post("/v1/messages?beta=true", json={**body, "stream": True}, headers=KEY)
    chunks = events(s.text)
    assert chunks[1]["content_block"]["type"] == "tool_use"
    partial = "".join(c["delta"].get("partial_json", "") for c in chunks[2:-3])
    assert json.loads(partial) == block["input"]
    assert chunks[-2]["delta"]["stop_reason"] == "tool_use"
    result = {"type": "tool_result", "tool_use_id": block["id"], "content": "42"}
    follow = [ask, {"role": "assistant", "content": [block]}, {"role": "user", "content": [result]}]
    r = await client.post("/v1/messages", json={**body, "messages": follow}, headers=KEY)
    assert r.json()["stop_reason"] == "end_turn" and r.json()["content"][0]["type"] == "text"


async def test_cached_tokens_are_reported_per_api(client: httpx.AsyncClient) -> None:
    long = "word " * 300
    chat: dict[str, Any] = {
        "model": "gpt-4o",
        "messages": [{"role": "system", "content": long}, {"role": "user", "content": "q1"}],
    }
    first = (await client.post("/v1/chat/completions", json=chat, headers=KEY)).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    chat["messages"] += [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    second = (await client.post("/v1/chat/completions", json=chat, headers=KEY)).json()["usage"]
    assert second["prompt_tokens_details"]["cached_tokens"] == first["prompt_tokens"]

    system = [{"type": "text", "text": long, "cache_control": {"type": "ephemeral"}}]
    msgs = {
        "model": "claude-sonnet",
        "max_tokens": 5,
        "system": system,
        "messages": [{"role": "user", "content": "hi"}],
    }
    one = (await client.post("/v1/messages", json=msgs, headers=KEY)).json()["usage"]
    assert one["cache_read_input_tokens"] == 0 and one["cache_creation_input_tokens"] == 300
    two = (await client.post("/v1/messages", json=msgs, headers=KEY)).json()["usage"]
    assert two["cache_read_input_tokens"] == 300 and two["cache_creation_input_tokens"] == 0
    assert two["input_tokens"] == one["input_tokens"] == 4  # 3 framing + "hi"
    count = await client.post("/v1/messages/count_tokens", json=msgs, headers=KEY)
    assert count.json() == {"input_tokens": 304}
