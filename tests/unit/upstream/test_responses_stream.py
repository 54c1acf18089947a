"""The SSE relay on the Responses API's typed events: id, usage, cached tokens, the end."""

from __future__ import annotations

import json

from app.upstream.streaming import SseRelay, failed_event


def ev(obj: dict[str, object]) -> bytes:
    return f"event: {obj['type']}\n".encode() + b"data: " + json.dumps(obj).encode() + b"\n\n"


RESPONSE = {"id": "resp_1", "object": "response", "model": "m-1", "status": "in_progress"}
USAGE = {
    "input_tokens": 40,
    "input_tokens_details": {"cached_tokens": 32},
    "output_tokens": 3,
    "output_tokens_details": {"reasoning_tokens": 0},
}


def stream(end: str = "response.completed", usage: object = USAGE) -> list[bytes]:
    deltas = [
        ev({"type": "response.output_text.delta", "item_id": "m", "delta": word})
        for word in ("one ", "two ", "three")
    ]
    final = {**RESPONSE, "status": end.split(".")[1], "usage": usage}
    return [
        ev({"type": "response.created", "response": {**RESPONSE, "usage": None}}),
        ev({"type": "response.output_item.added", "item": {"type": "message"}}),
        *deltas,
        ev({"type": end, "response": final}),
    ]


def test_the_stream_passes_whole_and_its_usage_is_read() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    data = b"".join(stream())
    out = b"".join(relay.feed(data[i : i + 5]) for i in range(0, len(data), 5)) + relay.finish()
    assert out == data
    assert (relay.response_id, relay.model, relay.done) == ("resp_1", "m-1", True)
    assert (relay.prompt_tokens, relay.completion_tokens, relay.cached_tokens) == (40, 3, 32)
    assert relay.saw_content and relay.completion_estimate() == 4  # "one two three" / 4


def test_a_failed_end_without_usage_still_ends_the_stream() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    for chunk in stream("response.failed", usage=None):
        relay.feed(chunk)  # deltas after the first are deferred: the end must not be
    assert relay.done and not relay.has_usage
    assert relay.completion_estimate() == 4


def test_an_interrupted_stream_is_estimated_from_its_deltas() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    for chunk in stream()[:-1]:
        relay.feed(chunk)
    assert not relay.done and relay.completion_estimate() == 4


def test_the_gateway_ends_a_broken_stream_with_response_failed() -> None:
    data = failed_event("broke off", "stream_interrupted", "resp_1", 7)
    head, body = data.split(b"\n", 1)
    assert head == b"event: response.failed"
    event = json.loads(body.removeprefix(b"data: "))
    assert event["response"]["id"] == "resp_1" and event["sequence_number"] == 7
    assert event["response"]["error"]["code"] == "stream_interrupted"
