"""Usage as each API reports it, every prompt token counted once: Anthropic's cache
tokens are beside `input_tokens` (added), OpenAI's cached tokens inside `prompt_tokens`."""

from __future__ import annotations

import json

from app.upstream.answer_usage import Usage, parse_usage
from app.upstream.streaming import SseRelay


def test_anthropic_cache_tokens_are_part_of_the_prompt() -> None:
    body = {
        "model": "claude",
        "usage": {
            "input_tokens": 12,
            "cache_read_input_tokens": 9000,
            "cache_creation_input_tokens": 700,
            "output_tokens": 40,
        },
    }
    usage = parse_usage(json.dumps(body).encode(), anthropic=True)
    assert usage == Usage(9712, 40, "claude", True, cached=9000, cache_write=700)


def test_openai_cached_tokens_are_already_inside_prompt_tokens() -> None:
    body = {
        "usage": {
            "prompt_tokens": 5000,
            "completion_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 4096},
        }
    }
    usage = parse_usage(json.dumps(body).encode())
    assert (usage.prompt, usage.completion, usage.cached, usage.cache_write) == (5000, 8, 4096, 0)


def sse(kind: str, obj: dict[str, object]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **obj})}\n\n".encode()


def test_anthropic_stream_usage_merges_start_and_delta_non_null_fields() -> None:
    start = {
        "input_tokens": 111,
        "cache_read_input_tokens": 222,
        "cache_creation_input_tokens": 333,
        "output_tokens": 1,
    }
    relay = SseRelay(strip_usage_chunk=False)
    relay.feed(sse("message_start", {"message": {"model": "c", "usage": start}}))
    relay.feed(sse("message_delta", {"usage": {"output_tokens": 7, "input_tokens": None}}))
    assert (relay.prompt_tokens, relay.completion_tokens) == (666, 7)
    assert (relay.cached_tokens, relay.cache_write_tokens) == (222, 333)
    relay.feed(
        sse(
            "message_delta",
            {
                "usage": {
                    "output_tokens": 9,
                    "input_tokens": 444,
                    "cache_read_input_tokens": 555,
                    "cache_creation_input_tokens": 666,
                }
            },
        )
    )
    assert (relay.prompt_tokens, relay.completion_tokens) == (444 + 555 + 666, 9)


def test_tool_call_arguments_count_as_streamed_text() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    call = {"index": 0, "function": {"arguments": '{"city": "Paris"}'}}
    chunk = {"model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}
    relay.feed(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    delta = {"type": "input_json_delta", "partial_json": '{"file_path": "/tmp/a"}'}
    relay.feed(sse("content_block_delta", {"index": 0, "delta": delta}))
    assert relay.saw_content and relay.completion_estimate() == 10  # 17 + 23 chars, / 4
