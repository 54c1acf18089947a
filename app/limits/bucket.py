"""Token-bucket arithmetic, pure and clock-injected.

A bucket holds one minute's allowance (`capacity`) and refills continuously at
`capacity / 60` per second. A request is admitted only if *every* bucket it draws
from has enough, and then all are debited together, so a refused request uses up
nothing. Settling may push a bucket below zero (the answer used more than was
reserved): the debt is repaid by refill before the next admission, bounded at one
capacity so a single bad estimate cannot lock a key out for longer than a minute.

The same rules are implemented in `token_bucket.lua` for Redis;
`tests/unit/limits/test_bucket_lua.py` runs one table of cases against both (the script on
a real redis-server).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from app.limits.constants import WINDOW_SEC


@dataclass(slots=True)
class Bucket:
    capacity: float
    level: float
    stamp: float
    rate: float = field(init=False)  # per second; kept with `capacity` (read per request)

    def __post_init__(self) -> None:
        self.rate = self.capacity / WINDOW_SEC

    @classmethod
    def full(cls, capacity: float, now: float) -> Bucket:
        return cls(capacity=capacity, level=capacity, stamp=now)

    def refill(self, now: float) -> None:
        if now > self.stamp:
            level = self.level + (now - self.stamp) * self.rate
            self.level = level if level < self.capacity else self.capacity
            self.stamp = now

    def peek(self, now: float) -> float:
        """The level `refill(now)` would leave, without changing anything (status page)."""
        if now <= self.stamp:
            return self.level
        return min(self.capacity, self.level + (now - self.stamp) * self.rate)

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` fits (inf if it never can); call after `refill`."""
        if amount > self.capacity:
            return math.inf
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing / self.rate

    def until_full(self) -> float:
        return max(0.0, (self.capacity - self.level) / self.rate)

    def resize(self, capacity: float) -> None:
        """Apply a new limit live, keeping the fraction already used."""
        if capacity != self.capacity and self.capacity > 0:
            self.level = self.level * capacity / self.capacity
        self.capacity = capacity
        self.rate = capacity / WINDOW_SEC

    def debit(self, amount: float) -> None:
        self.level = min(self.capacity, max(-self.capacity, self.level - amount))


class Limits(NamedTuple):
    requests_per_minute: int
    tokens_per_minute: int


class Remaining(NamedTuple):
    """What is left of a key's limits at one instant (whole requests and tokens)."""

    requests: int
    tokens: int

    @classmethod
    def projected(cls, limits: Limits, requests: float, tokens: float, seconds: float) -> Remaining:
        """`requests` and `tokens` left `seconds` ago, refilled since at the limits' rates."""
        rpm, tpm = limits
        r = min(rpm, requests + seconds * rpm / WINDOW_SEC)
        t = min(tpm, tokens + seconds * tpm / WINDOW_SEC)
        return cls(max(0, math.floor(r)), max(0, math.floor(t)))


class Decision(NamedTuple):
    """Outcome of one admission, with what OpenAI's x-ratelimit-* headers report.

    (Immutable records built on every request are NamedTuples: a frozen dataclass
    costs one `object.__setattr__` per field to construct.)"""

    allowed: bool
    limit: str | None  # which limit refused: "requests" | "tokens"
    retry_after: float
    requests_limit: int
    requests_remaining: int
    requests_reset: float
    tokens_limit: int
    tokens_remaining: int
    tokens_reset: float
    too_large: bool = False  # the request can never fit: more tokens than a minute's allowance


def decide(requests: Bucket, tokens: Bucket, cost: int, now: float) -> Decision:
    """Admit `1 request + cost tokens` from both buckets, or neither."""
    requests.refill(now)
    tokens.refill(now)
    wait_r = requests.wait_for(1)
    wait_t = tokens.wait_for(cost)
    allowed = wait_r == 0 and wait_t == 0
    if allowed:
        requests.debit(1)
        tokens.debit(cost)
    limit = None if allowed else ("requests" if wait_r >= wait_t else "tokens")
    return Decision(
        allowed=allowed,
        limit=limit,
        retry_after=0.0 if allowed else max(wait_r, wait_t),
        requests_limit=int(requests.capacity),
        requests_remaining=max(0, math.floor(requests.level)),
        requests_reset=requests.until_full(),
        tokens_limit=int(tokens.capacity),
        tokens_remaining=max(0, math.floor(tokens.level)),
        tokens_reset=tokens.until_full(),
        too_large=math.isinf(wait_t),
    )


def correct(
    requests: Bucket, tokens: Bucket, token_delta: float, request_delta: float, now: float
) -> None:
    """Settle: move both buckets by what the answer really used beyond (or below) its
    reservation; -1 request refunds the request itself."""
    requests.refill(now)
    tokens.refill(now)
    tokens.debit(token_delta)
    requests.debit(request_delta)
