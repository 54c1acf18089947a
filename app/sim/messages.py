"""Anthropic Messages answers: JSON and the SSE event sequence, text or `tool_use`.

Usage follows Anthropic's split: `input_tokens` is what the prompt cache neither read
nor wrote; `cache_read_input_tokens` and `cache_creation_input_tokens` are reported
beside it (never inside it), in `message_start` for a stream, and `message_delta`
carries the output count.

Extended thinking (`thinking: {"type": "enabled" | "adaptive"}`): the answer starts with a
`thinking` block whose `signature` seals its text (streamed as `thinking_delta` then
`signature_delta`), and a conversation that sends a thinking block back must send it
exactly as it came: a block whose signature does not match its text is refused with 400,
as Anthropic's API does, so a gateway that re-serialises one is caught.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from typing import Any, Protocol

import orjson

from app.sim.cache import CacheUse
from app.sim.tools import ToolCall, split_json


class MessageSource(Protocol):
    """What an Anthropic answer is built from (`shapes.SimReply`, which renders the
    Messages kind through this module)."""

    @property
    def body(self) -> dict[str, Any]: ...
    @property
    def model(self) -> str: ...
    @property
    def ident(self) -> str: ...
    @property
    def words(self) -> list[str]: ...
    @property
    def finish(self) -> str: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def tool_call(self) -> ToolCall | None: ...
    @property
    def cache(self) -> CacheUse: ...


# Text with characters a re-encoding would change (escapes, non-ASCII, U+2028).
THINKING = 'Plan: read the file \u2192 answer \u201cbriefly\u201d; caf\u00e9 \u2028 \\ / "ok"'


def signature(thinking: str) -> str:
    digest = hashlib.sha256(b"sim-thinking\x00" + thinking.encode("utf-8", "surrogatepass"))
    return base64.b64encode(digest.digest() * 3).decode()


def thinks(body: dict[str, Any]) -> bool:
    cfg = body.get("thinking")
    return isinstance(cfg, dict) and cfg.get("type") in ("enabled", "adaptive")


def bad_signature(messages: list[Any]) -> str | None:
    """The refusal for a thinking block sent back altered (None: all intact)."""
    for n, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "thinking":
                text, sig = block.get("thinking"), block.get("signature")
                if not isinstance(text, str) or sig != signature(text):
                    return f"messages.{n}.content: Invalid `signature` in `thinking` block"
    return None


def sse(obj: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def _stop_reason(job: MessageSource) -> str:
    if job.tool_call is not None:
        return "tool_use"
    return "max_tokens" if job.finish == "length" else "end_turn"


def _usage(job: MessageSource, output: int) -> dict[str, int]:
    read, written = job.cache.read, job.cache.written
    return {
        "input_tokens": max(0, job.prompt_tokens - read - written),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "output_tokens": output,
    }


def _blocks(job: MessageSource) -> list[dict[str, Any]]:
    thought = (
        [{"type": "thinking", "thinking": THINKING, "signature": signature(THINKING)}]
        if thinks(job.body)
        else []
    )
    call = job.tool_call
    if call is None:
        return [*thought, {"type": "text", "text": "".join(w + " " for w in job.words)}]
    return [
        *thought,
        {
            "type": "tool_use",
            "id": f"toolu_{call.ident}",
            "name": call.name,
            "input": call.arguments,
        },
    ]


def message_body(job: MessageSource) -> dict[str, Any]:
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


def message_events(job: MessageSource) -> Iterator[tuple[bytes, bool]]:
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
    at = 0
    if thinks(job.body):
        yield from _thinking_events()
        at = 1
    call = job.tool_call
    if call is None:
        block: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": w + " "} for w in job.words]
    else:
        block = {"type": "tool_use", "id": f"toolu_{call.ident}", "name": call.name, "input": {}}
        pieces = split_json(call.arguments_json)
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
    opening = {"type": "content_block_start", "index": at, "content_block": block}
    yield sse(opening, "content_block_start"), False
    for delta in deltas:
        event = {"type": "content_block_delta", "index": at, "delta": delta}
        yield sse(event, "content_block_delta"), True
    yield sse({"type": "content_block_stop", "index": at}, "content_block_stop"), False
    ending = {
        "type": "message_delta",
        "delta": {"stop_reason": _stop_reason(job), "stop_sequence": None},
        "usage": {"output_tokens": job.completion_tokens},
    }
    yield sse(ending, "message_delta"), False
    yield sse({"type": "message_stop"}, "message_stop"), False


def _thinking_events() -> Iterator[tuple[bytes, bool]]:
    block = {"type": "thinking", "thinking": "", "signature": ""}
    yield (
        sse(
            {"type": "content_block_start", "index": 0, "content_block": block},
            "content_block_start",
        ),
        False,
    )
    half = len(THINKING) // 2
    for piece in (THINKING[:half], THINKING[half:]):
        delta = {"type": "thinking_delta", "thinking": piece}
        yield (
            sse({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"),
            True,
        )
    delta = {"type": "signature_delta", "signature": signature(THINKING)}
    yield (
        sse({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"),
        False,
    )
    yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop"), False


def count_tokens_body(prompt_tokens: int) -> dict[str, int]:
    """`POST /v1/messages/count_tokens`: the prompt as the simulator counts it."""
    return {"input_tokens": prompt_tokens}
