"""The Responses API end to end: the official openai SDK -> tokengate serve -> tokengate sim
(HTTP JSON and SSE, stored responses, the WebSocket mode, previous_response_id across
replicas sharing Redis)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import InvalidStatus

from tests.e2e.test_limits import counter
from tests.support.procs import Gateway, GatewaySpec, Redis, Sim

Make = Callable[..., Gateway]
ADMIN = "admin-responses-key-0123456789"
TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    }
]


def ledger(gw: Gateway) -> list[dict[str, Any]]:
    r = httpx.get(f"{gw.url}/admin/usage", headers={"authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    return list(r.json()["data"])


def domain(name: str, sim: Sim, **extra: object) -> dict[str, object]:
    return {"domain": name, "api_base": sim.url, "api_key_env": "TAOTOKEN_API_KEY", **extra}


def test_json_and_stream_are_billed_from_the_response_usage(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(settings={"admin_key": ADMIN}), sim.url)
    with gw.openai() as client:
        _json_and_stream(gw, client, sim)


def _json_and_stream(gw: Gateway, client: openai.OpenAI, sim: Sim) -> None:
    raw = client.responses.with_raw_response.create(
        model="gpt-4o", input="ping", max_output_tokens=5
    )
    answer = raw.parse()
    assert raw.headers["x-tokengate-domain"] == "domain-a"
    assert answer.status == "incomplete" and answer.usage is not None
    assert answer.usage.output_tokens == 5 and len(answer.output_text.split()) == 5
    events = list(client.responses.create(model="gpt-4o", input="stream me", stream=True))
    # passed through event for event: the upstream's numbering arrives whole and in order
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == final.output_text and final.usage is not None
    streamed = final.usage
    (row,) = ledger(gw)
    assert row["requests"] == 2
    assert row["prompt_tokens"] == answer.usage.input_tokens + streamed.input_tokens
    assert row["completion_tokens"] == 5 + streamed.output_tokens
    metrics = gw.metrics()
    assert counter(metrics, "tokengate_tokens_total", key="alice", kind="completion") == (
        5 + streamed.output_tokens
    )
    (rec, _) = sim.records("/v1/responses")
    assert rec["body"] == {"model": "gpt-4o", "input": "ping", "max_output_tokens": 5}


def test_function_calls_pass_through_streamed_and_not(gateway: Gateway, sim: Sim) -> None:
    with gateway.openai() as client:
        ask: dict[str, Any] = {"model": "gpt-4o", "input": "look it up", "tools": TOOLS}
        (call,) = client.responses.create(**ask, store=False).output
        assert call.type == "function_call" and json.loads(call.arguments)["query"]
        events = list(client.responses.create(**ask, store=False, stream=True))
        pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        (done,) = [e.item for e in events if e.type == "response.output_item.done"]
        assert "".join(pieces) == done.arguments == call.arguments  # the same call, in pieces
        history = [
            {"role": "user", "content": "look it up"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "found"},
        ]
        answer = client.responses.create(model="gpt-4o", input=history, tools=TOOLS, store=False)
        assert answer.output[0].type == "message"
    sent = [r["body"] for r in sim.records("/v1/responses")]
    assert all(body["tools"] == TOOLS for body in sent)
    assert sent[2]["input"] == history  # items reach the upstream as the client sent them


def test_stored_responses_are_followed_and_private_to_their_key(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--background-ms", "60000")
    gw = make_gateway(GatewaySpec(keys={"alice": {}, "bob": {}}), sim.url)
    with gw.openai("alice") as alice, gw.openai("bob") as bob:
        _follow_ups(alice, bob)


def _follow_ups(alice: openai.OpenAI, bob: openai.OpenAI) -> None:
    first = alice.responses.create(model="gpt-4o", input="remember this")
    second = alice.responses.create(model="gpt-4o", input="and this", previous_response_id=first.id)
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0
    assert alice.responses.retrieve(first.id).output_text == first.output_text
    replay = list(alice.responses.retrieve(first.id, stream=True, starting_after=1))
    assert replay[0].sequence_number == 2 and replay[-1].type == "response.completed"
    items = alice.responses.input_items.list(second.id)
    assert [i.content for i in items.data] == ["and this"]  # type: ignore[union-attr]
    counted = alice.responses.input_tokens.count(model="gpt-4o", input="one two three")
    assert counted.input_tokens == 6  # the sim's count: 3 per item + 3 words
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as refused:
        bob.responses.create(model="gpt-4o", input="x", previous_response_id=first.id)
    assert refused.value.code == "previous_response_not_found"
    background = alice.responses.create(model="gpt-4o", input="later", background=True)
    assert background.status == "queued"
    assert alice.responses.retrieve(background.id).status in ("queued", "in_progress")
    assert alice.responses.cancel(background.id).status == "cancelled"
    alice.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(first.id)
    unstored = alice.responses.create(model="gpt-4o", input="forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(unstored.id)


# openai 3.60 opens its socket with websockets' deprecated non-context-manager form.
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager")
def test_websocket_mode_bridges_each_request_with_its_conversation(
    sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(GatewaySpec(keys={"alice": {}, "slow": {"requests_per_minute": 1}}), sim.url)
    with gw.openai() as client, client.responses.connect() as conn:
        conn.send({"type": "response.create", "model": "gpt-4o", "input": "hi", "generate": False})
        warm = _until_done(conn)
        assert warm.type == "response.completed"
        assert sim.records("/v1/responses") == []  # a warm-up generates nothing upstream
        conn.send(
            {
                "type": "response.create",
                "model": "gpt-4o",
                "input": "call a tool",
                "tools": TOOLS,
                "store": False,
                "previous_response_id": warm.response.id,
            }
        )
        called = _until_done(conn)
        (call,) = called.response.output
        assert call.type == "function_call" and call.name == "lookup"
        conn.send(
            {
                "type": "response.create",
                "model": "gpt-4o",
                "tools": TOOLS,
                "store": False,
                "previous_response_id": called.response.id,
                "input": [
                    {"type": "function_call_output", "call_id": call.call_id, "output": "42"}
                ],
            }
        )
        answered = _until_done(conn)
        assert answered.type == "response.completed" and answered.response.output_text
    sent = [r["body"] for r in sim.records("/v1/responses")]
    assert [r.get("previous_response_id") for r in sent] == [None, None]  # stateless upstream
    kinds = [i.get("type", "message") for i in sent[1]["input"]]
    assert kinds == ["message", "message", "function_call", "function_call_output"]
    metrics = gw.metrics()
    assert counter(metrics, "tokengate_responses_websocket_messages_total", kind="create") == 2
    assert counter(metrics, "tokengate_requests_total", status="200") >= 2
    with gw.openai("slow") as client, client.responses.connect() as conn:  # same limits
        for _ in range(2):
            conn.send({"type": "response.create", "model": "gpt-4o", "input": "x"})
            last = _until_done(conn)
    assert last.type == "error" and last.status == 429


@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager")
def test_an_upstream_with_its_own_websocket_mode_gets_only_the_new_items(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim("--responses-websocket")
    up = domain("up", sim, responses_websocket=True)
    gw = make_gateway(GatewaySpec(toml={"scale_up": [up]}))
    with gw.openai() as client, client.responses.connect() as conn:
        ask = {"type": "response.create", "model": "gpt-4o", "tools": TOOLS, "store": False}
        conn.send({**ask, "input": "look it up"})
        called = _until_done(conn)
        (call,) = called.response.output
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "42"}
        conn.send({**ask, "previous_response_id": called.response.id, "input": [output]})
        answered = _until_done(conn)
        assert answered.type == "response.completed" and answered.response.output_text
    first, second = (r for r in sim.records("/v1/responses"))
    assert first["method"] == second["method"] == "WEBSOCKET"
    assert "previous_response_id" not in first["body"]
    # the upstream's socket holds the conversation: only the tool's output goes again
    assert second["body"]["previous_response_id"] == called.response.id
    assert second["body"]["input"] == [output]
    (row,) = [r for r in gw.access() if r["status"] == 200][-1:]
    assert row["endpoint"] == "responses_ws" and row["prompt_tokens"] > 0


def _until_done(conn: Any) -> Any:
    for event in conn:
        if event.type in ("response.completed", "response.incomplete", "response.failed", "error"):
            return event
    raise AssertionError("the socket closed before the response ended")


def test_websocket_upgrade_is_refused_with_426_or_401_at_once(sim: Sim, make_gateway: Make) -> None:
    def url(gw: Gateway) -> str:
        return gw.url.replace("http", "ws") + "/v1/responses"

    off = make_gateway(GatewaySpec(settings={"responses": {"websocket": False}}), sim.url)
    with pytest.raises(InvalidStatus) as refused:  # an answer to the upgrade, not a hang
        ws_client.connect(url(off), additional_headers=off.headers(), open_timeout=30)
    assert refused.value.response.status_code == 426
    assert b"websocket_not_served" in refused.value.response.body
    on = make_gateway(GatewaySpec(), sim.url)
    with pytest.raises(InvalidStatus) as bad_key:
        ws_client.connect(url(on), additional_headers={"authorization": "Bearer tg-wrong"})
    assert bad_key.value.response.status_code == 401


def test_previous_response_id_goes_to_its_domain_from_any_replica(
    make_sim: Callable[..., Sim], make_gateway: Make, redis: Redis, tmp_path: Path
) -> None:
    a, b = make_sim(), make_sim()
    env = {"TOKENGATE_REDIS_URL": redis.url}
    db = {"database": {"path": str(tmp_path / "shared.sqlite3")}}  # replicas share it
    # Replica one prefers dom-b (weight), replica two dom-a: only the shared record of
    # each response's home can send replica two's follow-up to dom-b.
    scale_up = [domain("dom-a", a), domain("dom-b", b, weight=10)]
    one = make_gateway(GatewaySpec(toml={"scale_up": scale_up}, env=env, settings=db))
    two_spec = GatewaySpec(
        toml={"scale_up": [domain("dom-a", a), domain("dom-b", b)]}, env=env, settings=db
    )
    two_spec.secrets = one.keys
    two = make_gateway(two_spec)
    with one.openai() as client:
        first = client.responses.with_raw_response.create(model="gpt-4o", input="start")
    assert first.headers["x-tokengate-domain"] == "dom-b"
    first_id = first.parse().id
    with two.openai() as client:
        follow = client.responses.with_raw_response.create(
            model="gpt-4o", input="go on", previous_response_id=first_id
        )
        assert follow.headers["x-tokengate-domain"] == "dom-b"
        streamed = list(
            client.responses.create(
                model="gpt-4o", input="more", previous_response_id=follow.parse().id, stream=True
            )
        )
        assert streamed[-1].type == "response.completed"
        assert client.responses.retrieve(first_id).id == first_id
    assert a.records() == [] or all(r["path"] == "/v1/models" for r in a.records())
    assert len(b.records("/v1/responses")) == 3
