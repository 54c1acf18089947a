"""Deterministic completions and usage, computed the simulator's own way.

Usage is counted differently from the gateway's estimate on purpose (words and CJK
characters, 3 tokens per message), so tests prove the gateway settles on what the
upstream *reports*, not on what it guessed.
"""

from __future__ import annotations

import hashlib
import re
import struct
from typing import Any

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
VOCAB = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
    "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()


def count_text(text: str) -> int:
    cjk = len(_CJK.findall(text))
    words = len(_CJK.sub(" ", text).split())
    return cjk + words


# Fields that name or mark a part rather than say something: not counted as text.
_NOT_TEXT = frozenset({"type", "id", "tool_use_id", "cache_control", "signature", "data"})


def _content_text(content: Any) -> str:
    """All the text in a message content (text parts, tool inputs and results, tool call
    arguments), however deeply nested (an explicit stack: a hostile body nested 1000
    levels deep must not crash the simulator)."""
    parts, stack = [], [content]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            parts.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed([v for k, v in item.items() if k not in _NOT_TEXT]))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return " ".join(parts)


def value_tokens(value: Any) -> int:
    """Tokens of any JSON value (a tool list, a message) the simulator's way."""
    return count_text(_content_text(value))


def message_tokens(message: dict[str, Any]) -> int:
    return 3 + value_tokens(message.get("content")) + value_tokens(message.get("tool_calls"))


def chat_prompt_tokens(messages: list[Any], system: Any = None) -> int:
    total = value_tokens(system) if system else 0
    for m in messages:
        total += message_tokens(m)
    return total


def input_tokens(value: Any) -> int:
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += count_text(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            total += 1
        elif isinstance(item, list):
            stack.extend(item)
    return total


def seed_of(value: Any) -> str:
    return _content_text(value)


def reply_words(seed_text: str, n: int) -> list[str]:
    """`n` words chosen from the prompt's digest: the same prompt, the same answer."""
    digest = hashlib.sha256(seed_text.encode()).digest()
    start = digest[0]
    return [VOCAB[(start + i * 7) % len(VOCAB)] for i in range(n)]


def embedding(text: str, dim: int) -> list[float]:
    out: list[float] = []
    counter = 0
    while len(out) < dim:
        block = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        out.extend(v / 2**31 - 1 for v in struct.unpack("<8I", block))
        counter += 1
    return [round(v, 6) for v in out[:dim]]
