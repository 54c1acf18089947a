"""What goes over an upstream's own WebSocket: only the items its cache does not hold."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from app.runtime import DomainSpec
from app.upstream.attempt import AttemptFailed, Reason
from app.upstream.turns import Turn
from app.upstream.websocket import SocketDialer, UpstreamSockets, incremental

SYSTEM = {"role": "developer", "content": "be brief"}
USER = {"role": "user", "content": "hi"}
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}


def body(*items: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": list(items), "stream": True, "store": False, **extra}


def test_a_continued_conversation_sends_only_its_new_items() -> None:
    last = Turn("resp_1", [SYSTEM, USER], [CALL])
    message = incremental(last, body(SYSTEM, USER, CALL, OUTPUT))
    assert message == {
        "type": "response.create",
        "model": "m",
        "store": False,
        "input": [OUTPUT],
        "previous_response_id": "resp_1",
    }  # and no `stream`: the socket implies it


def test_anything_else_is_sent_whole() -> None:
    last = Turn("resp_1", [SYSTEM, USER], [CALL])
    edited = {**USER, "content": "hello"}
    for fresh in (
        incremental(None, body(SYSTEM, USER)),  # a new socket holds nothing
        incremental(last, body(SYSTEM, edited, CALL, OUTPUT)),  # history rewritten
        incremental(last, body(SYSTEM, USER, CALL)),  # nothing new to add
        incremental(last, body(OUTPUT, previous_response_id="resp_0")),  # the client's own id
    ):
        assert fresh.get("previous_response_id") in (None, "resp_0")
        assert len(fresh["input"]) >= 1 and "stream" not in fresh


class FakeSocket:
    """An upstream socket that answers each `response.create` with scripted frames (an
    event, or a text sent as it is), then, past them, a close."""

    def __init__(self, script: list[list[Any]]) -> None:
        self.script = script
        self.sent: list[dict[str, Any]] = []
        self.frames: list[str] = []
        self.closed = False

    async def send_str(self, data: str) -> None:
        self.sent.append(json.loads(data))
        self.frames = [f if isinstance(f, str) else json.dumps(f) for f in self.script.pop(0)]

    async def receive(self, timeout: float) -> Any:
        if not self.frames:
            return SimpleNamespace(type=aiohttp.WSMsgType.CLOSE, data=None)
        return SimpleNamespace(type=aiohttp.WSMsgType.TEXT, data=self.frames.pop(0))

    async def close(self) -> None:
        self.closed = True


class FakeDialer:
    def __init__(self, *sockets: FakeSocket) -> None:
        self.sockets = list(sockets)
        self.read_timeout = 1.0

    async def open(self, spec: DomainSpec) -> FakeSocket | None:
        return self.sockets.pop(0) if self.sockets else None


SPEC = DomainSpec("up", "http://up", SecretStr("sk"), "K", None, 4, responses_websocket=True)


def turn(rid: str, item: dict[str, Any]) -> list[dict[str, Any]]:
    done = {"type": "response.completed", "response": {"id": rid, "status": "completed"}}
    return [{"type": "response.output_item.done", "item": item}, done]


async def drain(answer: Any) -> list[bytes]:
    return [chunk async for chunk in answer.chunks()]


async def test_a_socket_carries_a_conversation_and_resends_it_whole_when_forgotten() -> None:
    forgotten = {"type": "error", "status": 400, "error": {"code": "previous_response_not_found"}}
    one = FakeSocket([turn("r1", CALL), [forgotten]])
    two = FakeSocket([turn("r2", {"type": "message"})])
    sockets = UpstreamSockets(FakeDialer(one, two))  # type: ignore[arg-type]
    first = await sockets.send(SPEC, json.dumps(body(SYSTEM, USER)).encode())
    assert first is not None and first.status == 200
    out = await drain(first)
    assert [json.loads(f) for f in out] == turn("r1", CALL) and first.complete
    second = await sockets.send(SPEC, json.dumps(body(SYSTEM, USER, CALL, OUTPUT)).encode())
    assert second is not None and second.status == 200
    assert one.sent[1]["previous_response_id"] == "r1" and one.sent[1]["input"] == [OUTPUT]
    assert one.closed and two.sent[0]["input"] == [SYSTEM, USER, CALL, OUTPUT]  # whole, fresh


async def test_a_pretty_printed_frame_is_one_chunk_as_it_came() -> None:
    """A frame is JSON, maybe over several lines: it is one chunk of the answer, its
    bytes untouched (no SSE on the way), and the turn is still read from it."""
    socket = PrettySocket([turn("r1", CALL)])
    sockets = UpstreamSockets(FakeDialer(socket))  # type: ignore[arg-type]
    answer = await sockets.send(SPEC, json.dumps(body(SYSTEM, USER)).encode())
    assert answer is not None
    out = await drain(answer)
    assert out == [json.dumps(f, indent=2).encode() for f in turn("r1", CALL)]
    last = sockets._links["up"].last
    assert answer.complete and last is not None
    assert (last.response_id, last.items, last.output) == ("r1", [SYSTEM, USER], [CALL])


class PrettySocket(FakeSocket):
    async def send_str(self, data: str) -> None:
        await super().send_str(data)
        self.frames = [json.dumps(json.loads(f), indent=2) for f in self.frames]


async def test_errors_are_statuses_and_a_cut_stream_a_reset() -> None:
    limited = {
        "type": "error",
        "status": 429,
        "error": {"code": "rate_limit_exceeded"},
        "headers": {"Retry-After": "2"},
    }
    started = [{"type": "response.created", "response": {"id": "r"}}]
    socket = FakeSocket([[limited], started])
    sockets = UpstreamSockets(FakeDialer(socket))  # type: ignore[arg-type]
    refused = await sockets.send(SPEC, json.dumps(body(USER)).encode())
    assert refused is not None and (refused.status, refused.headers["retry-after"]) == (429, "2")
    assert json.loads(await refused.read())["error"]["code"] == "rate_limit_exceeded"
    cut = await sockets.send(SPEC, json.dumps(body(USER)).encode())
    assert cut is not None
    with pytest.raises(AttemptFailed) as broken:
        await drain(cut)
    assert broken.value.reason is Reason.RESET and socket.closed


async def test_an_upstream_without_the_mode_is_left_to_http() -> None:
    sockets = UpstreamSockets(FakeDialer())  # type: ignore[arg-type]
    assert await sockets.send(SPEC, json.dumps(body(USER)).encode()) is None
    assert await sockets.send(SPEC, json.dumps(body(USER)).encode()) is None  # remembered


@pytest.mark.parametrize(
    ("env", "proxied"),
    [
        ({"HTTP_PROXY": "http://u:p@proxy.local:3128"}, "http://proxy.local:3128"),
        ({"HTTP_PROXY": "http://u:p@[::1]:3128"}, "http://[::1]:3128"),  # an IPv6 literal
        ({"HTTP_PROXY": "http://proxy.local:3128", "NO_PROXY": "up"}, None),
        ({"HTTPS_PROXY": "http://proxy.local:3128"}, None),  # an http:// upstream
        ({}, None),
    ],
    ids=["http-proxy", "ipv6-proxy", "no-proxy", "other-scheme", "none"],
)
async def test_upstream_socket_dials_honour_the_proxy_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], proxied: str | None
) -> None:
    seen: dict[str, Any] = {}

    async def ws_connect(self: Any, url: str, **kwargs: Any) -> Any:
        seen.update(kwargs, url=url)
        return object()

    import aiohttp

    monkeypatch.setattr(aiohttp.ClientSession, "ws_connect", ws_connect)
    dialer = SocketDialer(1.0, 1.0, env)
    try:
        await dialer.open(SPEC)
    finally:
        await dialer.close()
    assert seen["url"] == "ws://up/v1/responses" and seen["proxy"] == proxied
    if proxied:  # the proxy's credential goes to the proxy, not in the URL; a ws://
        # upgrade has no CONNECT, so it rides on the request (aiohttp sends
        # `proxy_headers` on a CONNECT only)
        assert seen["headers"]["Proxy-Authorization"].startswith("Basic ")
        assert seen["proxy_headers"] is None
