"""The limit store interface and its in-process implementation.

A store does two things per request: `reserve` admits or refuses 1 request + `cost`
tokens for a key (awaited: the shared store asks Redis), and `settle` corrects the
token reservation to real usage (never awaited: it only records the correction, and
the shared store hands it to Redis with the key's next reservation or within a few
milliseconds). Keeping both behind this small interface lets admission logic, tests
and the Redis store share one contract.
The usage ledger is not a store's business: it is durable in SQL whatever the store
(`app/billing/ledger.py`, owned by the gateway).

What differs between a store of one process (`MemoryStore`) and one shared by every
replica (`app/limits/shared_store.py`, over the engine in `app/state/`) is behind the
interface too, so the gateway never asks which store it holds: `shared`, the
once-a-second `housekeeping`, the store's part of `/health/ready` (`health`,
`refusing`) and where keys' `max_concurrent` slots are counted (`key_slots`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.limits.bucket import Bucket, Decision, Limits, Remaining, correct, decide
from app.limits.concurrency import KeySlots, LocalSlots
from app.limits.pacing import LocalPacer, Pacer, PaceState

Clock = Callable[[], float]
# Hands a coroutine to the lifecycle owner, which runs it as a task and awaits it on close.
Spawn = Callable[[Coroutine[Any, Any, None]], None]


class LimitStore(Protocol):
    # True when every replica and worker sees the same buckets: no per-worker split of
    # the limits, and a live limit change reaches them all.
    shared: bool

    async def reserve(self, key: str, limits: Limits, cost: int) -> Decision: ...

    def settle(self, key: str, limits: Limits, token_delta: int, request_delta: int) -> None:
        """Correct a reservation: `token_delta` tokens more (or fewer) than reserved,
        `request_delta` -1 to refund the request itself. Records, never waits."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def describe(self) -> dict[str, object]: ...

    def pacer(self, domain: str, state: PaceState) -> Pacer:
        """The pacer of a domain's upstream quota, kept where this store keeps limits."""
        ...

    async def housekeeping(self) -> None:
        """The gateway's once-a-second upkeep (a shared store's heartbeat)."""
        ...

    def health(self) -> dict[str, object]:
        """The store's fields in the `/health/ready` body (none for a local store)."""
        ...

    def refusing(self) -> bool:
        """True while every admission is refused (readiness then fails)."""
        ...

    def key_slots(self) -> KeySlots:
        """Where keys' `max_concurrent` slots are counted (shared when limits are)."""
        ...

    def peek(self, key: str, limits: Limits) -> Remaining | None:
        """What is left of a key's limits now, if this process knows it without I/O
        (the status page); None when only the shared store knows."""
        ...

    async def replicas(self) -> dict[str, float]:
        """The other replicas sharing this store and when each last showed signs of life
        (unix seconds); none for a store of one process."""
        ...

    async def budget(self, keys: Sequence[str], args: Sequence[object]) -> Any | None:
        """One call of `budget.lua` (budgets across replicas, shared_spend.py); None when
        the store is not shared or did not answer."""
        ...


@dataclass
class _KeyBuckets:
    requests: Bucket
    tokens: Bucket


class MemoryBuckets:
    """Per-key buckets of one process."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self._keys: dict[str, _KeyBuckets] = {}

    def _get(self, key: str, limits: Limits) -> _KeyBuckets:
        now = self.clock()
        found = self._keys.get(key)
        if found is None:
            found = _KeyBuckets(
                Bucket.full(limits.requests_per_minute, now),
                Bucket.full(limits.tokens_per_minute, now),
            )
            self._keys[key] = found
        elif (found.requests.capacity, found.tokens.capacity) != limits:
            found.requests.resize(limits.requests_per_minute)
            found.tokens.resize(limits.tokens_per_minute)
        return found

    def reserve(self, key: str, limits: Limits, cost: int) -> Decision:
        b = self._get(key, limits)
        return decide(b.requests, b.tokens, cost, self.clock())

    def peek(self, key: str, limits: Limits) -> Remaining:
        """A key's buckets as they stand now, refilled but not touched (a key never seen
        has its whole allowance)."""
        found = self._keys.get(key)
        if found is None:
            return Remaining(limits.requests_per_minute, limits.tokens_per_minute)
        now = self.clock()
        return Remaining.projected(limits, found.requests.peek(now), found.tokens.peek(now), 0.0)

    def settle(self, key: str, limits: Limits, token_delta: int, request_delta: int) -> None:
        b = self._get(key, limits)
        correct(b.requests, b.tokens, token_delta, request_delta, self.clock())


class MemoryStore:
    shared = False

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.buckets = MemoryBuckets(clock)

    async def start(self) -> None:
        pass

    async def reserve(self, key: str, limits: Limits, cost: int) -> Decision:
        return self.buckets.reserve(key, limits, cost)

    def settle(self, key: str, limits: Limits, token_delta: int, request_delta: int) -> None:
        self.buckets.settle(key, limits, token_delta, request_delta)

    async def close(self) -> None:
        pass

    def describe(self) -> dict[str, object]:
        return {"kind": "memory"}

    def pacer(self, domain: str, state: PaceState) -> Pacer:
        return LocalPacer(state)

    async def housekeeping(self) -> None:
        """Nothing to keep up in-process."""

    def health(self) -> dict[str, object]:
        return {}

    def refusing(self) -> bool:
        return False

    def key_slots(self) -> KeySlots:
        return LocalSlots()

    def peek(self, key: str, limits: Limits) -> Remaining:
        return self.buckets.peek(key, limits)

    async def replicas(self) -> dict[str, float]:
        return {}

    async def budget(self, keys: Sequence[str], args: Sequence[object]) -> Any | None:
        return None  # budgets of one process live in its own tally
