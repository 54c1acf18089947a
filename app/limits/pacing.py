"""Pacing to a domain's upstream quota: learned, cooled down on 429, shared by replicas.

An upstream 429 is flow control, not a fault. The pace of a domain has three parts,
all in `PaceState` (pure, clock passed in, so `pace.lua` can do the same arithmetic
in Redis for every replica at once):

- **Rate** (requests/s). The ceiling is the lower of the configured quota
  (`requests_per_minute`) and the upstream's `x-ratelimit-limit-requests`, or none.
  A 429 starts an *episode*: the rate drops to 90 % of the rate the upstream was
  seen accepting (`AcceptedRate`; without answers to go by, to `BETA` x the current
  rate) and then grows again linearly (`GROWTH` of itself per second) back to the
  ceiling: AIMD, with the decrease aimed at the measured capacity. A 429 for a
  request sent before the episode's cool-down ended belongs to the same episode
  and changes nothing but the cool-down, so a burst of in-flight 429s is one step.
- **Cool-down**. Nothing is sent until it ends: the upstream's `retry-after-ms` /
  `retry-after` / `x-ratelimit-reset-*`, else 1 s, doubling while nothing is accepted
  between episodes.
  `x-ratelimit-remaining-requests: 0` on a success pauses the same way, before any 429.
- **Spacing** (GCRA, the virtual-scheduling form of a leaky bucket). Any interval of
  `window` seconds holds at most rate x window grants: a burst of `B` (5 % of a
  window's quota, at least 1), the rest spaced at `rate - B / window`. That is safe
  against an upstream that counts per fixed window of that length as well as one with
  a token bucket; `quota_window_sec` defaults to 1 s, as providers quantize per-minute
  quotas to short windows. A reservation returns the wait and books the slot at once,
  so one Redis round trip serves a shared pacer.

Tokens (`tokens_per_minute`, `x-ratelimit-limit-tokens`) are spaced the same way at
their ceiling; the learned factor is applied to them too.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from app.limits.constants import (
    ACCEPTED_SHARE,
    BETA,
    BURST_SHARE,
    FIRST_BACKOFF,
    FORGET,
    GROWTH,
    HEADROOM,
    MAX_BACKOFF,
    MAX_COOL_DOWN,
    MIN_RATE,
    MIN_STEP,
)


@dataclass(frozen=True)
class Throttle:
    """What an upstream 429 said about when to send again."""

    wait: float | None  # seconds, from retry-after(-ms) or x-ratelimit-reset-*; None: none
    sent_at: float  # when the refused request was sent (pacer clock)


@dataclass(frozen=True)
class RateHeaders:
    """OpenAI-style `x-ratelimit-*` of one upstream answer (None: not sent)."""

    limit_requests: float | None = None  # per minute
    limit_tokens: float | None = None
    remaining_requests: float | None = None
    remaining_tokens: float | None = None
    reset_requests: float | None = None  # seconds
    reset_tokens: float | None = None

    @property
    def exhausted_for(self) -> float | None:
        """Seconds until a dimension that has nothing left resets, if one has."""
        waits = [
            reset
            for remaining, reset in (
                (self.remaining_requests, self.reset_requests),
                (self.remaining_tokens, self.reset_tokens),
            )
            if remaining is not None and remaining <= 0 and reset is not None
        ]
        return max(waits) if waits else None


class PaceState:
    def __init__(
        self,
        requests_per_minute: float | None,
        tokens_per_minute: float | None,
        window: float,
    ) -> None:
        self.window = window
        self.configured = (requests_per_minute, tokens_per_minute)
        self.ceiling_r = _per_sec(requests_per_minute)
        self.ceiling_t = _per_sec(tokens_per_minute)
        self.header_r: float | None = None
        self.header_t: float | None = None
        self.learned: float | None = None  # rate right after the last decrease
        self.learned_at = 0.0  # growth counts from here (the end of that cool-down)
        self.cool_until = 0.0
        self.backoff = 0.0
        self.tat_r = self.tat_t = 0.0

    # -- what the pace is now -------------------------------------------------------
    def ceiling(self) -> float | None:
        return _lowest(self.ceiling_r, self.header_r)

    def rate(self, now: float) -> float | None:
        """Requests/s allowed now (None: unbounded)."""
        ceiling = self.ceiling()
        if self.learned is None:
            return ceiling
        step = max(GROWTH * self.learned, MIN_STEP)
        grown = self.learned + step * max(0.0, now - self.learned_at)
        top = ceiling if ceiling is not None else FORGET * self.learned
        if grown >= top:
            # Back at the ceiling, or (with none) twice the rate learned without a 429:
            # nothing learned any more, and an unbounded domain stops being paced.
            self.learned = None
            return ceiling
        return grown

    def token_rate(self, now: float) -> float | None:
        ceiling = _lowest(self.ceiling_t, self.header_t)
        if ceiling is None or self.learned is None:
            return ceiling
        rate, top = self.rate(now), self.ceiling()
        return ceiling * rate / top if rate is not None and top else ceiling

    def bounded(self, now: float) -> bool:
        """Is anything paced now? False means a reservation can be skipped."""
        return (
            self.cool_until > now or self.rate(now) is not None or self.token_rate(now) is not None
        )

    def ready(self, now: float, tokens: int) -> bool:
        """Could one request go now without waiting (nothing is booked)?"""
        if self.cool_until > now:
            return False
        r, t = self.rate(now), self.token_rate(now)
        if r is not None and _gcra(self.tat_r, now, 1.0, r, self.window)[0] > now:
            return False
        return t is None or _gcra(self.tat_t, now, float(tokens), t, self.window)[0] <= now

    # -- reservations -----------------------------------------------------------------
    def reserve(self, now: float, requests: int, tokens: int) -> float:
        """Book `requests` (0 or 1) and `tokens`; the seconds to wait before sending."""
        start = max(now, self.cool_until)
        go = start
        r, t = self.rate(now), self.token_rate(now)
        if requests and r is not None:
            at, self.tat_r = _gcra(self.tat_r, start, float(requests), r, self.window)
            go = max(go, at)
        if tokens and t is not None:
            at, self.tat_t = _gcra(self.tat_t, start, float(tokens), t, self.window)
            go = max(go, at)
        return go - now

    # -- what the upstream said ---------------------------------------------------------
    def throttled(self, now: float, throttle: Throttle, accepted: float) -> bool:
        """A 429. True if it began a new episode (the rate was lowered).

        `accepted`: requests/s the upstream answered lately (since the last cool-down
        ended), what the new rate is aimed under; 0 when nothing got through."""
        if throttle.sent_at < self.cool_until:
            # Sent before this episode's cool-down ended: the same overload, seen again.
            if throttle.wait is not None:
                self._cool(now + min(throttle.wait, MAX_COOL_DOWN))
            return False
        if throttle.wait is not None:
            wait = throttle.wait
        else:
            # Episodes with nothing accepted in between double the wait; an answer since
            # the last cool-down ended starts it again from 1 s (AIMD probing upwards
            # ends each climb with a 429: that must not escalate).
            back_to_back = accepted <= 0 and self.backoff > 0
            self.backoff = min(MAX_BACKOFF, 2 * self.backoff) if back_to_back else FIRST_BACKOFF
            wait = self.backoff
        self.learned = learned_rate(self.rate(now), accepted)
        self._cool(now + min(max(wait, 0.05), MAX_COOL_DOWN))
        self.learned_at = self.cool_until
        return True

    def observe(self, now: float, headers: RateHeaders) -> None:
        """Limits and remaining counts the upstream advertises on any answer."""
        # Below one a minute is no limit an upstream means: ignored, it would stall us.
        if headers.limit_requests and headers.limit_requests >= 1:
            self.header_r = headers.limit_requests / 60 * HEADROOM
        if headers.limit_tokens and headers.limit_tokens >= 1:
            self.header_t = headers.limit_tokens / 60 * HEADROOM
        exhausted = headers.exhausted_for
        if exhausted is not None:
            # A per-minute bucket's reset is its *full* refill; one window is enough.
            self._cool(now + min(exhausted, self.window))

    def _cool(self, until: float) -> None:
        if until > self.cool_until:
            self.cool_until = until
            # Nothing goes before the cool-down ends; after it, at most the burst.
            self.tat_r = max(self.tat_r, until)
            self.tat_t = max(self.tat_t, until)


def learned_rate(current: float | None, accepted: float) -> float:
    """The rate after a new throttle episode: a little under what the upstream was seen
    accepting (the best estimate of its real quota), never above the rate that was just
    refused; without a measure, `BETA` x that rate."""
    if accepted > 0:
        target = ACCEPTED_SHARE * accepted
        return max(MIN_RATE, target if current is None else min(current, target))
    return max(MIN_RATE, BETA * current) if current is not None else MIN_RATE * 5


def _per_sec(per_minute: float | None) -> float | None:
    return None if per_minute is None else per_minute / 60 * HEADROOM


def _lowest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _gcra(tat: float, now: float, amount: float, rate: float, window: float) -> tuple[float, float]:
    """(when `amount` may go, the new theoretical arrival time) at `rate` units/s.

    The burst is `BURST_SHARE` of a window's quota (at least one unit) and the spacing
    `rate - (burst - 1) / window`: evenly spaced grants put at most ceil(spacing x window)
    in a `window`-long interval and the burst adds burst - 1, so none holds more than
    rate x window (rate has the headroom in it, so that is a little under the quota)."""
    quota = rate * window
    burst = max(1.0, math.floor(BURST_SHARE * quota))  # whole requests: a part would round up
    spacing = max(rate - (burst - 1) / window, rate / 2)
    tat = max(tat, now)
    # A request larger than the burst goes once nothing is booked ahead of it, and is
    # charged in full: what follows waits for all of it.
    tolerance = (burst - min(amount, burst)) / spacing
    at = max(now, tat - tolerance)
    return at, tat + amount / spacing


# -- the pacer a dispatcher uses ------------------------------------------------------------
class Pacer(Protocol):
    """One domain's pace; the dispatcher asks it before granting a slot.

    `LocalPacer` keeps it in this process; the Redis store's pacer keeps it in Redis,
    shared by every replica on the same upstream key."""

    shared: bool
    state: PaceState

    def bounded(self) -> bool: ...

    def ready(self, tokens: int) -> bool: ...

    def cooling(self) -> float:
        """Seconds left in a cool-down (0: none)."""
        ...

    def now(self) -> float: ...

    async def reserve(self, requests: int, tokens: int) -> float: ...

    async def throttled(self, throttle: Throttle) -> float:
        """Record a 429; the seconds of cool-down it added (for the metric)."""
        ...

    async def observe(self, headers: RateHeaders) -> float:
        """Record advertised limits; the seconds of cool-down they added."""
        ...

    def answered(self) -> None:
        """One upstream answer that was not a 429 (the accepted-rate measure)."""
        ...

    async def sync(self) -> None:
        """Refresh what other replicas learned (housekeeping, every second)."""
        ...

    def rate(self) -> float | None: ...

    def snapshot(self) -> dict[str, object]: ...


class AcceptedRate:
    """Answers per second lately: over the last `SPAN` seconds, counted only since the
    last cool-down ended (its silence says nothing of the upstream's capacity), and
    divided by at least one second (a burst's first window is what the upstream took
    in a second; a fraction of a second would inflate it). Counts are kept in tenths of
    a second, so memory stays small whatever the traffic."""

    SPAN = 2.0
    STEP = 0.1

    __slots__ = ("_counts", "_last")

    def __init__(self) -> None:
        self._counts: deque[list[float]] = deque()  # [bucket start, answers]
        self._last = -1

    def tick(self, now: float) -> None:
        index = int(now / self.STEP)
        if index != self._last:
            self._last = index
            self._counts.append([index * self.STEP, 0])
            while self._counts[0][0] <= now - self.SPAN - self.STEP:
                self._counts.popleft()
        self._counts[-1][1] += 1

    def rate(self, now: float, since: float) -> float:
        recent = [(at, n) for at, n in self._counts if at > now - self.SPAN and at >= since]
        if not recent:
            return 0.0
        return sum(n for _, n in recent) / max(1.0, now - recent[0][0])


class LocalPacer:
    """The in-process pacer: `PaceState` on this process's monotonic clock."""

    shared = False

    def __init__(self, state: PaceState, clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self.now = clock
        self.accepted = AcceptedRate()

    def bounded(self) -> bool:
        return self.state.bounded(self.now())

    def ready(self, tokens: int) -> bool:
        return self.state.ready(self.now(), tokens)

    def cooling(self) -> float:
        return max(0.0, self.state.cool_until - self.now())

    async def reserve(self, requests: int, tokens: int) -> float:
        return self.state.reserve(self.now(), requests, tokens)

    async def throttled(self, throttle: Throttle) -> float:
        now = self.now()
        before = max(now, self.state.cool_until)
        self.state.throttled(now, throttle, self.accepted.rate(now, self.state.cool_until))
        return max(0.0, self.state.cool_until - before)

    async def observe(self, headers: RateHeaders) -> float:
        now = self.now()
        before = max(now, self.state.cool_until)
        self.state.observe(now, headers)
        return max(0.0, self.state.cool_until - before)

    def answered(self) -> None:
        self.accepted.tick(self.now())

    async def sync(self) -> None:
        return None

    def rate(self) -> float | None:
        return self.state.rate(self.now())

    def snapshot(self) -> dict[str, object]:
        rate = self.rate()
        return pace_view(False, rate, self.state.learned is not None, self.cooling())


def pace_view(shared: bool, rate: float | None, learned: bool, cooling: float) -> dict[str, object]:
    """A pacer as `/health/ready` and `/admin/status` show it."""
    return {
        "shared": shared,
        "requests_per_sec": None if rate is None else round(rate, 3),
        "learned": learned,
        "cooldown_sec": round(cooling, 3),
    }


def rate_headers(headers: Mapping[str, str]) -> RateHeaders | None:
    """Parse `x-ratelimit-*` (None when the answer has none: the usual, cheap case)."""
    if "x-ratelimit-limit-requests" not in headers and "x-ratelimit-limit-tokens" not in headers:
        if "x-ratelimit-remaining-requests" not in headers:
            return None
    return RateHeaders(
        limit_requests=_number(headers.get("x-ratelimit-limit-requests")),
        limit_tokens=_number(headers.get("x-ratelimit-limit-tokens")),
        remaining_requests=_number(headers.get("x-ratelimit-remaining-requests")),
        remaining_tokens=_number(headers.get("x-ratelimit-remaining-tokens")),
        reset_requests=parse_duration(headers.get("x-ratelimit-reset-requests")),
        reset_tokens=parse_duration(headers.get("x-ratelimit-reset-tokens")),
    )


def _number(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(raw: str | None) -> float | None:
    """OpenAI's reset durations: `1s`, `6m0s`, `20ms`, `1h2m3.5s`; a bare number is seconds."""
    if not raw:
        return None
    plain = _number(raw)
    if plain is not None:
        return plain
    total, number = 0.0, ""
    i, text = 0, raw.strip()
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else ch
        if unit not in _UNITS or not number:
            return None
        try:
            total += float(number) * _UNITS[unit]
        except ValueError:
            return None
        number = ""
        i += len(unit)
    return None if number or not math.isfinite(total) else total
