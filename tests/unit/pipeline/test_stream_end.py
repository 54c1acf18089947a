"""How a relayed stream ends on the wire: bytes that arrive with the end of the upstream
body go out with the end of the answer (one ASGI message, one write), and bytes that
arrive earlier are never held back waiting for more."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import pytest

from app.api.responses import SseResponse
from app.gateway import Gateway
from app.pipeline.answer import StreamAnswer
from app.pipeline.request import CHAT
from app.pipeline.wire import parse_call
from tests.support.inproc import MakeGateway, ledger_rows
from tests.support.loopback import CHUNKED_HEAD, Peer, Upstream, chunked, within

EVENTS = [
    b'data: {"model":"m-1","choices":[{"index":0,"delta":{"content":"hel"}}],"usage":null}\n\n',
    b'data: {"model":"m-1","choices":[{"index":0,"delta":{"content":"lo"}}],"usage":null}\n\n',
    b'data: {"model":"m-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n',
    b"data: [DONE]\n\n",
]
Messages = list[dict[str, Any]]


@pytest.fixture
def relay(make_local_gateway: MakeGateway) -> Callable[[Upstream], Any]:
    async def run(up: Upstream) -> tuple[Messages, Gateway]:
        gw = make_local_gateway(
            {
                "model_route": {"default": "m-1"},
                "token_scheduler": {"api_base": f"http://127.0.0.1:{up.port}"},
                "scale_up": {"models": ["m-1"]},
            },
            upstream_key="sk-up",
        )
        await gw.start()
        raw = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True})
        call = parse_call(CHAT, raw.encode(), gw.keys.anonymous, "req_t", {}, time.perf_counter())
        answer = await gw.pipeline.handle(call)
        assert isinstance(answer, StreamAnswer)
        sent: Messages = []

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(dict(message))

        async def receive() -> dict[str, Any]:
            await asyncio.sleep(3600)
            raise AssertionError

        await within(SseResponse(answer)({"type": "http"}, receive, send))
        return [m for m in sent if m["type"] == "http.response.body"], gw

    return run


def relayed(bodies: Messages) -> bytes:
    return b"".join(m["body"] for m in bodies)


async def test_a_stream_that_arrives_whole_is_answered_in_one_message(
    relay: Callable[[Upstream], Any],
) -> None:
    async def whole(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD + chunked(*EVENTS) + b"0\r\n\r\n")  # all in one segment

    async with Upstream(whole) as up:
        bodies, gw = await relay(up)
    assert [m["more_body"] for m in bodies] == [False]
    assert relayed(bodies) == EVENTS[0] + EVENTS[1] + EVENTS[3]  # usage chunk hidden
    (row,) = await ledger_rows(gw)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (3, 2)


async def test_events_that_arrive_apart_are_relayed_at_once_and_the_end_follows(
    relay: Callable[[Upstream], Any],
) -> None:
    async def paced(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD)
        for event in EVENTS:
            await peer.send(b"%x\r\n%s\r\n" % (len(event), event))
            await asyncio.sleep(0.05)
        await peer.send(b"0\r\n\r\n")

    async with Upstream(paced) as up:
        bodies, _ = await relay(up)
    assert relayed(bodies) == EVENTS[0] + EVENTS[1] + EVENTS[3]
    assert [m["more_body"] for m in bodies][-1] is False
    assert all(m["more_body"] for m in bodies[:-1])
    assert bodies[0]["body"] == EVENTS[0]  # the first event was not held for the next
