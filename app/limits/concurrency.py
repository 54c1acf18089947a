"""Per-key concurrency caps that queue (`max_concurrent`).

Agents fan out parallel tool calls: a key over its cap is a burst to absorb, not an
error to return. So a request past its key's cap waits, first come first served among
that key's requests, until one of them ends, and only `max_queue_wait_ms` ends the wait
(503 `queue_timeout`, with a Retry-After from how long the key's requests hold a slot).

    acquire(key, cap) ──nobody of this key waiting, slots.take() ok──► Lease (at once)
          │
          └─else──► the key's line (FIFO) ──its head: take() when a lease of the key
                                             ends here, or every POLL_SEC when the
                                             slots are shared (another replica's
                                             lease may have ended)──► Lease

The slots themselves are counted where the limits are kept (`LimitStore.key_slots`):
in this process (`LocalSlots`), or in Redis (`SharedSlots`, `lease.lua`): a lease is a
member of the key's sorted set that expires unless renewed (once a second, by the
gateway's housekeeping), so the leases of a replica that died are freed within
`LEASE_TTL_MS`. While Redis is unreachable each replica counts its own (fail open).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from app.errors import ServiceUnavailable
from app.state.link import Call
from app.state.scripts import Script

LEASE = Script.of("app.limits", "lease.lua")
POLL_SEC = 0.05
LEASE_TTL_MS = 15_000
_EWMA = 0.2


class KeySlots(Protocol):
    shared: bool

    async def take(self, key: str, limit: int, lease: str) -> bool: ...

    async def give_back(self, key: str, lease: str) -> None: ...

    def release(self, key: str, lease: str) -> Coroutine[Any, Any, None] | None:
        """Give a lease back: at once when it is counted here (None), else the
        coroutine that gives it back, for the lifecycle owner to run."""
        ...

    async def renew(self, held: dict[str, list[str]]) -> None: ...

    async def save_cap(self, key: str, cap: int) -> None: ...

    async def drop_cap(self, key: str) -> None: ...

    async def load_caps(self) -> dict[str, int] | None: ...


class LocalSlots:
    """Slots counted in this process (no Redis)."""

    shared = False

    def __init__(self) -> None:
        self.held: dict[str, set[str]] = {}

    async def take(self, key: str, limit: int, lease: str) -> bool:
        return self.take_now(key, limit, lease)

    def take_now(self, key: str, limit: int, lease: str) -> bool:
        held = self.held.setdefault(key, set())
        if len(held) >= limit:
            return False
        held.add(lease)
        return True

    async def give_back(self, key: str, lease: str) -> None:
        self.give_back_now(key, lease)

    def release(self, key: str, lease: str) -> Coroutine[Any, Any, None] | None:
        self.give_back_now(key, lease)
        return None

    def give_back_now(self, key: str, lease: str) -> None:
        held = self.held.get(key)
        if held is not None:
            held.discard(lease)
            if not held:
                del self.held[key]

    async def renew(self, held: dict[str, list[str]]) -> None:
        """Nothing expires in-process."""

    async def save_cap(self, key: str, cap: int) -> None:
        """Nothing to share: the gate's own overrides are the only copy."""

    async def drop_cap(self, key: str) -> None:
        """Nothing shared to drop."""

    async def load_caps(self) -> dict[str, int] | None:
        return {}


class Calls(Protocol):
    """The shared-state engine (`app/state/redis_engine.py`), as the slots use it."""

    async def call(self, call: Call) -> Any | None: ...


class SharedSlots:
    """Slots shared by every replica through Redis (`lease.lua`, run by the engine);
    a lease taken while Redis was unreachable is counted and released locally."""

    shared = True

    def __init__(self, engine: Calls, prefix: str) -> None:
        self.engine = engine
        self.prefix = prefix
        self.local = LocalSlots()

    async def lease(self, key: str, args: list[Any]) -> Any | None:
        """One step of `lease.lua`; None when Redis did not answer (the caller then
        counts this replica's own)."""
        return await self.engine.call(Call(LEASE, (key,), tuple(args)))

    def _key(self, key: str) -> str:
        return f"{self.prefix}conc:{{{key}}}"

    async def take(self, key: str, limit: int, lease: str) -> bool:
        got = await self.lease(self._key(key), ["take", limit, LEASE_TTL_MS, lease])
        if got is None:
            return self.local.take_now(key, limit, lease)
        return bool(int(got))

    async def give_back(self, key: str, lease: str) -> None:
        if lease in self.local.held.get(key, ()):
            self.local.give_back_now(key, lease)
            return
        await self.lease(self._key(key), ["release", lease])

    def release(self, key: str, lease: str) -> Coroutine[Any, Any, None] | None:
        if lease in self.local.held.get(key, ()):
            self.local.give_back_now(key, lease)
            return None
        return self.give_back(key, lease)

    async def renew(self, held: dict[str, list[str]]) -> None:
        for key, leases in held.items():
            shared = [x for x in leases if x not in self.local.held.get(key, ())]
            if shared:
                await self.lease(self._key(key), ["renew", LEASE_TTL_MS, *shared])

    async def save_cap(self, key: str, cap: int) -> None:
        await self.lease(f"{self.prefix}concurrency", ["setcap", key, cap])

    async def drop_cap(self, key: str) -> None:
        await self.lease(f"{self.prefix}concurrency", ["dropcap", key])

    async def load_caps(self) -> dict[str, int] | None:
        """Live caps set on any replica; None while Redis is unreachable (keep the ones
        known: an outage clears nothing)."""
        raw = await self.lease(f"{self.prefix}concurrency", ["caps"])
        if raw is None:
            return None
        pairs = list(raw)
        return {str(k): int(v) for k, v in zip(pairs[::2], pairs[1::2], strict=True)}


class Lease:
    __slots__ = ("_gate", "ident", "key", "released", "since")

    def __init__(self, gate: ConcurrencyGate, key: str, ident: str, since: float) -> None:
        self._gate, self.key, self.ident, self.since = gate, key, ident, since
        self.released = False

    def release(self) -> None:
        """Free the slot (idempotent); never awaited, so it is safe while cancelling."""
        if not self.released:
            self.released = True
            self._gate._release(self)


class _Line:
    """A key's waiting requests (FIFO) and how long its requests hold a slot."""

    __slots__ = ("hold", "waiters")

    def __init__(self) -> None:
        self.waiters: deque[asyncio.Event] = deque()
        self.hold = 1.0  # seconds, EWMA


Spawn = Callable[[Any], None]


class ConcurrencyGate:
    def __init__(
        self, slots: KeySlots, spawn: Spawn, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.slots = slots
        self.spawn = spawn
        self.clock = clock
        self.lines: dict[str, _Line] = {}
        self.held: dict[str, dict[str, Lease]] = {}
        self.overrides: dict[str, int] = {}  # live caps (admin API), by key alias
        self._ids = itertools.count()
        self._prefix = f"{os.getpid()}-{os.urandom(3).hex()}-"

    def waiting(self, key: str) -> int:
        line = self.lines.get(key)
        return len(line.waiters) if line else 0

    async def acquire(self, key: str, limit: int, max_wait: float) -> tuple[Lease, float]:
        """A lease on one of the key's `limit` slots, and the seconds waited for it."""
        started = self.clock()
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = _Line()
        ident = self._prefix + str(next(self._ids))
        if not line.waiters and await self._take(key, limit, ident):
            return self._lease(key, ident), 0.0
        ready = asyncio.Event()
        line.waiters.append(ready)
        deadline = started + max_wait
        try:
            while True:
                if line.waiters[0] is ready and await self._take(key, limit, ident):
                    break
                left = deadline - self.clock()
                if left <= 0:
                    raise self._timeout(key, limit, max_wait, line)
                ready.clear()
                poll = min(left, POLL_SEC) if self.slots.shared else left
                try:
                    async with asyncio.timeout(poll):
                        await ready.wait()
                except TimeoutError:
                    pass
        finally:
            line.waiters.remove(ready)
            if line.waiters:
                line.waiters[0].set()  # the next in line tries (there may be room for it)
        return self._lease(key, ident), self.clock() - started

    async def _take(self, key: str, limit: int, ident: str) -> bool:
        try:
            return await self.slots.take(key, limit, ident)
        except asyncio.CancelledError:  # the lease may have been taken: give it back
            if self.slots.shared:
                self.spawn(self.slots.give_back(key, ident))
            raise

    def _lease(self, key: str, ident: str) -> Lease:
        lease = Lease(self, key, ident, self.clock())
        self.held.setdefault(key, {})[ident] = lease
        return lease

    def _release(self, lease: Lease) -> None:
        key = lease.key
        held = self.held.get(key)
        if held is not None:
            held.pop(lease.ident, None)
            if not held:
                del self.held[key]
        line = self.lines.get(key)
        if line is not None:
            line.hold += _EWMA * (self.clock() - lease.since - line.hold)
        if (giving_back := self.slots.release(key, lease.ident)) is not None:
            self.spawn(giving_back)
        if line is not None and line.waiters:
            line.waiters[0].set()
        elif line is not None and key not in self.held:
            del self.lines[key]

    def _timeout(self, key: str, limit: int, max_wait: float, line: _Line) -> ServiceUnavailable:
        ahead = len(line.waiters)
        retry = min(60.0, max(0.5, line.hold * ahead / limit))
        return ServiceUnavailable(
            f"key '{key}' has {limit} requests in flight (its max_concurrent) and this one "
            f"waited longer than max_queue_wait_ms ({int(max_wait * 1000)} ms) for one to end",
            code="queue_timeout",
            retry_after=retry,
            should_retry=True,
        )

    def cap(self, key: str, configured: int | None) -> int | None:
        return self.overrides.get(key, configured)

    async def set_cap(self, key: str, cap: int) -> None:
        """A live cap (admin API), shared with every replica when the slots are."""
        self.overrides[key] = cap
        await self.slots.save_cap(key, cap)

    async def clear_cap(self, key: str) -> int | None:
        """Drop a live cap (the files' `max_concurrent` again), on every replica when
        the slots are shared; returns the cap that was cleared."""
        cleared = self.overrides.pop(key, None)
        await self.slots.drop_cap(key)
        return cleared

    async def housekeeping(self) -> None:
        """Once a second: keep this process's shared leases alive, learn live caps."""
        if not self.slots.shared:
            return
        if self.held:
            await self.slots.renew({k: list(v) for k, v in self.held.items()})
        caps = await self.slots.load_caps()
        if caps is not None:  # the whole table: a cap cleared on another replica goes too
            self.overrides = caps
