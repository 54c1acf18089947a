"""One Responses WebSocket connection: warm-ups, conversations expanded for a stateless
upstream, refusals as error events (the pipeline in-process, the upstream a MockTransport)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from itertools import count
from typing import Any

import httpx
import pytest

from app.errors import AuthenticationFailed, RateLimited
from app.gateway import Gateway
from app.pipeline.socket_session import SocketSession
from app.runtime import KeySpec
from tests.support.inproc import MakeGateway

SETTINGS = {"model_route": {"default": "m-1"}, "scale_up": {"models": ["m-1"]}}


def sse(rid: str, item: dict[str, Any]) -> bytes:
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": rid, "model": "m-1"}},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {
            "type": "response.completed",
            "response": {
                "id": rid,
                "status": "completed",
                "usage": {"input_tokens": 5, "output_tokens": 1},
            },
        },
    ]
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


class Socket:
    """A session and what it sent back, with the bodies the upstream received."""

    def __init__(
        self, gw: Gateway, key: KeySpec, bodies: list[dict[str, Any]], cached: int
    ) -> None:
        ids = count()
        self.key = key
        self.revoked = False
        self.session = SocketSession(
            gw.responses,
            self._authenticate,
            {},
            gw.metrics,
            cached=cached,
            max_body=4000,
            new_request_id=lambda: f"req_{next(ids)}",
        )
        self.frames: list[dict[str, Any]] = []
        self.bodies = bodies

    def _authenticate(self) -> KeySpec:
        if self.revoked:
            raise AuthenticationFailed("Incorrect API key provided.")
        return self.key

    async def _send(self, text: str) -> None:
        self.frames.append(json.loads(text))

    async def say(self, message: dict[str, Any] | str) -> list[dict[str, Any]]:
        self.frames = []
        text = message if isinstance(message, str) else json.dumps(message)
        self.open = await self.session.handle(text, self._send)
        return self.frames


@pytest.fixture
def connect(make_local_gateway: MakeGateway) -> Callable[..., Any]:
    async def build(cached: int = 4, rpm: int = 100) -> Socket:
        bodies: list[dict[str, Any]] = []
        turns = count(1)

        def handler(request: httpx.Request) -> httpx.Response:
            bodies.append(json.loads(request.content))
            n = next(turns)
            item = {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "arguments": "{}",
            }
            return httpx.Response(
                200, content=sse(f"resp_{n}", item), headers={"content-type": "text/event-stream"}
            )

        gw = make_local_gateway(SETTINGS, handler=handler)
        await gw.start()
        return Socket(gw, KeySpec("k", (), 100_000, rpm), bodies, cached)

    return build


def create(**fields: Any) -> dict[str, Any]:
    return {"type": "response.create", "model": "m-1", **fields}


async def test_a_warm_up_goes_nowhere_and_the_next_request_carries_its_input(
    connect: Callable[..., Any],
) -> None:
    ws = await connect()
    system = {"role": "developer", "content": "be brief"}
    warm = await ws.say(create(input=[system], generate=False, store=False))
    assert [f["type"] for f in warm] == ["response.created", "response.completed"]
    assert ws.bodies == []
    user = {"role": "user", "content": "hi"}
    frames = await ws.say(
        create(input=[user], previous_response_id=warm[-1]["response"]["id"], store=False)
    )
    assert [f["type"] for f in frames] == [
        "response.created",
        "response.output_item.done",
        "response.completed",
    ]
    (body,) = ws.bodies
    assert body == {"model": "m-1", "input": [system, user], "store": False, "stream": True}
    # the next turn: its predecessor's input, its output items, then only the new items
    output = {"type": "function_call_output", "call_id": "call_1", "output": "ok"}
    await ws.say(create(input=[output], previous_response_id="resp_1", store=False))
    assert ws.bodies[1]["input"] == [system, user, frames[1]["item"], output]


async def test_an_id_this_connection_does_not_hold_is_passed_on(
    connect: Callable[..., Any],
) -> None:
    ws = await connect(cached=1)
    await ws.say(create(input="one"))
    await ws.say(create(input="two"))  # resp_1 falls out of a cache of one
    await ws.say(create(input="three", previous_response_id="resp_1"))
    assert ws.bodies[2]["previous_response_id"] == "resp_1"
    assert ws.bodies[2]["input"] == [{"role": "user", "content": "three"}]


async def test_refusals_are_error_events_with_their_http_status(
    connect: Callable[..., Any],
) -> None:
    ws = await connect(rpm=1)
    assert await ws.say(create(type="response.processed")) == []  # an ack needs no answer
    for message, status in (
        ("{not json", 400),
        ({"type": "session.update"}, 400),
        (create(input="x", background=True), 400),
        (create(input=3), 400),
        (create(input="x" * 5000), 413),
    ):
        (frame,) = await ws.say(message)
        assert (frame["type"], frame["status"]) == ("error", status), message
    await ws.say(create(input="x"))
    (limited,) = await ws.say(create(input="y"))
    assert limited["status"] == 429 and limited["error"]["code"] == "rate_limit_exceeded"
    assert int(limited["headers"]["retry-after"]) >= 1  # what Codex waits for
    assert len(ws.bodies) == 1
    ws.revoked = True  # a reload removed the key: the open connection stops serving it
    (revoked,) = await ws.say(create(input="z"))
    assert revoked["status"] == 401 and ws.open is False  # and the connection must end


async def test_warm_ups_are_bounded_charged_and_re_authorised(
    connect: Callable[..., Any],
) -> None:
    ws = await connect(rpm=4)
    previous, statuses = None, []
    for _ in range(5):  # 1,000 bytes each, chained: the conversation passes max_body 4,000
        ask = create(input="w" * 1000, generate=False)
        if previous is not None:
            ask["previous_response_id"] = previous
        frames = await ws.say(ask)
        statuses.append(frames[-1].get("status", 200))
        if frames[-1]["type"] == "response.completed":
            previous = frames[-1]["response"]["id"]
    assert statuses == [200, 200, 200, 413, 413]
    # a refused warm-up keeps nothing, and what is kept is one request body's worth at most
    (kept,) = ws.session.turns.values()  # the chain's latest turn holds the whole chain
    assert len(kept.items) == 3 and ws.session.kept_bytes == kept.size <= 4000
    (ok,) = (await ws.say(create(input="x", generate=False)))[-1:]
    assert ok["type"] == "response.completed"
    (limited,) = await ws.say(create(input="x", generate=False))  # the 5th request
    assert limited["status"] == 429
    ws.revoked = True
    (refused,) = await ws.say(create(type="response.processed"))  # any kind of message
    assert refused["status"] == 401 and ws.open is False
    assert ws.bodies == []


async def test_a_429_of_the_key_is_waited_out_within_the_queue_wait(
    connect: Callable[..., Any],
) -> None:
    ws = await connect()
    real = ws.session.service.create
    refusals = iter([RateLimited("slow down", retry_after=0.05)])

    async def limited_once(call: Any) -> Any:
        refusal = next(refusals, None)
        if refusal is not None:
            raise refusal
        return await real(call)

    ws.session.service.create = limited_once
    ws.session.max_wait = 30.0
    frames = await ws.say(create(input="y"))
    assert frames[-1]["type"] == "response.completed"
    assert not any(f["type"] == "error" for f in frames) and len(ws.bodies) == 1
    # past the queue wait, the 429 is the client's to see
    refusals = iter([RateLimited("slow down", retry_after=60)])
    (frame,) = await ws.say(create(input="z"))
    assert frame["status"] == 429


@pytest.fixture
def stalled(make_local_gateway: MakeGateway) -> Callable[..., Any]:
    """A socket whose upstream starts a response and then sends nothing more (or, with
    `end=True`, ends the stream without a terminal event)."""

    async def build(end: bool) -> Socket:
        async def events() -> Any:
            created = {"type": "response.created", "response": {"id": "resp_1", "model": "m-1"}}
            yield f"event: response.created\ndata: {json.dumps(created)}\n\n".encode()
            if not end:
                await asyncio.Event().wait()

        def handler(request: httpx.Request) -> httpx.Response:
            return httpx.Response(
                200, content=events(), headers={"content-type": "text/event-stream"}
            )

        gw = make_local_gateway(SETTINGS, handler=handler)
        await gw.start()
        return Socket(gw, KeySpec("k", (), 100_000, 100), [], 4)

    return build


async def test_a_stream_that_ends_early_still_ends_the_turn_with_a_terminal_event(
    stalled: Callable[..., Any],
) -> None:
    ws = await stalled(end=True)
    frames = await ws.say(create(input="x"))
    assert frames[0]["type"] == "response.created"
    assert frames[-1]["type"] == "response.failed"


async def test_a_turn_cancelled_mid_stream_ends_with_response_failed(
    stalled: Callable[..., Any],
) -> None:
    ws = await stalled(end=False)
    turn = asyncio.ensure_future(ws.say(create(input="x")))
    while not ws.frames:  # noqa: ASYNC110 (the response has started)
        await asyncio.sleep(0.01)
    turn.cancel()  # what a drain past its grace, or a closing connection, does
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert [f["type"] for f in ws.frames] == ["response.created", "response.failed"]
