"""The simulator's own quota, enforced the ways real providers do.

- `bucket`: a token bucket per kind holding `window` seconds of the per-minute quota,
  refilling continuously.
- `window`: a fixed window per kind: at most the quota's share of `window` seconds in
  each aligned window, counted afresh when the next begins (how providers quantize
  "600 per minute" to "10 per second").

Past either, the answer is 429 with the exact wait. Every answer can carry OpenAI's
`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (`headers = "full"`); with
`"retry-after"` only 429s carry a wait, with `"none"` not even they do.

`balance` is the account's prepaid tokens: once spent, every request is refused with
OpenAI's `insufficient_quota` 429 (no wait helps) until `PUT /_sim/quota` tops it up.
"""

from __future__ import annotations

import math
from typing import Literal

Mode = Literal["bucket", "window"]
_EPSILON = 1e-9  # refill arithmetic in floats: "exactly refilled" must count as refilled
Headers = Literal["full", "retry-after", "none"]


class _Bucket:
    def __init__(self, per_minute: int, window: float) -> None:
        self.per_minute = per_minute
        self.capacity = per_minute * window / 60
        self.rate = per_minute / 60
        self.level = self.capacity
        self.stamp: float | None = None

    def refill(self, now: float) -> None:
        if self.stamp is not None:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait(self, amount: float, now: float) -> float:
        self.refill(now)
        amount = min(amount, self.capacity)
        short = amount - self.level
        return 0.0 if short <= _EPSILON else short / self.rate

    def take(self, amount: float) -> None:
        self.level -= min(amount, self.capacity)

    def remaining(self, now: float) -> float:
        self.refill(now)
        return max(0.0, self.level)

    def reset(self, now: float) -> float:
        return (self.capacity - self.remaining(now)) / self.rate


class _Window:
    def __init__(self, per_minute: int, window: float) -> None:
        self.per_minute = per_minute
        self.length = window
        self.capacity = max(1.0, math.floor(per_minute * window / 60))
        self.index = -1
        self.used = 0.0

    def _roll(self, now: float) -> None:
        index = math.floor(now / self.length)
        if index != self.index:
            self.index, self.used = index, 0.0

    def wait(self, amount: float, now: float) -> float:
        self._roll(now)
        amount = min(amount, self.capacity)
        return 0.0 if self.used + amount <= self.capacity else self.reset(now)

    def take(self, amount: float) -> None:
        self.used += min(amount, self.capacity)

    def remaining(self, now: float) -> float:
        self._roll(now)
        return max(0.0, self.capacity - self.used)

    def reset(self, now: float) -> float:
        return (math.floor(now / self.length) + 1) * self.length - now


class Quota:
    def __init__(
        self,
        rpm: int | None,
        tpm: int | None,
        window: float,
        mode: Mode = "bucket",
        balance: int | None = None,
    ) -> None:
        kind = _Window if mode == "window" else _Bucket
        self.requests = kind(rpm, window) if rpm else None
        self.tokens = kind(tpm, window) if tpm else None
        self.balance = balance

    def take(self, tokens: int, now: float) -> float | None:
        """None if admitted, else seconds until it would be."""
        waits = [
            limit.wait(amount, now)
            for limit, amount in ((self.requests, 1.0), (self.tokens, float(tokens)))
            if limit is not None
        ]
        if any(w > 0 for w in waits):
            return max(waits)
        if self.requests is not None:
            self.requests.take(1)
        if self.tokens is not None:
            self.tokens.take(tokens)
        return None

    @property
    def exhausted(self) -> bool:
        return self.balance is not None and self.balance <= 0

    def spend(self, tokens: int) -> None:
        if self.balance is not None:
            self.balance -= tokens

    def headers(self, now: float) -> dict[str, str]:
        """OpenAI's `x-ratelimit-*` for the kinds this quota limits."""
        out: dict[str, str] = {}
        for name, limit in (("requests", self.requests), ("tokens", self.tokens)):
            if limit is not None:
                out[f"x-ratelimit-limit-{name}"] = str(limit.per_minute)
                out[f"x-ratelimit-remaining-{name}"] = str(math.floor(limit.remaining(now)))
                out[f"x-ratelimit-reset-{name}"] = f"{max(0.0, limit.reset(now)) * 1000:.0f}ms"
        return out
