"""Pacing to a domain's upstream quota, so the upstream never has to answer 429.

A domain's `requests_per_minute` / `tokens_per_minute` describe its upstream key's
quota. Requests over it wait in the gateway (they are queued, never refused): the
dispatcher acquires capacity here before releasing a request. aiolimiter's leaky
bucket raises on amounts above its rate, so a request bigger than the whole token
rate is clamped to it (it waits for an empty bucket and then goes alone).
`quota_window_sec` sets the bucket's burst: the quota is spread over that window.
"""

from __future__ import annotations

from aiolimiter import AsyncLimiter

# Pace a little under the declared quota: arrival jitter between the gateway and the
# upstream can otherwise compress two paced requests into the upstream's same instant.
HEADROOM = 0.98


class Pacer:
    def __init__(
        self, requests_per_minute: int | None, tokens_per_minute: int | None, window_sec: float
    ) -> None:
        self.window = window_sec
        self.rpm, self.tpm = requests_per_minute, tokens_per_minute
        self._requests = self._limiter(requests_per_minute)
        self._tokens = self._limiter(tokens_per_minute)

    def _limiter(self, per_minute: int | None) -> AsyncLimiter | None:
        if per_minute is None:
            return None
        return AsyncLimiter(max(1.0, per_minute * HEADROOM * self.window / 60), self.window)

    @property
    def enabled(self) -> bool:
        return self._requests is not None or self._tokens is not None

    def ready(self, tokens: int) -> bool:
        """True if a request could go now without waiting."""
        if self._requests is not None and not self._requests.has_capacity(1):
            return False
        return self._tokens is None or self._tokens.has_capacity(self._clamp(tokens))

    def _clamp(self, tokens: int) -> float:
        assert self._tokens is not None
        return float(min(max(1, tokens), self._tokens.max_rate))

    async def acquire(self, tokens: int) -> None:
        await self.acquire_request()
        await self.acquire_tokens(tokens)

    async def acquire_request(self) -> None:
        """Wait for room for one more request (before choosing which one goes)."""
        if self._requests is not None:
            await self._requests.acquire(1)

    async def acquire_tokens(self, tokens: int) -> None:
        if self._tokens is not None:
            await self._tokens.acquire(self._clamp(tokens))
