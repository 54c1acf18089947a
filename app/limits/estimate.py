"""Prompt-token estimates for admission, before the upstream reports real usage.

Rule (documented in docs/requests.md): a CJK character (Han, kana, Hangul) counts as one
token; any other text counts one token per 4 characters, rounded up; each chat
message adds 4 tokens of framing and the reply primer adds 3. This tracks
cl100k/o200k-style BPE within tens of percent on English and Chinese, is cheap
(`str.isascii` short-circuits the common case) and errs slightly high, which is
the safe side for a reservation: it is corrected to the upstream's usage at settle.
"""

from __future__ import annotations

import re
from typing import Any

_CJK = re.compile(
    r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f]"
)
MESSAGE_OVERHEAD = 4
REPLY_PRIMER = 3


def text_tokens(text: str) -> int:
    if text.isascii():
        return (len(text) + 3) // 4
    cjk = len(_CJK.findall(text))
    return cjk + (len(text) - cjk + 3) // 4


# Content parts whose payload is not text (base64 data, URLs): a flat guess each.
_MEDIA = frozenset({"image", "image_url", "input_image", "input_audio", "document", "file"})
MEDIA_PART = 85


def _content_tokens(content: Any) -> int:
    if isinstance(content, str):
        return text_tokens(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, dict):
                total += _part_tokens(part)
            elif isinstance(part, str):
                total += text_tokens(part)
        return total
    return 0


def _part_tokens(part: dict[str, Any]) -> int:
    """A text part by its text; an image, audio or document part a flat `MEDIA_PART`;
    any other (tool_use input, tool_result content, thinking) by its structure, so an
    agent's tool results (whole files) count."""
    text = part.get("text")
    if isinstance(text, str):
        return text_tokens(text)
    if part.get("type") in _MEDIA:
        return MEDIA_PART
    return structure_tokens(part)


def system_tokens(system: Any) -> int:
    """Anthropic's `system`: a string or a list of text blocks."""
    return _content_tokens(system)


def chat_prompt_tokens(messages: list[Any], tools: Any = None) -> int:
    total = REPLY_PRIMER
    for message in messages:
        if not isinstance(message, dict):
            continue
        total += MESSAGE_OVERHEAD + _content_tokens(message.get("content"))
        calls = message.get("tool_calls")
        if calls:
            total += structure_tokens(calls)
    if tools:
        total += structure_tokens(tools)
    return total


def input_tokens(value: Any) -> int:
    """Prompt of /v1/completions or input of /v1/embeddings: str, list of str, or token ids.

    Walked with an explicit stack: the JSON parser accepts 1024 levels of nesting, far
    past Python's recursion limit, and a hostile body must get an answer, not a 500.
    """
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += text_tokens(item)
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int):
            total += 1  # a token id
        elif isinstance(item, list):
            stack.extend(item)
    return total


def structure_tokens(value: Any) -> int:
    """Tools and tool calls: their strings and keys count as text, the rest as framing."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += text_tokens(item)
        elif isinstance(item, dict):
            total += len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif item is not None:
            total += 1
    return total


class TextCounter:
    """Accumulates streamed text to estimate completion tokens of an interrupted stream."""

    __slots__ = ("tokens_x4",)

    def __init__(self) -> None:
        self.tokens_x4 = 0  # in quarter tokens, so per-chunk rounding does not accumulate

    def add(self, text: str) -> None:
        if text.isascii():
            self.tokens_x4 += len(text)
        else:
            cjk = len(_CJK.findall(text))
            self.tokens_x4 += 4 * cjk + (len(text) - cjk)

    @property
    def tokens(self) -> int:
        return (self.tokens_x4 + 3) // 4


def responses_prompt_tokens(items: Any, instructions: Any = None, tools: Any = None) -> int:
    """The Responses API's `input` (a string or a list of items), `instructions` and
    `tools`. Messages count like chat messages; other items (function calls and their
    outputs, reasoning, tool-specific items) count their strings and keys as text."""
    total = REPLY_PRIMER
    if isinstance(instructions, str):
        total += MESSAGE_OVERHEAD + text_tokens(instructions)
    if isinstance(items, str):
        total += MESSAGE_OVERHEAD + text_tokens(items)
    elif isinstance(items, list):
        for item in items:
            if not isinstance(item, dict):
                continue
            if item.get("type", "message") == "message":
                total += MESSAGE_OVERHEAD + _content_tokens(item.get("content"))
            else:
                total += MESSAGE_OVERHEAD + structure_tokens(item)
    if tools:
        total += structure_tokens(tools)
    return total
