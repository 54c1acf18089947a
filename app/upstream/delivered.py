"""Completion tokens counted from an answer the upstream sent whole but without usage.

A 200 without `usage` still delivered text, and the upstream still charged for it: the
ledger records the gateway's count of what was delivered (flagged `estimated`), never
zero and never the whole `max_tokens`. Counted with the same rule as a stream's text
(`app.limits.estimate.TextCounter`): the answer's text, tool-call arguments and tool
inputs, reasoning text where the answer carries it.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.limits.estimate import TextCounter

_TEXT_FIELDS = ("content", "text", "reasoning_content", "refusal", "thinking")


def delivered_tokens(body: bytes) -> int:
    """Completion tokens of a chat, completion or Messages answer (0 if it is none)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return 0
    if not isinstance(obj, dict):
        return 0
    counter = TextCounter()
    for choice in _list(obj.get("choices")):
        if isinstance(choice, dict):
            _count(counter, choice.get("text"))
            _count_message(counter, choice.get("message"))
    for block in _list(obj.get("content")):  # Anthropic Messages
        _count_block(counter, block)
    return counter.tokens


def _count_message(counter: TextCounter, message: Any) -> None:
    if not isinstance(message, dict):
        return
    for name in _TEXT_FIELDS:
        value = message.get(name)
        if isinstance(value, list):
            for part in value:
                _count_block(counter, part)
        else:
            _count(counter, value)
    for call in _list(message.get("tool_calls")):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            _count(counter, function.get("arguments"))


def _count_block(counter: TextCounter, block: Any) -> None:
    if isinstance(block, str):
        _count(counter, block)
    elif isinstance(block, dict):
        for name in ("text", "thinking"):
            _count(counter, block.get(name))
        if "input" in block:  # a tool_use block: its arguments were generated
            _count(counter, orjson.dumps(block["input"]).decode())


def _count(counter: TextCounter, value: Any) -> None:
    if isinstance(value, str) and value:
        counter.add(value)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
