"""Per-key limits while Redis is unreachable (fail open): each replica its share, and
nothing it admitted forgotten. Pure, clock injected.

- **Share.** Each replica enforces limit / n, n = the processes seen alive in the last
  minute (their once-a-second heartbeat in Redis, counted just before the outage), at
  least `redis.assumed_replicas`. N replicas together stay at the limit, not N x it.
  A share below one request keeps a burst of one but refills at the share's rate.
- **Seed.** A key's local buckets start where this replica last saw the shared ones
  (their level / n, refilled since at the share's rate), never full: an outage is not
  a fresh minute's allowance.
- **Kept across flaps.** A key's local buckets live on when Redis answers again (only a
  bucket refilled to full, which a new seed could not undercut, is dropped), and every
  shared decision lowers them to the shared level / n: a flapping Redis (a call timing
  out, then answering, then timing out again) continues one bucket, never starts a fresh
  share per flap or per timed-out call, so the flaps add nothing to a minute's allowance.
- **Charge on recovery.** What this replica admitted meanwhile is charged to the shared
  buckets (`recover`): the smaller of what it admitted and its buckets' deficit (the
  share minus the level left). The first is exact when the outage was short (the shared
  bucket refilled meanwhile and now pays for what was admitted); the second when it was
  long (the shared bucket filled up; what is left of the replicas' shares is the best
  guess of the real level). When Redis lost its state (restarted without persistence,
  its buckets full again), the deficit is charged: the shared level becomes the sum of
  what the replicas have left.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.limits.bucket import Bucket, Decision, Limits, Remaining, correct, decide
from app.limits.constants import WINDOW_SEC

Clock = Callable[[], float]


@dataclass(slots=True)
class _Seen:
    requests: float
    tokens: float
    at: float


@dataclass(slots=True)
class _Local:
    limits: Limits
    requests: Bucket
    tokens: Bucket
    admitted_requests: float = 0.0  # admitted here during the outage, settles included
    admitted_tokens: float = 0.0


class Fallback:
    def __init__(self, clock: Clock = time.monotonic, assumed_replicas: int = 1) -> None:
        self.clock = clock
        self.assumed = max(1, assumed_replicas)
        self.replicas = 0  # processes seen alive in the last minute (0: not known yet)
        self._seen: dict[str, _Seen] = {}
        self._local: dict[str, _Local] = {}

    @property
    def divisor(self) -> int:
        return max(self.replicas, self.assumed)

    # -- while Redis answers --------------------------------------------------------------
    def seen(self, key: str, decision: Decision) -> None:
        """The shared levels a reservation reported: kept to seed an outage's buckets,
        and a bucket kept from an earlier flap is lowered to them (never raised)."""
        now = self.clock()
        seen = self._seen[key] = _Seen(
            float(decision.requests_remaining), float(decision.tokens_remaining), now
        )
        local = self._local.get(key)
        if local is not None:
            n = self.divisor
            local.requests.refill(now)
            local.tokens.refill(now)
            local.requests.level = min(local.requests.level, seen.requests / n)
            local.tokens.level = min(local.tokens.level, seen.tokens / n)

    # -- during an outage ----------------------------------------------------------------
    def reserve(self, key: str, limits: Limits, cost: int) -> Decision:
        local = self._get(key, limits)
        now = self.clock()
        # A request bigger than the share, though within the whole limit, still goes (once
        # the share is full) and leaves the bucket in debt: the share must not refuse what
        # the limit allows as "larger than the whole allowance".
        fits = cost if cost > limits.tokens_per_minute else min(cost, int(local.tokens.capacity))
        decision = decide(local.requests, local.tokens, fits, now)
        if decision.allowed:
            local.tokens.debit(cost - fits)
            local.admitted_requests += 1
            local.admitted_tokens += cost
        return decision

    def settle(self, key: str, limits: Limits, token_delta: int, request_delta: int) -> None:
        local = self._get(key, limits)
        correct(local.requests, local.tokens, token_delta, request_delta, self.clock())
        local.admitted_requests += request_delta
        local.admitted_tokens += token_delta

    def _get(self, key: str, limits: Limits) -> _Local:
        local = self._local.get(key)
        if local is None or local.limits != limits:
            local = self._start(key, limits, local)
            self._local[key] = local
        return local

    def _start(self, key: str, limits: Limits, before: _Local | None) -> _Local:
        n, now = self.divisor, self.clock()
        requests = _share(limits.requests_per_minute, n)
        tokens = _share(limits.tokens_per_minute, n)
        if before is not None:  # a limit changed live meanwhile: keep the fraction used
            requests.level = requests.capacity * before.requests.level / before.requests.capacity
            tokens.level = tokens.capacity * before.tokens.level / before.tokens.capacity
            requests.stamp = tokens.stamp = now
            return _Local(
                limits, requests, tokens, before.admitted_requests, before.admitted_tokens
            )
        seen = self._seen.get(key)
        if seen is not None:
            requests.level = min(requests.capacity, seen.requests / n)
            tokens.level = min(tokens.capacity, seen.tokens / n)
            requests.stamp = tokens.stamp = seen.at
        else:
            requests.stamp = tokens.stamp = now
        return _Local(limits, requests, tokens)

    # -- Redis is back -------------------------------------------------------------------
    def recover(self, lost: bool) -> dict[str, tuple[Limits, int, int]]:
        """Per key: (limits, tokens, requests) admitted here since the last recovery, to
        charge to the shared buckets. The buckets are kept for the next flap (those
        refilled to full are dropped). `lost`: Redis came back without its data."""
        now = self.clock()
        out: dict[str, tuple[Limits, int, int]] = {}
        for key, local in list(self._local.items()):
            local.requests.refill(now)
            local.tokens.refill(now)
            tokens = _charge(local.tokens, local.admitted_tokens, now, lost)
            requests = _charge(local.requests, local.admitted_requests, now, lost)
            if tokens or requests:
                out[key] = (local.limits, tokens, requests)
            local.admitted_requests = local.admitted_tokens = 0.0
            if _full(local.requests) and _full(local.tokens):
                del self._local[key]
        return out

    @property
    def active(self) -> bool:
        """This replica admitted something locally that is not charged to Redis yet."""
        return any(v.admitted_requests or v.admitted_tokens for v in self._local.values())

    def peek(self, key: str) -> Remaining | None:
        """What this replica's share of a key has left now (None: not used yet)."""
        local = self._local.get(key)
        if local is None:
            return None
        now = self.clock()
        left = (local.requests.peek(now), local.tokens.peek(now))
        return Remaining(*(max(0, math.floor(v)) for v in left))


def _share(limit: int, n: int) -> Bucket:
    share = limit / n
    bucket = Bucket.full(max(1.0, share), 0.0)
    bucket.rate = share / WINDOW_SEC
    return bucket


def _full(bucket: Bucket) -> bool:
    return bucket.level >= bucket.capacity


def _charge(bucket: Bucket, admitted: float, now: float, lost: bool) -> int:
    if admitted <= 0:
        return math.floor(admitted)  # refunds only: they pass through as they are
    bucket.refill(now)
    deficit = max(0.0, bucket.capacity - bucket.level)
    return math.ceil(deficit if lost else min(admitted, deficit))
