"""The simulator's Responses API answers every tool type Codex declares."""

from __future__ import annotations

from typing import Any

import pytest

from app.sim import response_shapes
from app.sim.errors import SimError
from tests.unit.upstream.test_responses_chat import TOOLS


def answer(tool_choice: Any = "auto", items: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body = {"model": "m", "tools": TOOLS, "tool_choice": tool_choice}
    items = items or [{"role": "user", "content": "go"}]
    plan = response_shapes.plan(body, "m", [], items, 0, 8)
    (item,) = plan.response["output"]
    return dict(item)


def test_a_namespace_tool_is_called_with_its_namespace() -> None:
    item = answer({"type": "function", "name": "search"})
    assert item["type"] == "function_call" and item["namespace"] == "mcp__docs"
    assert item["name"] == "search"


def test_a_custom_tool_gets_a_custom_tool_call_with_raw_input() -> None:
    item = answer({"type": "custom", "name": "apply_patch"})
    assert item["type"] == "custom_tool_call" and item["name"] == "apply_patch"
    assert isinstance(item["input"], str) and item["input"]


def test_tool_search_gets_a_client_tool_search_call() -> None:
    item = answer({"type": "function", "name": "tool_search"})
    assert item["type"] == "tool_search_call" and item["execution"] == "client"
    assert set(item["arguments"]) == {"query", "limit"}


@pytest.mark.parametrize(
    ("call", "output"),
    [
        (
            {"type": "custom_tool_call", "name": "apply_patch", "input": "x"},
            "custom_tool_call_output",
        ),
        (
            {"type": "tool_search_call", "execution": "client", "arguments": {}},
            "tool_search_output",
        ),
    ],
)
def test_any_tools_output_is_answered_with_text(call: dict[str, Any], output: str) -> None:
    items = [
        {"role": "user", "content": "go"},
        {**call, "call_id": "c"},
        {"type": output, "call_id": "c"},
    ]
    response_shapes.check_outputs([], items)
    assert answer(items=items)["type"] == "message"


def test_an_output_without_its_call_is_refused() -> None:
    with pytest.raises(SimError, match="custom tool call output"):
        response_shapes.check_outputs([], [{"type": "custom_tool_call_output", "call_id": "x"}])


def test_streamed_custom_input_deltas_add_up_to_the_input() -> None:
    item = answer({"type": "custom", "name": "apply_patch"})
    final = {"status": "completed", "output": [item]}
    events = [e for e, _ in response_shapes.events({**final, "id": "r"})]
    deltas = "".join(
        e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"
    )
    assert deltas == item["input"]
