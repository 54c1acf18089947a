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


@dataclass(slots=True, init=False)
class Decision:
    """Outcome of one admission, with what OpenAI's x-ratelimit-* headers report.

    (Built on every request: its `__init__` is written out, so the compiled build runs it
    as C; docs/development.md, "The compiled build", says why.)"""

    allowed: bool
    limit: str | None  # which limit refused: "requests" | "tokens"
    retry_after: float
    requests_limit: int
    requests_remaining: int
    requests_reset: float
    tokens_limit: int
    tokens_remaining: int
    tokens_reset: float
    too_large: bool  # the request can never fit: more tokens than a minute's allowance

    def __init__(
        self,
        allowed: bool,
        limit: str | None,
        retry_after: float,
        requests_limit: int,
        requests_remaining: int,
        requests_reset: float,
        tokens_limit: int,
        tokens_remaining: int,
        tokens_reset: float,
        too_large: bool = False,
    ) -> None:
        self.allowed = allowed
        self.limit = limit
        self.retry_after = retry_after
        self.requests_limit = requests_limit
        self.requests_remaining = requests_remaining
        self.requests_reset = requests_reset
        self.tokens_limit = tokens_limit
        self.tokens_remaining = tokens_remaining
        self.tokens_reset = tokens_reset
        self.too_large = too_large


def decide(requests: Bucket, tokens: Bucket, cost: int, now: float) -> Decision:
    """Admit `1 request + cost tokens` from both buckets, or neither.

    The bucket methods' arithmetic (`refill`, `wait_for`, `debit`, `until_full`), written
    out once here: this runs on every admission, and the eight calls cost more than the
    sums (`tests/unit/limits/test_bucket*.py` hold it to the same table as the methods)."""
    r_cap, t_cap = requests.capacity, tokens.capacity
    r_rate, t_rate = requests.rate, tokens.rate
    if now > requests.stamp:  # refill
        level = requests.level + (now - requests.stamp) * r_rate
        requests.level = level if level < r_cap else r_cap
        requests.stamp = now
    if now > tokens.stamp:
        level = tokens.level + (now - tokens.stamp) * t_rate
        tokens.level = level if level < t_cap else t_cap
        tokens.stamp = now
    r_level, t_level = requests.level, tokens.level
    # wait_for(1) and wait_for(cost)
    if 1 > r_cap:
        wait_r = math.inf
    else:
        wait_r = 0.0 if 1 <= r_level else (1 - r_level) / r_rate
    if cost > t_cap:
        wait_t = math.inf
    else:
        wait_t = 0.0 if cost <= t_level else (cost - t_level) / t_rate
    allowed = wait_r == 0 and wait_t == 0
    limit: str | None  # declared: a tuple's None is no type for the compiled build
    if allowed:  # debit, bounded at one capacity either way
        r_level = min(r_cap, max(-r_cap, r_level - 1))
        t_level = min(t_cap, max(-t_cap, t_level - cost))
        requests.level, tokens.level = r_level, t_level
        limit = None
        retry_after = 0.0
    else:
        limit = "requests" if wait_r >= wait_t else "tokens"
        retry_after = max(wait_r, wait_t)
    return Decision(
        allowed,
        limit,
        retry_after,
        int(r_cap),
        max(0, math.floor(r_level)),
        max(0.0, (r_cap - r_level) / r_rate),  # until_full
        int(t_cap),
        max(0, math.floor(t_level)),
        max(0.0, (t_cap - t_level) / t_rate),
        wait_t == math.inf,
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
