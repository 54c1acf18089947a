"""The simulator's Responses API through its ASGI app: the typed stream, tool calls,
stored responses, and usage spent from the same balance as every other route."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.sim.knobs import SimKnobs
from app.sim.simulator import create_sim_app

KEY = {"authorization": "Bearer sk-any"}
TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}, "tty": {"type": "boolean"}},
            "required": ["cmd"],
        },
    }
]


@pytest.fixture
async def make() -> AsyncIterator[Any]:
    clients: list[httpx.AsyncClient] = []

    async def build(**knobs: Any) -> httpx.AsyncClient:
        app = create_sim_app(SimKnobs(**knobs))
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://sim", headers=KEY
        )
        clients.append(client)
        return client

    yield build
    for client in clients:
        await client.aclose()


def events(body: bytes) -> list[dict[str, Any]]:
    out = []
    for block in body.decode().strip().split("\n\n"):
        kind, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        out.append(event)
    return out


async def test_the_stream_is_the_json_answer_told_event_by_event(make: Any) -> None:
    sim = await make()
    body = {"model": "gpt-4o", "input": "hello there"}
    whole = (await sim.post("/v1/responses", json=body)).json()
    streamed = events((await sim.post("/v1/responses", json={**body, "stream": True})).content)
    assert [e["sequence_number"] for e in streamed] == list(range(len(streamed)))
    kinds = [e["type"] for e in streamed]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    text = "".join(e["delta"] for e in streamed if e["type"] == "response.output_text.delta")
    assert text == whole["output"][0]["content"][0]["text"]
    final = streamed[-1]["response"]
    assert final["usage"] == whole["usage"] and final["usage"]["output_tokens"] == 16
    assert whole["usage"]["input_tokens"] == 3 + 2  # an item's framing and its two words


async def test_tools_get_a_deterministic_call_and_its_output_an_answer(make: Any) -> None:
    sim = await make()
    ask = {"model": "gpt-4o", "input": "list files", "tools": TOOLS}
    one, two = [(await sim.post("/v1/responses", json=ask)).json() for _ in range(2)]
    (call,) = one["output"]
    assert call["type"] == "function_call" and call["name"] == "exec_command"
    assert json.loads(call["arguments"])["cmd"].startswith("echo ")
    assert two["output"][0]["arguments"] == call["arguments"]  # the same prompt, the same call
    assert "tty" not in json.loads(call["arguments"])  # only the required arguments
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt"}
    answer = await sim.post(
        "/v1/responses", json={**ask, "previous_response_id": one["id"], "input": [output]}
    )
    assert answer.json()["output"][0]["type"] == "message"
    stray = await sim.post("/v1/responses", json={**ask, "input": [output]})
    assert stray.status_code == 400 and "No tool call found" in stray.json()["error"]["message"]
    none = await sim.post("/v1/responses", json={**ask, "tool_choice": "none"})
    assert none.json()["output"][0]["type"] == "message"


async def test_chaining_needs_a_stored_response_of_this_instance(make: Any) -> None:
    sim, other = await make(), await make()
    first = (await sim.post("/v1/responses", json={"model": "gpt-4o", "input": "a b c"})).json()
    follow = {"model": "gpt-4o", "input": "d", "previous_response_id": first["id"]}
    chained = (await sim.post("/v1/responses", json=follow)).json()
    context = first["usage"]["input_tokens"] + 3 + 16  # its input and its answer
    assert chained["usage"]["input_tokens_details"]["cached_tokens"] == context
    elsewhere = await other.post("/v1/responses", json=follow)
    assert elsewhere.status_code == 400
    assert elsewhere.json()["error"]["code"] == "previous_response_not_found"
    unstored = (
        await sim.post("/v1/responses", json={"model": "gpt-4o", "input": "x", "store": False})
    ).json()
    assert (await sim.get(f"/v1/responses/{unstored['id']}")).status_code == 404


async def test_a_repeated_prefix_under_one_prompt_cache_key_is_cached(make: Any) -> None:
    sim = await make()
    history = [{"role": "user", "content": "one two three four"}]
    body = {"model": "gpt-4o", "input": history, "prompt_cache_key": "thread-1", "store": False}
    first = (await sim.post("/v1/responses", json=body)).json()
    assert first["usage"]["input_tokens_details"]["cached_tokens"] == 0
    more = [*history, first["output"][0], {"role": "user", "content": "five"}]
    second = (await sim.post("/v1/responses", json={**body, "input": more})).json()
    assert second["usage"]["input_tokens_details"]["cached_tokens"] == 7 + 19
    other_key = (await sim.post("/v1/responses", json={**body, "prompt_cache_key": "t2"})).json()
    assert other_key["usage"]["input_tokens_details"]["cached_tokens"] == 0


async def test_usage_is_spent_from_the_balance(make: Any) -> None:
    sim = await make(balance=1000)
    answer = (await sim.post("/v1/responses", json={"model": "gpt-4o", "input": "hi"})).json()
    stats = (await sim.get("/_sim/stats")).json()
    assert stats["balance"] == 1000 - answer["usage"]["total_tokens"]


async def test_background_responses_are_queued_polled_and_cancelled(make: Any) -> None:
    slow = await make(background_ms=60_000)
    body = {"model": "gpt-4o", "input": "later", "background": True}
    queued = (await slow.post("/v1/responses", json=body)).json()
    assert queued["status"] == "queued" and queued["usage"] is None
    cancelled = (await slow.post(f"/v1/responses/{queued['id']}/cancel")).json()
    assert cancelled["status"] == "cancelled"
    assert (await slow.get(f"/v1/responses/{queued['id']}")).json()["status"] == "cancelled"
    fast = await make(background_ms=0)
    done = (await fast.post("/v1/responses", json=body)).json()
    polled = (await fast.get(f"/v1/responses/{done['id']}")).json()
    assert polled["status"] == "completed" and polled["usage"]["output_tokens"] == 16
    unstored = await fast.post("/v1/responses", json={**body, "store": False})
    assert unstored.status_code == 400


async def test_input_items_delete_and_input_tokens(make: Any) -> None:
    sim = await make()
    items = [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    made = (await sim.post("/v1/responses", json={"model": "gpt-4o", "input": items})).json()
    listed = (await sim.get(f"/v1/responses/{made['id']}/input_items")).json()
    assert [i["content"] for i in listed["data"]] == ["two", "one"]  # newest first
    assert listed["first_id"].startswith("msg_") and listed["has_more"] is False
    counted = await sim.post("/v1/responses/input_tokens", json={"model": "gpt-4o", "input": items})
    assert counted.json() == {"object": "response.input_tokens", "input_tokens": 8}
    gone = (await sim.delete(f"/v1/responses/{made['id']}")).json()
    assert gone == {"id": made["id"], "object": "response", "deleted": True}
    assert (await sim.get(f"/v1/responses/{made['id']}")).status_code == 404


def test_the_websocket_mode_keeps_unstored_responses_per_connection() -> None:
    from starlette.testclient import TestClient

    app = create_sim_app(SimKnobs(responses_websocket=True))
    create = {"type": "response.create", "model": "gpt-4o", "store": False}

    def turn(ws: Any, **fields: Any) -> list[dict[str, Any]]:
        ws.send_text(json.dumps({**create, **fields}))
        frames = [ws.receive_json()]
        while frames[-1]["type"] not in ("response.completed", "error"):
            frames.append(ws.receive_json())
        return frames

    with TestClient(app) as client:
        with client.websocket_connect("/v1/responses", headers=KEY) as ws:
            first = turn(ws, input="hello")[-1]["response"]
            follow = turn(ws, input="more", previous_response_id=first["id"])
            assert follow[-1]["type"] == "response.completed"
            assert [f["sequence_number"] for f in follow] == list(range(len(follow)))
        with client.websocket_connect("/v1/responses", headers=KEY) as other:
            (error,) = turn(other, input="x", previous_response_id=first["id"])
            assert error["status"] == 400
            assert error["error"]["code"] == "previous_response_not_found"
