"""Anthropic Messages answers: JSON and the SSE event sequence, text or `tool_use`.

Usage follows Anthropic's split: `input_tokens` is what the prompt cache neither read
nor wrote; `cache_read_input_tokens` and `cache_creation_input_tokens` are reported
beside it (never inside it), in `message_start` for a stream, and `message_delta`
carries the output count.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from app.sim.tools import split_json

if TYPE_CHECKING:
    from app.sim.shapes import Job


def sse(obj: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def _stop_reason(job: Job) -> str:
    if job.tool_call is not None:
        return "tool_use"
    return "max_tokens" if job.finish == "length" else "end_turn"


def _usage(job: Job, output: int) -> dict[str, int]:
    read, written = job.cache.read, job.cache.written
    return {
        "input_tokens": max(0, job.prompt_tokens - read - written),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "output_tokens": output,
    }


def _blocks(job: Job) -> list[dict[str, Any]]:
    call = job.tool_call
    if call is None:
        return [{"type": "text", "text": "".join(w + " " for w in job.words)}]
    return [
        {
            "type": "tool_use",
            "id": f"toolu_{call.ident}",
            "name": call.name,
            "input": call.arguments,
        }
    ]


def message_body(job: Job) -> dict[str, Any]:
    return {
        "id": job.ident,
        "type": "message",
        "role": "assistant",
        "model": job.model,
        "content": _blocks(job),
        "stop_reason": _stop_reason(job),
        "stop_sequence": None,
        "usage": _usage(job, job.completion_tokens),
    }


def message_events(job: Job) -> Iterator[tuple[bytes, bool]]:
    """(SSE event, carries content) in order."""
    start = {
        "type": "message_start",
        "message": {
            "id": job.ident,
            "type": "message",
            "role": "assistant",
            "model": job.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(job, 1),
        },
    }
    yield sse(start, "message_start"), False
    call = job.tool_call
    if call is None:
        block: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": w + " "} for w in job.words]
    else:
        block = {"type": "tool_use", "id": f"toolu_{call.ident}", "name": call.name, "input": {}}
        pieces = split_json(call.arguments_json)
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
    opening = {"type": "content_block_start", "index": 0, "content_block": block}
    yield sse(opening, "content_block_start"), False
    for delta in deltas:
        event = {"type": "content_block_delta", "index": 0, "delta": delta}
        yield sse(event, "content_block_delta"), True
    yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop"), False
    ending = {
        "type": "message_delta",
        "delta": {"stop_reason": _stop_reason(job), "stop_sequence": None},
        "usage": {"output_tokens": job.completion_tokens},
    }
    yield sse(ending, "message_delta"), False
    yield sse({"type": "message_stop"}, "message_stop"), False


def count_tokens_body(prompt_tokens: int) -> dict[str, int]:
    """`POST /v1/messages/count_tokens`: the prompt as the simulator counts it."""
    return {"input_tokens": prompt_tokens}
