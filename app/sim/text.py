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


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def chat_prompt_tokens(messages: list[Any], system: Any = None) -> int:
    total = count_text(_content_text(system)) if system else 0
    for m in messages:
        total += 3 + count_text(_content_text(m.get("content")))
    return total


def input_tokens(value: Any) -> int:
    if isinstance(value, str):
        return count_text(value)
    if isinstance(value, list):
        if all(isinstance(v, int) for v in value):
            return len(value)
        return sum(input_tokens(v) for v in value)
    return 0


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
