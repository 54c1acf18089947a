"""The Responses API in the pipeline: parsing, accounting, the id -> domain map, pinning
`previous_response_id`, following stored responses (upstreams: `httpx.MockTransport`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from app.errors import InvalidRequest, NotFound
from app.gateway import Gateway
from app.pipeline.answer import StreamAnswer
from app.pipeline.replies import JsonAnswer
from app.pipeline.request import RESPONSES
from app.pipeline.wire import parse_call
from app.runtime import KeySpec
from tests.support.inproc import MakeGateway, ledger_rows

TWO_DOMAINS = {
    # routed by least expected wait (then the configured order), not by conversation
    # (prompt-cache affinity): these tests choose which domain a new response lands on
    "affinity": {"enabled": False},
    "model_route": {"default": "m-1"},
    "retry_policy": {"max_attempts": 1},
    "rate_limit": {"default_max_tokens": 100},
    "scale_up": [
        {"domain": "a", "api_base": "http://a", "models": ["m-1"]},
        {"domain": "b", "api_base": "http://b", "models": ["m-1"]},
    ],
}
Seen = list[tuple[str, str, dict[str, Any] | None]]


def response(rid: str = "resp_1", usage: dict[str, Any] | None = None) -> dict[str, Any]:
    usage = usage or {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 4}}
    return {
        "id": rid,
        "object": "response",
        "model": "m-1",
        "status": "completed",
        "usage": {"output_tokens": 2, **usage},
    }


def upstream(seen: Seen, answer: Callable[[httpx.Request], httpx.Response]) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        seen.append((request.url.host, f"{request.method} {request.url.path}", body))
        return answer(request)

    return handler


@pytest.fixture
def two(make_local_gateway: MakeGateway) -> Callable[..., Gateway]:
    return lambda handler: make_local_gateway(TWO_DOMAINS, handler=handler)


async def create(gw: Gateway, body: dict[str, Any], key: KeySpec | None = None) -> Any:
    await gw.start()
    call = parse_call(
        RESPONSES,
        json.dumps(body).encode(),
        key or gw.keys.anonymous,
        "req_t",
        {},
        time.perf_counter(),
    )
    return await gw.responses.create(call)


def test_parse_reads_max_output_tokens_and_estimates_input_items() -> None:
    key = KeySpec("k", (), 10_000, 10)
    raw = json.dumps(
        {
            "model": "m",
            "input": [{"role": "user", "content": "abcd" * 10}],
            "instructions": "be brief",
            "max_output_tokens": 50,
        }
    ).encode()
    call = parse_call(RESPONSES, raw, key, "r", {}, 0.0)
    assert call.max_tokens == 50 and call.prompt_tokens == 3 + 4 + 2 + 4 + 10
    assert call.cost(1024) == call.prompt_tokens + 50
    for bad in ({"input": 3}, {"input": "x", "store": "no"}, {"previous_response_id": 1}):
        with pytest.raises(InvalidRequest):
            parse_call(RESPONSES, json.dumps({"model": "m", **bad}).encode(), key, "r", {}, 0.0)


async def test_a_follow_up_goes_to_the_domain_holding_its_predecessor(
    two: Callable[..., Gateway],
) -> None:
    seen: Seen = []
    gw = two(upstream(seen, lambda r: httpx.Response(200, json=response(f"resp_{r.url.host}"))))
    gw.pipeline.domains[0].latency = 10.0  # a is slow: new work goes to b
    first = await create(gw, {"input": "hi"})
    assert isinstance(first, JsonAnswer) and first.headers["x-tokengate-domain"] == "b"
    gw.pipeline.domains[0].latency = 0.0  # now a looks best, but the state lives in b
    follow = await create(gw, {"input": "more", "previous_response_id": "resp_b"})
    assert follow.headers["x-tokengate-domain"] == "b"
    assert [host for host, _, _ in seen] == ["b", "b"]
    await gw.settled()
    (row,) = await ledger_rows(gw)
    assert (row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"]) == (18, 4, 8)


async def test_an_unknown_predecessor_is_refused_without_asking_any_domain(
    two: Callable[..., Gateway],
) -> None:
    seen: Seen = []
    gw = two(upstream(seen, lambda r: httpx.Response(200, json=response())))
    for unknown in ("resp_x", "../x"):
        with pytest.raises(InvalidRequest) as refused:
            await create(gw, {"input": "x", "previous_response_id": unknown})
        assert refused.value.code == "previous_response_not_found"
    assert seen == []


async def test_unstored_responses_are_not_remembered_and_others_keys_are_refused(
    two: Callable[..., Gateway],
) -> None:
    gw = two(
        upstream([], lambda r: httpx.Response(200, json=response(json.loads(r.content)["input"])))
    )
    await create(gw, {"input": "resp_kept"})
    await create(gw, {"input": "resp_gone", "store": False})
    assert await gw.responses.homes.where("resp_kept") is not None
    assert await gw.responses.homes.where("resp_gone") is None
    other = KeySpec("bob", (), 100_000, 100)
    with pytest.raises(InvalidRequest) as refused:
        await create(gw, {"input": "x", "previous_response_id": "resp_kept"}, key=other)
    assert refused.value.code == "previous_response_not_found"
    with pytest.raises(NotFound):
        await gw.responses.follow(other, "r", "GET", "resp_kept")


async def test_a_queued_background_response_is_charged_what_it_reserved(
    two: Callable[..., Gateway],
) -> None:
    queued = {"id": "resp_q", "object": "response", "status": "queued", "usage": None}
    gw = two(upstream([], lambda r: httpx.Response(200, json=queued)))
    answer = await create(gw, {"input": "abcd", "background": True, "max_output_tokens": 30})
    assert json.loads(answer.body)["status"] == "queued"
    (row,) = await ledger_rows(gw)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (3 + 4 + 1, 30)


async def test_a_broken_stream_ends_with_response_failed_and_is_charged(
    two: Callable[..., Gateway],
) -> None:
    created = {"type": "response.created", "response": {"id": "resp_s", "model": "m-1"}}
    delta = {"type": "response.output_text.delta", "delta": "abcdefgh"}
    sse = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in (created, delta))
    gw = two(
        upstream(
            [],
            lambda r: httpx.Response(
                200, content=sse, headers={"content-type": "text/event-stream"}
            ),
        )
    )
    answer = await create(gw, {"input": "x", "stream": True})
    assert isinstance(answer, StreamAnswer)
    out = b"".join([chunk async for chunk in answer.body()])
    last = json.loads(out.strip().rsplit(b"\n", 1)[1].removeprefix(b"data: "))
    assert last["type"] == "response.failed" and last["response"]["id"] == "resp_s"
    assert await gw.responses.homes.where("resp_s") is not None  # told as soon as created
    (row,) = await ledger_rows(gw)
    assert row["errors"] == 1 and row["failed_completion_tokens"] == 2


async def test_stored_responses_are_followed_to_their_domain_only(
    two: Callable[..., Gateway],
) -> None:
    seen: Seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/v1/responses":
            return httpx.Response(200, json=response("resp_b1"))
        if request.url.host == "b":
            return httpx.Response(200, json={"id": "resp_b1", "deleted": True})
        return httpx.Response(404, json={"error": {"message": "not found"}})

    gw = two(upstream(seen, answer))
    gw.pipeline.domains[0].latency = 10.0
    await create(gw, {"input": "x"})
    key = gw.keys.anonymous
    seen.clear()
    got = await gw.responses.follow(key, "r", "GET", "resp_b1", "/input_items", "limit=5")
    assert got.status == 200 and seen == [("b", "GET /v1/responses/resp_b1/input_items", None)]
    seen.clear()
    with pytest.raises(NotFound):  # an id no key created: no domain is asked
        await gw.responses.follow(key, "r", "GET", "resp_unknown")
    assert seen == []
    await gw.responses.follow(key, "r", "DELETE", "resp_b1")
    assert await gw.responses.homes.where("resp_b1") is None
    seen.clear()
    with pytest.raises(NotFound):
        await gw.responses.follow(key, "r", "GET", "../chat/completions")
    assert seen == []  # never put in an upstream path


async def test_input_tokens_are_counted_upstream_or_estimated(
    two: Callable[..., Gateway],
) -> None:
    counted = {"object": "response.input_tokens", "input_tokens": 11}
    gw = two(upstream([], lambda r: httpx.Response(200, json=counted)))
    await gw.start()
    body = json.dumps({"input": "abcdabcd"}).encode()
    relayed = await gw.responses.input_tokens(gw.keys.anonymous, body, "r")
    assert json.loads(relayed.body) == counted and "x-tokengate-estimated" not in relayed.headers
    gw2 = two(upstream([], lambda r: httpx.Response(404, json={"error": {"message": "no"}})))
    await gw2.start()
    estimated = await gw2.responses.input_tokens(gw2.keys.anonymous, body, "r")
    assert json.loads(estimated.body)["input_tokens"] == 3 + 4 + 2
    assert estimated.headers["x-tokengate-estimated"] == "true"


async def test_an_upstream_without_the_responses_api_is_named_in_the_404(
    two: Callable[..., Gateway],
) -> None:
    gw = two(upstream([], lambda r: httpx.Response(404, text="Not Found")))
    with pytest.raises(NotFound) as missing:
        await create(gw, {"input": "x"})
    assert "responses = false" in missing.value.message
