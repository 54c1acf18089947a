"""The simulator's knobs: its models, its key, its pace, its quota and its faults."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from app.sim.quota import Headers, Mode
from app.sim.tools import ToolMode


@dataclass
class Faults:
    """Injected failures. `count` > 0 fails the next N requests; `rate` fails at random."""

    status: int = 500
    count: int = 0
    rate: float = 0.0
    retry_after: float | None = None
    stall_ms: float = 0.0  # wait this long before answering (past the gateway's timeout)
    hold: bool = False  # answer nothing until a PUT of the faults lifts it (no clock to race)
    drop_after: int | None = None  # break streams off after this many content chunks
    reset: bool = False  # cut the connection mid-body instead of answering a status
    paths: tuple[str, ...] = ()  # only these paths (empty = every /v1 path)

    def applies(self, path: str) -> bool:
        return not self.paths or path in self.paths

    def should_fail(self, rng: random.Random) -> bool:
        if self.count > 0:
            self.count -= 1
            return True
        return self.rate > 0 and rng.random() < self.rate


@dataclass
class SimKnobs:
    models: tuple[str, ...] = ("claude-sonnet", "gpt-4o", "text-embedding-3-small")
    api_key: str | None = None  # None: any non-empty bearer key is accepted
    latency_ms: float = 0.0  # before the first byte
    tokens_per_sec: float = 0.0  # 0 = as fast as possible
    reply_tokens: int = 16  # completion length when max_tokens allows
    embedding_dim: int = 16
    rpm: int | None = None
    tpm: int | None = None
    quota_window_sec: float = 60.0
    quota_mode: Mode = "bucket"  # see quota.py
    quota_headers: Headers = "full"
    balance: int | None = None  # prepaid tokens; None: unlimited
    record: bool = True
    max_records: int = 100_000
    anthropic: bool = True  # also serve /v1/messages (and its count_tokens)
    background_ms: float = 300.0  # a background response is done this long after it was made
    responses_websocket: bool = False  # also serve the Responses WebSocket mode
    cache_entries: int = 50_000  # prompt-cache prefixes remembered (LRU); 0: no cache
    cache_min_tokens: int = 1024  # shorter prefixes are never cached (as both APIs do)
    betas: tuple[str, ...] | None = None  # anthropic-beta globs known; None: any accepted
    tool_calls: ToolMode = "auto"  # see tools.py: every request with tools, or only when named
    faults: Faults = field(default_factory=Faults)
    seed: int = 7


T = TypeVar("T")


class StreamDropped(Exception):
    """Raised inside a stream to break the connection off mid-body (`drop_after`)."""


async def paced(events: Iterable[tuple[T, bool]], knobs: SimKnobs) -> AsyncIterator[T]:
    """A stream's events, `(event, is_content)`, as the knobs send them: one content event
    per `1 / tokens_per_sec`, and broken off (`StreamDropped`) past `faults.drop_after`
    content events. Every dialect's stream goes through here."""
    gap = 1 / knobs.tokens_per_sec if knobs.tokens_per_sec else 0.0
    drop = knobs.faults.drop_after
    sent = 0
    for event, is_content in events:
        if is_content:
            if drop is not None and sent >= drop:
                raise StreamDropped
            sent += 1
            if gap:
                await asyncio.sleep(gap)
        yield event
