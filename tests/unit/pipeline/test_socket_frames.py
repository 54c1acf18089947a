"""The WebSocket bridge in frame mode: a turn served over the upstream's own socket is
relayed frame for frame to the client's socket, never written as SSE and read back; its
usage, first token and end are read from the frames themselves (the pipeline in-process,
the upstream socket scripted)."""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import count
from typing import Any

import pytest

from app.gateway import Gateway
from app.pipeline.socket_session import SocketSession
from app.runtime import KeySpec
from app.upstream.websocket import UpstreamSockets
from tests.support.inproc import MakeGateway
from tests.unit.upstream.test_websocket import FakeDialer, FakeSocket

SETTINGS = {
    "model_route": {"default": "m-1"},
    "scale_up": {"models": ["m-1"], "responses_websocket": True},
}
CREATED = {"type": "response.created", "response": {"id": "resp_1", "model": "m-1"}}
ITEM = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]}
DONE = {"type": "response.output_item.done", "output_index": 0, "item": ITEM}
COMPLETED = {
    "type": "response.completed",
    "response": {
        "id": "resp_1",
        "model": "m-1",
        "status": "completed",
        "usage": {"input_tokens": 7, "output_tokens": 3},
    },
}
# A frame SSE cannot carry byte for byte: JSON over CRLF and CR line ends, a trailing LF,
# and text that looks like SSE framing (escaped, as JSON strings must be). Written as
# `data:` lines and read back, its line ends would come back as LFs and its last LF lost.
ODD = (
    '{\r\n  "type": "response.output_text.delta",\r  "output_index": 0,\r\n'
    '  "delta": "a\\n\\ndata: [DONE]\\r\\n\\n"\r\n}\n'
)


class Client:
    """A client connection's session, and the texts it was sent."""

    def __init__(self, gw: Gateway, socket: FakeSocket) -> None:
        ids = count()
        self.gw = gw
        self.texts: list[str] = []
        self.session = SocketSession(
            gw.responses,
            lambda: KeySpec("k", (), 100_000, 100),
            {},
            gw.metrics,
            cached=4,
            max_body=100_000,
            new_request_id=lambda: f"req_{next(ids)}",
            sockets=UpstreamSockets(FakeDialer(socket)),  # type: ignore[arg-type]
        )

    async def send(self, text: str) -> None:
        self.texts.append(text)

    async def create(self, **fields: Any) -> list[str]:
        self.texts = []
        message = {"type": "response.create", "model": "m-1", "input": "hi", **fields}
        assert await self.session.handle(json.dumps(message), self.send)
        return self.texts

    def sample(self, name: str, **labels: str) -> float | None:
        return self.gw.metrics.registry.get_sample_value(name, labels)


@pytest.fixture
def connect(make_local_gateway: MakeGateway) -> Callable[..., Any]:
    async def build(*script: list[str]) -> tuple[Client, FakeSocket]:
        gw = make_local_gateway(SETTINGS, handler=lambda request: pytest.fail("HTTP was used"))
        await gw.start()
        socket = FakeSocket(list(script))
        return Client(gw, socket), socket

    return build


async def test_frames_reach_the_client_byte_for_byte_with_usage_read_from_them(
    connect: Callable[..., Any],
) -> None:
    frames = [json.dumps(CREATED), ODD, json.dumps(DONE), json.dumps(COMPLETED)]
    client, socket = await connect(list(frames))
    assert await client.create() == frames  # each frame as it came, the odd one included
    assert socket.sent[0]["input"] == [{"role": "user", "content": "hi"}]
    # usage from the terminal frame, the first token timed at the delta frame
    tokens = "tokengate_tokens_total"
    assert client.sample(tokens, key="k", model="m-1", kind="prompt") == 7
    assert client.sample(tokens, key="k", model="m-1", kind="completion") == 3
    ttft = "tokengate_time_to_first_token_seconds_count"
    assert client.sample(ttft, domain="default", model="m-1") == 1
    # the turn was kept from the frames: the next request continues it on the socket
    follow = {"role": "user", "content": "more"}
    again = [json.dumps(CREATED | {"response": {"id": "resp_2"}}), json.dumps(COMPLETED)]
    socket.script.append(again)
    await client.create(input=[follow], previous_response_id="resp_1")
    assert socket.sent[1]["previous_response_id"] == "resp_1"
    assert socket.sent[1]["input"] == [follow]


async def test_a_socket_cut_mid_answer_ends_the_turn_with_response_failed(
    connect: Callable[..., Any],
) -> None:
    delta = {"type": "response.output_text.delta", "output_index": 0, "delta": "abc " * 8}
    client, socket = await connect([json.dumps(CREATED), json.dumps(delta)])
    texts = await client.create()
    assert texts[:2] == [json.dumps(CREATED), json.dumps(delta)]
    (failed,) = [json.loads(t) for t in texts[2:]]  # one terminal event, the gateway's own
    assert failed["type"] == "response.failed" and failed["sequence_number"] == 2
    response = failed["response"]
    assert (response["id"], response["error"]["code"]) == ("resp_1", "stream_interrupted")
    # what was streamed is charged: an estimate of the text, as failed tokens
    charged = client.sample(
        "tokengate_failed_tokens_total", key="k", model="m-1", kind="completion"
    )
    assert charged is not None and charged > 0
    assert socket.closed
