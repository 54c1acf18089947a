"""The SSE relay: whole events forwarded, usage read, the gateway's own usage chunk removed."""

from __future__ import annotations

import json

from app.upstream.streaming import UNREAD_LIMIT, SseRelay, error_event


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


CHUNKS = [
    ev({"model": "m", "choices": [{"index": 0, "delta": {"content": "hello "}}], "usage": None}),
    ev({"model": "m", "choices": [{"index": 0, "delta": {"content": "world"}}], "usage": None}),
    ev({"model": "m", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}),
    b"data: [DONE]\n\n",
]


def relay_all(relay: SseRelay, data: bytes, step: int) -> bytes:
    out = b"".join(relay.feed(data[i : i + step]) for i in range(0, len(data), step))
    return out + relay.finish()


def test_usage_chunk_is_stripped_when_the_gateway_asked_for_it() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    out = relay_all(relay, b"".join(CHUNKS), 7)  # events split across arbitrary chunks
    assert out == CHUNKS[0] + CHUNKS[1] + CHUNKS[3]
    assert (relay.prompt_tokens, relay.completion_tokens, relay.done) == (7, 2, True)


def test_everything_passes_when_the_client_asked_for_usage() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    assert relay_all(relay, b"".join(CHUNKS), 1000) == b"".join(CHUNKS)
    assert relay.has_usage and relay.saw_content


def test_crlf_streams_are_normalised() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    out = relay_all(relay, b"".join(CHUNKS).replace(b"\n", b"\r\n"), 5)
    assert out == b"".join(CHUNKS)


def test_cr_only_streams_are_events_too() -> None:
    """SSE lets a lone CR end a line: such a stream is cut into the same events, and its
    usage read, as the LF one (before the one parser, it was held whole to its end)."""
    for step in (1, 5, 1000):
        relay = SseRelay(strip_usage_chunk=True)
        data = b"".join(CHUNKS).replace(b"\n", b"\r")
        first = relay.feed(data[: len(CHUNKS[0]) + 1])  # its end is seen: it goes at once
        assert first == CHUNKS[0]
        out = first + relay_all(relay, data[len(CHUNKS[0]) + 1 :], step)
        assert out == CHUNKS[0] + CHUNKS[1] + CHUNKS[3]
        assert (relay.prompt_tokens, relay.completion_tokens, relay.done) == (7, 2, True)


def test_interrupted_stream_estimate_from_streamed_text() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    relay.feed(CHUNKS[0] + CHUNKS[1])
    assert not relay.has_usage and relay.completion_estimate() == 3  # "hello world" = 11 chars


def test_anthropic_usage_is_read() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    events = (
        b'event: message_start\ndata: {"type":"message_start","message":{"model":"c",'
        b'"usage":{"input_tokens":9,"output_tokens":1}}}\n\n'
        b"event: content_block_delta\n"
        b'data: {"type":"content_block_delta","delta":{"text":"hi"}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":4}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    relay_all(relay, events, 11)
    assert (relay.prompt_tokens, relay.completion_tokens, relay.model) == (9, 4, "c")
    assert relay.done


def test_error_event_is_what_the_sdks_raise_on() -> None:
    body = json.loads(error_event("gone", "stream_interrupted")[6:])
    assert body["error"]["code"] == "stream_interrupted"


def openai_chunk(text: str, usage: object = None) -> bytes:
    body = {"model": "m", "choices": [{"index": 0, "delta": {"content": text}}], "usage": usage}
    return ev(body)


def test_content_read_later_still_counts_every_token_of_an_interrupted_stream() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    pieces = [openai_chunk(t) for t in ("ab", "cd", "\u4f60\u597d", 'e\n"', "fgh")]
    out = relay_all(relay, b"".join(pieces), 9)
    assert out == b"".join(pieces)  # passed through untouched
    # quarter tokens: 2 + 2 + 2 CJK x 4 + 3 (escapes decoded) + 3 = 18 -> 5 tokens
    assert not relay.has_usage and relay.completion_estimate() == 5


def test_usage_on_a_content_chunk_is_read_even_after_content() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    usage = {"prompt_tokens": 5, "completion_tokens": 2}
    relay_all(relay, openai_chunk("a") + openai_chunk("b") + openai_chunk("c", usage), 1000)
    assert (relay.prompt_tokens, relay.completion_tokens) == (5, 2)


def test_a_long_stream_holds_a_bounded_amount_unread() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    chunk = openai_chunk("x" * 100)
    for _ in range(2000):  # ~400 KB of events
        relay.feed(chunk)
    assert relay._unread_bytes <= UNREAD_LIMIT
    assert relay.completion_estimate() == 2000 * 100 // 4
