"""The Responses API on a chat-only upstream (`responses = "chat"`), over real sockets
with the OpenAI SDK: Codex's tool types (function, namespace, custom with a grammar,
tool_search) reach the upstream as chat functions and come back as the client declared
them, streamed and not, and a conversation holding each kind of call and its output
reaches the upstream in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.procs import Gateway, GatewaySpec, Sim
from tests.unit.upstream.test_responses_chat import PATCH, TOOLS

Make = Callable[..., Gateway]


@pytest.fixture
def gw(sim: Sim, make_gateway: Make) -> Gateway:
    return make_gateway(GatewaySpec(toml={"scale_up": {"responses": "chat"}}), sim.url)


def create(gw: Gateway, stream: bool, **body: Any) -> dict[str, Any]:
    with gw.openai() as client:
        if not stream:
            return dict(client.responses.create(model="gpt-4o", **body).model_dump())
        with client.responses.stream(model="gpt-4o", **body) as events:
            return dict(events.get_final_response().model_dump())


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("choice", "kind", "fields"),
    [
        ({"type": "custom", "name": "apply_patch"}, "custom_tool_call", {"name": "apply_patch"}),
        (
            {"type": "function", "name": "search"},
            "function_call",
            {"name": "search", "namespace": "mcp__docs"},
        ),
        ({"type": "function", "name": "tool_search"}, "tool_search_call", {"execution": "client"}),
        ({"type": "function", "name": "exec_command"}, "function_call", {"name": "exec_command"}),
    ],
    ids=["custom", "namespace", "tool_search", "function"],
)
def test_each_tool_type_comes_back_as_declared(
    gw: Gateway, sim: Sim, stream: bool, choice: dict[str, Any], kind: str, fields: dict[str, Any]
) -> None:
    tool_choice = choice if choice["name"] != "search" else {"type": "function", "name": "search"}
    answer = create(gw, stream, input="go", tools=TOOLS[:4], tool_choice=tool_choice)
    (item,) = answer["output"]
    assert item["type"] == kind
    assert {k: item.get(k) for k in fields} == fields
    (rec,) = sim.records("/v1/chat/completions")
    sent = [t["function"]["name"] for t in rec["body"]["tools"]]
    assert sent == ["exec_command", "mcp__docs__search", "apply_patch", "tool_search"]
    assert rec["body"].get("stream", False) is stream
    assert answer["usage"]["input_tokens"] > 0 and answer["usage"]["output_tokens"] > 0


def test_a_conversation_with_every_call_kind_reaches_the_upstream_in_order(
    gw: Gateway, sim: Sim
) -> None:
    history: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "custom_tool_call", "call_id": "c3", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "c3", "output": "Done"},
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "search",
            "namespace": "mcp__docs",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "c2", "output": "doc"},
    ]
    answer = create(gw, True, input=history, tools=TOOLS[:4])
    assert answer["output"][0]["type"] == "message"  # the tools ran: the sim answers in text
    (rec,) = sim.records("/v1/chat/completions")
    shape = [
        (m["role"], m.get("tool_call_id") or [c["id"] for c in m.get("tool_calls") or []])
        for m in rec["body"]["messages"]
    ]
    assert shape == [
        ("user", []),
        ("assistant", ["c3"]),
        ("tool", "c3"),
        ("assistant", ["c2"]),
        ("tool", "c2"),
    ]
    assert '"input":' in rec["body"]["messages"][1]["tool_calls"][0]["function"]["arguments"]
