"""The simulator's prompt cache: what a real upstream's prefix cache would report.

A prompt is a sequence of segments (tools, system, then each message, in the order
the upstream reads them). The cache remembers prefixes by a chained digest of whole
segments (one per segment boundary), in a bounded LRU, so it answers "how many
leading tokens of this prompt did this upstream see before", at segment granularity:

    segments   tools | system | m0 | m1 | m2 | m3
    digests      h1     h2     h3   h4   h5   h6     h_i = H(h_{i-1} || segment_i)
    cached     tokens up to the longest h_i already in the cache (and >= min_tokens)

Two rules, as the two APIs document them:
- OpenAI (`Rule.AUTOMATIC`): every prompt is cached, every boundary stored;
- Anthropic (`Rule.BREAKPOINTS`): only up to the last segment carrying
  `cache_control`; without one nothing is read or written. What is stored beyond what
  was read is reported as written (`cache_creation_input_tokens`).

Segments are normalised before hashing (a string content equals one text block, and
`cache_control` markers are not content), because agents move the markers and
reshape messages between turns while the tokens stay the same. One cache per simulator
process: each simulator plays one domain, so sending a conversation's turns to the
same domain is what makes them hit. The Responses API simulator uses the same class.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson


class Rule(Enum):
    AUTOMATIC = "automatic"
    BREAKPOINTS = "breakpoints"


@dataclass(frozen=True)
class Segment:
    value: Any  # JSON-able: a message, the system prompt, the tool list
    tokens: int  # counted the simulator's way
    breakpoint: bool = False  # carries Anthropic's `cache_control`


@dataclass(frozen=True)
class CacheUse:
    read: int = 0  # prompt tokens served from the cache
    written: int = 0  # prompt tokens newly stored (reported by Anthropic only)


class PromptCache:
    def __init__(self, entries: int = 50_000, min_tokens: int = 1024) -> None:
        self.entries = entries
        self.min_tokens = min_tokens
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def use(self, segments: Sequence[Segment], rule: Rule) -> CacheUse:
        """Look the prompt up, then remember it; what the answer's usage reports."""
        if self.entries <= 0 or not segments:
            return CacheUse()
        if rule is Rule.AUTOMATIC:
            stored = len(segments)
        else:
            marks = [i for i, s in enumerate(segments) if s.breakpoint]
            if not marks:
                return CacheUse()
            stored = marks[-1] + 1
        try:
            digests, totals = _chain(segments)
        except orjson.JSONEncodeError:  # nested past what orjson writes: not cacheable
            return CacheUse()
        read = 0
        for i in range(len(digests) - 1, -1, -1):
            if totals[i] >= self.min_tokens and digests[i] in self._seen:
                read = totals[i]
                self._seen.move_to_end(digests[i])
                break
        for i in range(stored):
            if totals[i] >= self.min_tokens:
                self._remember(digests[i])
        written = 0
        if rule is Rule.BREAKPOINTS and totals[stored - 1] >= self.min_tokens:
            written = max(0, totals[stored - 1] - read)
        return CacheUse(read, written)

    def _remember(self, digest: bytes) -> None:
        seen = self._seen
        if digest in seen:
            seen.move_to_end(digest)
            return
        seen[digest] = None
        if len(seen) > self.entries:
            seen.popitem(last=False)


def _chain(segments: Sequence[Segment]) -> tuple[list[bytes], list[int]]:
    digests: list[bytes] = []
    totals: list[int] = []
    previous, total = b"", 0
    for segment in segments:
        h = hashlib.blake2b(previous, digest_size=16)
        h.update(orjson.dumps(normalise(segment.value), option=orjson.OPT_SORT_KEYS))
        previous = h.digest()
        total += segment.tokens
        digests.append(previous)
        totals.append(total)
    return digests, totals


def normalise(value: Any) -> Any:
    """Drop `cache_control` markers and spell a string content as one text block
    (an explicit stack: a hostile body nested 1000 levels deep must not crash us)."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        item, parent, slot = stack.pop()
        if isinstance(item, dict):
            out: dict[str, Any] = {}
            parent[slot] = out
            for k, v in item.items():
                if k == "cache_control":
                    continue
                if k == "content" and isinstance(v, str):
                    v = [{"type": "text", "text": v}]
                stack.append((v, out, k))
        elif isinstance(item, list):
            seq: list[Any] = [None] * len(item)
            parent[slot] = seq
            stack.extend((v, seq, i) for i, v in enumerate(item))
        else:
            parent[slot] = item
    return root[0]


def has_breakpoint(value: Any) -> bool:
    """Does a segment carry `cache_control` anywhere (a message's blocks, a tool)?"""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("cache_control") is not None:
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
