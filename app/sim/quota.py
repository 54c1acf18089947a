"""The simulator's own quota: a token bucket per kind, like real providers enforce.

Capacity is the quota's share of `window` (a minute by default) and it refills
continuously; past it the simulator answers 429 with the exact wait.
"""

from __future__ import annotations


class _Bucket:
    def __init__(self, per_minute: int, window: float) -> None:
        self.capacity = per_minute * window / 60
        self.rate = per_minute / 60
        self.level = self.capacity
        self.stamp: float | None = None

    def refill(self, now: float) -> None:
        if self.stamp is not None:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait(self, amount: float) -> float:
        amount = min(amount, self.capacity)
        return 0.0 if self.level >= amount else (amount - self.level) / self.rate


class Quota:
    def __init__(self, rpm: int | None, tpm: int | None, window: float) -> None:
        self.requests = _Bucket(rpm, window) if rpm else None
        self.tokens = _Bucket(tpm, window) if tpm else None

    def take(self, tokens: int, now: float) -> float | None:
        """None if admitted, else seconds until it would be."""
        waits = []
        for bucket, amount in ((self.requests, 1.0), (self.tokens, float(tokens))):
            if bucket is not None:
                bucket.refill(now)
                waits.append(bucket.wait(amount))
        if any(w > 0 for w in waits):
            return max(waits)
        if self.requests is not None:
            self.requests.level -= 1
        if self.tokens is not None:
            self.tokens.level -= min(tokens, self.tokens.capacity)
        return None
