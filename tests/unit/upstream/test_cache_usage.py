"""Prompt-cache counts in usage, both dialects, whole answers and streams: each prompt
token counted once, reads and writes kept apart for pricing."""

from __future__ import annotations

import orjson

from app.upstream.answer_usage import parse_usage
from app.upstream.streaming import SseRelay

OPENAI = {
    "model": "gpt-4o",
    "usage": {
        "prompt_tokens": 3000,
        "completion_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 1024, "cache_write_tokens": 1900},
    },
}
ANTHROPIC = {
    "model": "claude",
    "usage": {
        "input_tokens": 10,
        "cache_read_input_tokens": 2000,
        "cache_creation_input_tokens": 500,
        "output_tokens": 7,
    },
}


def test_openai_reads_and_writes_are_parts_of_prompt_tokens() -> None:
    u = parse_usage(orjson.dumps(OPENAI))
    assert (u.prompt, u.cached, u.cache_write, u.completion) == (3000, 1024, 1900, 20)


def test_anthropic_prompt_is_input_plus_cache_reads_and_writes() -> None:
    u = parse_usage(orjson.dumps(ANTHROPIC), anthropic=True)
    assert (u.prompt, u.cached, u.cache_write, u.completion) == (2510, 2000, 500, 7)


def test_a_stream_reports_the_same_counts_as_the_whole_answer() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    chunk = {**OPENAI, "choices": []}
    relay.feed(b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n")
    assert (relay.prompt_tokens, relay.cached_tokens, relay.cache_write_tokens) == (
        3000,
        1024,
        1900,
    )
