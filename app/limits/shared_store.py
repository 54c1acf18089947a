"""Per-key limits shared by every replica: the limit store as a client of the engine.

Within a round trip (`app/state/redis_engine.py`), the reservations of one key are one
`token_bucket.lua` call that also carries the key's settled usage since the last call.
A reservation is exact (decided in Redis, in order, against the shared buckets); a
settle reaches Redis with the key's next reservation or within `SETTLE_LAG` seconds.
While Redis does not answer, each replica enforces its share (`outage.py`, fail open)
and charges what it admitted to the shared buckets when Redis is back, or refuses with
503 `redis_unavailable` (fail closed).

The rest of what the gateway asks of a store (lifecycle, heartbeat, health, replicas)
is the engine's; the store hands out the engine's other clients: a domain's pacer
(`shared_pace.py`), keys' concurrency slots (`concurrency.py`) and the budget script
(`app/billing/shared_spend.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.billing.shared_spend import BUDGET
from app.config.schema import RedisConfig
from app.errors import ServiceUnavailable
from app.limits.bucket import Decision, Limits, Remaining
from app.limits.concurrency import LEASE, KeySlots, SharedSlots
from app.limits.constants import BUCKET_LUA, values
from app.limits.outage import Clock, Fallback
from app.limits.pacing import Pacer, PaceState
from app.limits.shared_pace import PACE_SCRIPT, PaceBookings, RedisPacer
from app.state.link import Call, connect
from app.state.redis_engine import Pending, RedisEngine, RedisState, Spawn, Unanswered
from app.state.scripts import Script

log = logging.getLogger("tokengate.redis")
BUCKET = Script.of("app.limits", "token_bucket.lua", values(BUCKET_LUA))
_LIMIT_NAMES = {0: None, 1: "requests", 2: "tokens"}


@dataclass(slots=True)
class _Bucket:
    """One `token_bucket.lua` call: a key's settled usage, then its reservations."""

    store: SharedStore
    key: str
    limits: Limits
    tokens: int = 0
    requests: int = 0
    costs: list[int] = field(default_factory=list)
    waiters: list[asyncio.Future[list[int]]] = field(default_factory=list)

    def call(self) -> Call:
        prefix = self.store.engine.prefix
        keys = (f"{prefix}rl:{{{self.key}}}:requests", f"{prefix}rl:{{{self.key}}}:tokens")
        head = (*self.limits, self.tokens, self.requests)
        return Call(BUCKET, keys, (*head, *self.costs))

    def deliver(self, result: Any) -> None:
        decided = [int(v) for v in result]  # checked whole before anyone is answered
        if len(decided) != 7 * len(self.waiters):
            raise ValueError(f"token_bucket.lua answered {len(decided)} fields")
        for i, waiter in enumerate(self.waiters):
            raw = decided[7 * i : 7 * i + 7]
            if not waiter.cancelled():
                waiter.set_result(raw)
            elif raw[0]:  # admitted for a request that left meanwhile: refund it
                self.store.settle(self.key, self.limits, -self.costs[i], -1)

    def fail(self) -> None:
        """Waiters learn Redis did not answer; the settled usage stays pending."""
        if self.tokens or self.requests:
            self.store._add_settle(self.key, self.limits, self.tokens, self.requests)
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_exception(Unanswered())


class SharedStore:
    shared = True

    def __init__(self, engine: RedisEngine, *, clock: Clock = time.monotonic) -> None:
        self.engine = engine
        self.fallback = Fallback(clock, engine.assumed)
        self.paces = PaceBookings(engine)
        self._buckets: dict[tuple[str, Limits], _Bucket] = {}
        self._settles: dict[str, _Bucket] = {}
        engine.attach(self, BUCKET, BUDGET, LEASE)
        engine.attach(self.paces, PACE_SCRIPT)

    @classmethod
    def from_config(
        cls,
        cfg: RedisConfig,
        *,
        spawn: Spawn,
        on_state: Callable[[RedisState], None] | None,
        replica: str | None = None,
    ) -> SharedStore:
        engine = RedisEngine(
            connect(cfg),
            spawn=spawn,
            fail_mode=cfg.fail_mode,
            prefix=cfg.key_prefix,
            assumed_replicas=cfg.assumed_replicas,
            on_state=on_state,
            replica=replica,
        )
        return cls(engine)

    # -- reserve and settle ----------------------------------------------------------------
    async def reserve(self, key: str, limits: Limits, cost: int) -> Decision:
        engine = self.engine
        if engine.usable:
            waiter = self._enqueue_reserve(key, limits, cost)
            try:
                raw = await waiter
            except Unanswered:
                pass
            else:
                decision = _decision(raw, limits)
                self.fallback.seen(key, decision)
                return decision
        if engine.fail_mode == "closed":
            raise ServiceUnavailable(
                "shared rate-limit store (Redis) is unreachable; retry shortly",
                code="redis_unavailable",
                retry_after=1.0,
                should_retry=True,
            )
        decision = self.fallback.reserve(key, limits, cost)
        if engine.up:
            # One call failed, but Redis is not (yet) taken for down (a timeout, counted):
            # decided at this replica's share, charged to Redis at once, nothing kept local.
            self._charge(self.fallback.recover(lost=False))
        return decision

    def settle(self, key: str, limits: Limits, token_delta: int, request_delta: int) -> None:
        """Record it; Redis gets it with the key's next reservation or within SETTLE_LAG."""
        if not self.engine.usable:
            self.fallback.settle(key, limits, token_delta, request_delta)
            return
        self._add_settle(key, limits, token_delta, request_delta)
        self.engine.kick_later()

    def _charge(self, charges: dict[str, tuple[Limits, int, int]]) -> None:
        for key, (limits, tokens, requests) in charges.items():
            self._add_settle(key, limits, tokens, requests)

    def _add_settle(self, key: str, limits: Limits, tokens: int, requests: int) -> None:
        pending = self._settles.get(key)
        if pending is None:
            self._settles[key] = _Bucket(self, key, limits, tokens, requests)
        else:
            pending.limits = limits
            pending.tokens += tokens
            pending.requests += requests

    def _enqueue_reserve(self, key: str, limits: Limits, cost: int) -> asyncio.Future[list[int]]:
        group = self._buckets.get((key, limits))
        if group is None:
            group = self._buckets[(key, limits)] = _Bucket(self, key, limits)
        waiter: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        group.costs.append(cost)
        group.waiters.append(waiter)
        self.engine.kick()
        return waiter

    # -- the engine's feeder ---------------------------------------------------------------
    def take(self) -> list[Pending]:
        """Reservations of a key carry its pending settle; settles alone go as they are."""
        batch: list[Pending] = []
        settles, self._settles = self._settles, {}
        for group in self._buckets.values():
            pending = settles.pop(group.key, None)
            if pending is not None:
                group.tokens, group.requests = pending.tokens, pending.requests
            batch.append(group)
        batch += settles.values()
        self._buckets = {}
        return batch

    def urgent(self) -> bool:
        return bool(self._buckets)

    def lazy(self) -> bool:
        return bool(self._settles)

    def heard(self, replicas: int, back: bool, lost: bool) -> None:
        """Redis answers again: what this replica admitted meanwhile is charged (sent in
        the round trip the engine starts at once)."""
        self.fallback.replicas = replicas
        if back:
            charges = self.fallback.recover(lost)
            self._charge(charges)
            if charges:
                log.warning(
                    "%d keys charged what this replica admitted while Redis was away", len(charges)
                )

    # -- the rest of the store interface: the engine's, and its other clients ------------------
    def peek(self, key: str, limits: Limits) -> Remaining | None:
        """Only while this replica enforces its share (fail open) does it know a key's
        buckets without asking; otherwise they are in Redis, not read per page."""
        if not self.engine.usable and self.engine.fail_mode == "open":
            return self.fallback.peek(key)
        return None

    def pacer(self, domain: str, state: PaceState) -> Pacer:
        return RedisPacer(self.paces, f"{self.engine.prefix}pace:{{{domain}}}", state)

    def key_slots(self) -> KeySlots:
        return SharedSlots(self.engine, self.engine.prefix)

    async def budget(self, keys: Sequence[str], args: Sequence[object]) -> Any | None:
        """One call of `budget.lua` (app/billing/shared_spend.py), in the next round trip;
        None when Redis did not answer (the budgets are then decided per replica)."""
        return await self.engine.call(Call(BUDGET, tuple(keys), tuple(args)))

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    async def housekeeping(self) -> None:
        """The engine's heartbeat. Live per-key limits are the database's
        (`app/db/overrides.py`), not a store's."""
        await self.engine.housekeeping()

    async def replicas(self) -> dict[str, float]:
        return await self.engine.replica_set()

    def health(self) -> dict[str, object]:
        return self.engine.health()

    def refusing(self) -> bool:
        return self.engine.refusing()

    def describe(self) -> dict[str, object]:
        return self.engine.describe()


def _decision(raw: list[int], limits: Limits) -> Decision:
    allowed, limit, retry_ms, r_left, r_reset, t_left, t_reset = raw
    return Decision(
        allowed=bool(allowed),
        limit=_LIMIT_NAMES[limit],
        retry_after=float("inf") if retry_ms < 0 else retry_ms / 1000,
        requests_limit=limits.requests_per_minute,
        requests_remaining=r_left,
        requests_reset=r_reset / 1000,
        tokens_limit=limits.tokens_per_minute,
        tokens_remaining=t_left,
        tokens_reset=t_reset / 1000,
        too_large=retry_ms < 0,
    )
