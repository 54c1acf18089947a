"""The pipeline in-process, the upstream an `httpx.MockTransport` that records requests."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx
import pytest

from app.errors import UpstreamRejected
from app.gateway import Gateway
from app.pipeline.answer import StreamAnswer
from app.pipeline.replies import JsonAnswer
from app.pipeline.request import CHAT
from app.pipeline.wire import parse_call
from tests.support.inproc import CHAT_OK, Handler, MakeGateway, ledger_rows

PIPELINE = {
    "model_aliases": {"m": "m-1"},
    "model_route": {"default": "m"},
    "retry_policy": {"max_attempts": 3, "backoff_ms": 1},
    "scale_up": {"models": ["m-1"]},
}


@pytest.fixture
def make(make_local_gateway: MakeGateway) -> Callable[[Handler], Gateway]:
    return lambda handler: make_local_gateway(PIPELINE, handler=handler)


async def call(gw: Gateway, body: dict[str, object]) -> JsonAnswer | StreamAnswer:
    await gw.start()
    raw = json.dumps(body).encode()
    return await gw.pipeline.handle(
        parse_call(
            CHAT,
            raw,
            gw.keys.anonymous,
            "req_t",
            {"authorization": "Bearer client"},
            time.perf_counter(),
        )
    )


async def test_upstream_gets_its_key_the_resolved_model_and_no_client_credential(
    make: Callable[[Handler], Gateway],
) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=CHAT_OK)

    answer = await call(make(handler), {"messages": [{"role": "user", "content": "x"}]})
    assert isinstance(answer, JsonAnswer) and json.loads(answer.body)["model"] == "m-1"
    (req,) = seen
    assert req.headers["authorization"] == "Bearer sk-upstream"
    assert req.headers["x-request-id"] == "req_t"
    assert json.loads(req.content)["model"] == "m-1"  # default route, then the alias


async def test_retryable_statuses_are_retried_and_client_errors_are_not(
    make: Callable[[Handler], Gateway],
) -> None:
    statuses = iter([503, 502, 200])
    gw = make(lambda r: httpx.Response(next(statuses), json=CHAT_OK))
    assert isinstance(await call(gw, {"messages": [{"role": "user", "content": "x"}]}), JsonAnswer)
    hits = 0

    def bad(request: httpx.Request) -> httpx.Response:
        nonlocal hits
        hits += 1
        return httpx.Response(422, json={"error": {"message": "no"}})

    with pytest.raises(UpstreamRejected) as err:
        await call(make(bad), {"messages": [{"role": "user", "content": "x"}]})
    assert err.value.status == 422 and hits == 1


async def test_stream_usage_is_requested_read_and_hidden(
    make: Callable[[Handler], Gateway],
) -> None:
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        sse = (
            b'data: {"model":"m-1","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
            b'data: {"model":"m-1","choices":[],"usage":{"prompt_tokens":3,'
            b'"completion_tokens":1}}\n\ndata: [DONE]\n\n'
        )
        return httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})

    gw = make(handler)
    answer = await call(gw, {"messages": [{"role": "user", "content": "x"}], "stream": True})
    assert isinstance(answer, StreamAnswer)
    out = b"".join([chunk async for chunk in answer.body()])
    assert b"usage" not in out and out.endswith(b"data: [DONE]\n\n")
    assert bodies[0]["stream_options"] == {"include_usage": True}
    (row,) = await ledger_rows(gw)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (3, 1)


async def test_usage_readers_wait_for_settles_still_in_flight(
    make: Callable[[Handler], Gateway],
) -> None:
    # With Redis a settle is a task that can outlive the answer; /admin/usage awaits them.
    gw = make(lambda r: httpx.Response(200, json=CHAT_OK))
    done: list[bool] = []

    async def slow_settle() -> None:
        await asyncio.sleep(0.05)
        done.append(True)

    gw.spawn(slow_settle())
    await gw.settled()
    assert done == [True]
