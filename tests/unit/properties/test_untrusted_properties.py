"""Hypothesis against the parsers of bytes the gateway does not choose (issue 31): the SSE
an upstream streams, the `Authorization` / `x-api-key` headers a client sends, the frames
of a Responses WebSocket connection, and the simulator's own request parsers. Each must
answer (a value, or the GatewayError a client is shown), never raise anything else, and
never keep what it refused. Sized for a loaded 2-core machine: a few seconds each."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import httpx
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.auth import KeyIndex
from app.errors import AuthenticationFailed
from app.gateway import Gateway
from app.metrics import Metrics, new_registry
from app.pipeline.socket_session import SocketSession
from app.runtime import KeySpec, compile_runtime
from app.sim.knobs import SimKnobs
from app.sim.server import create_sim_app
from app.upstream.streaming import SseRelay
from tests.support.inproc import local_settings, mock_transport
from tests.unit.properties.strategies import json_values, request_like

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)

# -- SSE from an upstream --------------------------------------------------------------------
EVENTS = [
    b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n',
    b'data: {"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n',
    b'event: response.created\ndata: {"type":"response.created","response":{"id":"r"}}\n\n',
    b'data: {"type":"response.output_text.delta","delta":"ab"}\n\n',
    b"data: [DONE]\n\n",
    b": keep-alive\n\n",
]
sse_bytes = st.lists(
    st.one_of(st.sampled_from(EVENTS), st.binary(max_size=40), st.just(b"\r\n")), max_size=12
).map(b"".join)


def _relay(chunks: list[bytes]) -> tuple[bytes, SseRelay]:
    relay = SseRelay(strip_usage_chunk=False)
    out = b"".join(relay.feed(c) for c in chunks) + relay.finish()
    relay.completion_estimate()
    return out, relay


@FUZZ
@given(sse_bytes, st.lists(st.integers(0, 400), max_size=6))
def test_an_upstream_stream_is_read_the_same_however_it_is_cut(
    data: bytes, cuts: list[int]
) -> None:
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    whole, one = _relay([data])
    pieces, many = _relay(chunks)
    assert pieces == whole  # nothing lost, duplicated or reordered at a chunk boundary
    seen = ("prompt_tokens", "completion_tokens", "response_id", "done", "events")
    assert [getattr(many, a) for a in seen] == [getattr(one, a) for a in seen]
    assert many._tail == b""  # nothing kept once the stream ended


# -- headers a client sends -------------------------------------------------------------------
KEYS = KeyIndex(
    (KeySpec("alice", ("a" * 64,), 1000, 10),), enabled=True, anonymous=KeySpec("-", (), 1, 1)
)
header_text = st.one_of(
    st.none(),
    st.text(max_size=80),
    st.text(max_size=40).map(lambda t: f"Bearer {t}"),
    st.text(max_size=40).map(lambda t: f"bearer  {t}  "),
)


@FUZZ
@given(header_text, header_text)
def test_any_authorization_header_is_a_key_or_a_clean_401(
    authorization: str | None, api_key: str | None
) -> None:
    try:
        KEYS.authenticate(authorization, api_key)
    except AuthenticationFailed as refused:
        assert refused.status == 401 and cast(dict[str, Any], refused.body())["error"]["message"]
    else:
        raise AssertionError("no generated header is alice's key")


# -- WebSocket frames ---------------------------------------------------------------------------
frames = st.one_of(
    st.text(max_size=60),
    json_values.map(lambda v: orjson.dumps(v).decode()),
    request_like.map(lambda b: json.dumps({"type": "response.create", **b})),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["response.create", "response.processed", "x"])},
        optional={
            "generate": st.one_of(st.booleans(), json_values),
            "input": json_values,
            "previous_response_id": st.one_of(st.text(max_size=20), json_values),
            "background": json_values,
            "model": json_values,
        },
    ).map(json.dumps),
)


def _socket_session(tmp_path: Path) -> tuple[Gateway, SocketSession]:
    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "bad", "type": "x"}})

    settings_ = local_settings(tmp_path, {"model_route": {"default": "m-1"}})
    runtime = compile_runtime(settings_, {"TAOTOKEN_API_KEY": "sk"}, no_auth=True)
    gw = Gateway(runtime, Metrics(new_registry()), transport_factory=mock_transport(upstream))
    session = SocketSession(
        gw.responses,
        lambda: gw.keys.anonymous,
        {},
        gw.metrics,
        cached=2,
        max_body=2000,
        new_request_id=lambda: "req_fuzz",
    )
    return gw, session


def test_any_websocket_frame_is_answered_with_events_never_an_exception(tmp_path: Path) -> None:
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    with asyncio.Runner() as runner:
        gw, session = _socket_session(tmp_path)
        runner.run(gw.start())

        @settings(FUZZ, max_examples=60)  # each example runs the session's whole path
        @given(st.lists(frames, min_size=1, max_size=4))
        def check(texts: list[str]) -> None:
            for text in texts:
                sent.clear()
                assert runner.run(session.handle(text, send)) is True
                for frame in sent:
                    event = json.loads(frame)
                    assert event["type"] == "error" or event["type"].startswith("response.")
                    if event["type"] == "error":
                        assert 400 <= event["status"] < 500, event
            # what the connection keeps stays within its bounds
            assert len(session.turns) <= 2
            assert session.kept_bytes == sum(t.size for t in session.turns.values())
            assert len(session.turns) == 1 or session.kept_bytes <= 2000

        try:
            check()
        finally:
            runner.run(gw.close())


# -- the simulator's request parsers ----------------------------------------------------------
SIM_PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/responses/input_tokens",
]
sim_bodies = st.one_of(
    request_like.map(orjson.dumps), json_values.map(orjson.dumps), st.binary(max_size=64)
)


def test_the_simulator_answers_any_body_without_a_server_error() -> None:
    app = create_sim_app(SimKnobs(cache_min_tokens=0, anthropic=True))
    bad: list[tuple[str, int, bytes]] = []

    async def post(path: str, raw: bytes) -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            r = await client.post(path, content=raw, headers={"authorization": "Bearer k"})
            return r.status_code

    with asyncio.Runner() as runner:

        @FUZZ
        @given(st.sampled_from(SIM_PATHS), sim_bodies)
        def check(path: str, raw: bytes) -> None:
            status = runner.run(post(path, raw))
            if status >= 500:
                bad.append((path, status, raw[:200]))

        check()
    assert bad == [], bad[:5]


def test_a_stream_read_one_byte_at_a_time_keeps_its_usage() -> None:
    stream = EVENTS[0] + EVENTS[1] + EVENTS[4]
    out, relay = _relay([stream[i : i + 1] for i in range(len(stream))])
    assert out == stream and relay.done
    assert (relay.prompt_tokens, relay.completion_tokens) == (3, 2)
