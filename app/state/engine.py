"""Limits shared by every replica through Redis, at a fraction of a round trip each.

Group commit: whatever this process wants from Redis while a round trip is in flight
goes in the next one, as one pipeline (`_flush`). Within it, the reservations of one key
are one `token_bucket.lua` call that also carries the key's settled usage since the last
call; a domain's pace bookings are one `pace.lua` call. Under load a round trip serves
dozens of requests; at rest a request still costs one, with nothing added to wait for.
A reservation is exact (decided in Redis, in order, against the shared buckets); a
settle reaches Redis with the key's next reservation or within `SETTLE_LAG` seconds.

States (`health`, `/health/ready`, the `tokengate_redis_*` gauges):
- `shared`: the above;
- `degraded` (Redis unreachable, fail open): each replica enforces limits and paces
  domains at its share (`app/limits/outage.py`), and charges what it admitted to the
  shared buckets when Redis is back;
- `refusing` (unreachable, fail closed): admissions answer 503 `redis_unavailable`;
- `misconfigured`: Redis answered MOVED / ASK / CROSSSLOT (a Cluster reached as one
  server): logged once as an error, served by the fail mode until a restart with a
  fixed configuration. Never taken for an outage, so it never flaps.
A refused connection is an outage at once; a timeout or an unexpected error counts
only three in a row. While down nothing but the once-a-second heartbeat
(`housekeeping`) touches Redis, and the first one that answers ends the outage.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from app.config.schema import RedisConfig
from app.errors import ServiceUnavailable
from app.limits.bucket import Decision, Limits, Remaining
from app.limits.concurrency import KeySlots, SharedSlots
from app.limits.constants import REPLICA_WINDOW_MS
from app.limits.outage import Clock, Fallback
from app.limits.pacing import Pacer, PaceState
from app.limits.redis_conn import Call, Failure, RedisLink, classify, connect, describe
from app.limits.shared_pace import RedisPacer
from app.limits.store import Spawn

log = logging.getLogger("tokengate.redis")
SETTLE_LAG = 0.005  # seconds a settle may wait for a reservation of its key to ride on
_SLOW_TO_DOWN = 3
_LIMIT_NAMES = {0: None, 1: "requests", 2: "tokens"}


class RedisState(NamedTuple):
    """What the gauges show: reachable, limits enforced per replica, misconfigured, and
    the replicas seen alive (the divisor of an outage)."""

    up: bool
    degraded: bool
    misconfigured: bool
    replicas: int


class _Unavailable(Exception):
    """A call that Redis did not answer: the caller serves it by the fail mode."""


@dataclass(slots=True)
class _Bucket:
    """One `token_bucket.lua` call: a key's settled usage, then its reservations."""

    key: str
    limits: Limits
    tokens: int = 0
    requests: int = 0
    costs: list[int] = field(default_factory=list)
    waiters: list[asyncio.Future[list[int]]] = field(default_factory=list)


@dataclass(slots=True)
class _Pace:
    """One `pace.lua` reserve call: a domain's bookings, in order."""

    key: str
    head: tuple[Any, ...]
    pairs: list[int] = field(default_factory=list)
    waiters: list[asyncio.Future[list[Any]]] = field(default_factory=list)


_Op = tuple[Call, "asyncio.Future[Any]"]


class RedisStore:
    shared = True

    def __init__(
        self,
        link: RedisLink,
        *,
        spawn: Spawn,
        fail_mode: str = "open",
        prefix: str = "tokengate:",
        assumed_replicas: int = 1,
        on_state: Callable[[RedisState], None] | None = None,
        clock: Clock = time.monotonic,
        replica: str | None = None,
    ) -> None:
        self.link = link
        self.fail_mode = fail_mode
        self.prefix = prefix
        self.up = True
        self.misconfigured: str | None = None
        self.fallback = Fallback(clock, assumed_replicas)
        # This process in the replica set (the status page names replicas by it).
        self.replica_id = replica or f"{socket.gethostname()}:{os.getpid()}"
        self._spawn = spawn
        self._on_state = on_state
        self._slow = 0  # consecutive timeouts / unexpected errors
        self._epoch: str | None = None
        self._bugs: set[str] = set()  # unexpected errors already logged (with traceback)
        self._buckets: dict[tuple[str, Limits], _Bucket] = {}
        self._settles: dict[str, _Bucket] = {}
        self._paces: dict[tuple[str, tuple[Any, ...]], _Pace] = {}
        self._ops: list[_Op] = []
        self._flushing = False
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def from_config(
        cls,
        cfg: RedisConfig,
        *,
        spawn: Spawn,
        on_state: Callable[[RedisState], None] | None,
        replica: str | None = None,
    ) -> RedisStore:
        return cls(
            connect(cfg),
            spawn=spawn,
            fail_mode=cfg.fail_mode,
            prefix=cfg.key_prefix,
            assumed_replicas=cfg.assumed_replicas,
            on_state=on_state,
            replica=replica,
        )

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self.link.start()
        except Exception as exc:
            self._failed(exc, outage=True)
            return
        log.info("shared limits in Redis: %s", self.link.target.where())
        await self._heartbeat_now()

    async def close(self) -> None:
        """Hand Redis what is still pending (the last settles), leave, disconnect."""
        if self._timer is not None:
            self._timer.cancel()
        if self.usable and self._has_work():
            await self._send(self._take())
        if self.usable:
            try:
                await self.link.run([self._heartbeat_call("leave")])
            except Exception as exc:
                log.debug("leaving the replica set failed: %s", describe(exc))
        await self.link.close()

    # -- the store interface -----------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return self.up and self.misconfigured is None

    async def reserve(self, key: str, limits: Limits, cost: int) -> Decision:
        if self.usable:
            waiter = self._enqueue_reserve(key, limits, cost)
            try:
                raw = await waiter
            except _Unavailable:
                pass
            else:
                decision = _decision(raw, limits)
                self.fallback.seen(key, decision)
                return decision
        if self.fail_mode == "closed":
            raise ServiceUnavailable(
                "shared rate-limit store (Redis) is unreachable; retry shortly",
                code="redis_unavailable",
                retry_after=1.0,
                should_retry=True,
            )
        decision = self.fallback.reserve(key, limits, cost)
        if self.up:
            # One call failed, but Redis is not (yet) taken for down (a timeout, counted):
            # decided at this replica's share, charged to Redis at once, nothing kept local.
            self._charge(self.fallback.recover(lost=False))
        return decision

    def _charge(self, charges: dict[str, tuple[Limits, int, int]]) -> None:
        for key, (limits, tokens, requests) in charges.items():
            self._add_settle(key, limits, tokens, requests)

    def settle(self, key: str, limits: Limits, token_delta: int, request_delta: int) -> None:
        """Record it; Redis gets it with the key's next reservation or within SETTLE_LAG."""
        if not self.usable:
            self.fallback.settle(key, limits, token_delta, request_delta)
            return
        self._add_settle(key, limits, token_delta, request_delta)
        if not self._flushing and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(SETTLE_LAG, self._kick)

    def _add_settle(self, key: str, limits: Limits, tokens: int, requests: int) -> None:
        pending = self._settles.get(key)
        if pending is None:
            self._settles[key] = _Bucket(key, limits, tokens, requests)
        else:
            pending.limits = limits
            pending.tokens += tokens
            pending.requests += requests

    def _enqueue_reserve(self, key: str, limits: Limits, cost: int) -> asyncio.Future[list[int]]:
        group = self._buckets.get((key, limits))
        if group is None:
            group = self._buckets[(key, limits)] = _Bucket(key, limits)
        waiter: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        group.costs.append(cost)
        group.waiters.append(waiter)
        self._kick()
        return waiter

    async def pace(self, key: str, args: list[Any]) -> list[Any] | None:
        """One step of `pace.lua`; None when Redis did not answer (the pacer then paces
        alone, at its share). Bookings of one domain that meet in a round trip are one
        call."""
        if not self.usable:
            return None
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[list[Any]] = loop.create_future()
        if args[0] == "reserve":
            head = tuple(args[:5])
            group = self._paces.get((key, head))
            if group is None:
                group = self._paces[(key, head)] = _Pace(key, head)
            group.pairs += args[5:7]
            group.waiters.append(waiter)
        else:
            self._ops.append((Call("pace.lua", (key,), tuple(args)), waiter))
        self._kick()
        try:
            return await waiter
        except _Unavailable:
            return None

    def pacer(self, domain: str, state: PaceState) -> Pacer:
        return RedisPacer(self, f"{self.prefix}pace:{{{domain}}}", state)

    async def budget(self, keys: Sequence[str], args: Sequence[object]) -> Any | None:
        """One call of `budget.lua` (app/limits/shared_spend.py), in the next round trip;
        None when Redis did not answer (the budgets are then decided per replica)."""
        return await self._op(Call("budget.lua", tuple(keys), tuple(args)))

    def key_slots(self) -> KeySlots:
        return SharedSlots(self, self.prefix)

    async def lease(self, key: str, args: list[Any]) -> Any:
        """One step of `lease.lua` (per-key concurrency leases and live caps), in the next
        round trip; None when Redis did not answer (the caller then counts this replica's
        own)."""
        return await self._op(Call("lease.lua", (key,), tuple(args)))

    async def _op(self, call: Call) -> Any | None:
        """One call in the group commit's next round trip; None if Redis did not answer."""
        if not self.usable:
            return None
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._ops.append((call, waiter))
        self._kick()
        try:
            return await waiter
        except _Unavailable:
            return None

    @property
    def divisor(self) -> int:
        """Replicas sharing the limits: what a pacer divides its quota by while alone."""
        return self.fallback.divisor

    # -- the group commit ---------------------------------------------------------------------
    def _has_work(self) -> bool:
        return bool(self._buckets or self._paces or self._ops or self._settles)

    def _kick(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._flushing and self._has_work():
            self._flushing = True
            self._spawn(self._flush())

    async def _flush(self) -> None:
        """Round trips back to back while reservations keep coming; settles alone wait
        (up to SETTLE_LAG) for a reservation of their key to ride on."""
        try:
            while True:
                if not self.usable:
                    self._fail(self._take(keep_settles=True))
                    break
                await self._send(self._take())
                if not (self._buckets or self._paces or self._ops):
                    break
        finally:
            self._flushing = False
            if self._settles and self.usable and self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(SETTLE_LAG, self._kick)

    def _take(self, keep_settles: bool = False) -> list[_Bucket | _Pace | _Op]:
        batch: list[_Bucket | _Pace | _Op] = []
        settles = {} if keep_settles else self._settles
        if not keep_settles:
            self._settles = {}
        for group in self._buckets.values():
            pending = settles.pop(group.key, None)
            if pending is not None:
                group.tokens, group.requests = pending.tokens, pending.requests
            batch.append(group)
        batch += settles.values()
        batch += self._paces.values()
        batch += self._ops
        self._buckets, self._paces, self._ops = {}, {}, []
        return batch

    async def _send(self, batch: list[_Bucket | _Pace | _Op]) -> None:
        try:
            results = await self.link.run([self._call(item) for item in batch])
        except BaseException as exc:  # anything at all: no waiter is left hanging
            self._fail(batch)
            if not isinstance(exc, Exception):
                raise
            self._failed(exc)
            return
        failed = False
        for item, result in zip(batch, results, strict=True):
            try:
                if isinstance(result, Exception):
                    raise result
                self._deliver(item, result)
            except Exception as exc:  # its own error, or an answer that makes no sense
                failed = True
                self._fail([item])
                self._failed(exc)
        if not failed:
            self._slow = 0

    def _call(self, item: _Bucket | _Pace | _Op) -> Call:
        if isinstance(item, _Bucket):
            keys = (
                f"{self.prefix}rl:{{{item.key}}}:requests",
                f"{self.prefix}rl:{{{item.key}}}:tokens",
            )
            head = (*item.limits, item.tokens, item.requests)
            return Call("token_bucket.lua", keys, (*head, *item.costs))
        if isinstance(item, _Pace):
            return Call("pace.lua", (item.key,), (*item.head, *item.pairs))
        return item[0]

    def _deliver(self, item: _Bucket | _Pace | _Op, result: Any) -> None:
        if isinstance(item, _Bucket):
            decided = [int(v) for v in result]  # checked whole before anyone is answered
            if len(decided) != 7 * len(item.waiters):
                raise ValueError(f"token_bucket.lua answered {len(decided)} fields")
            for i, waiter in enumerate(item.waiters):
                raw = decided[7 * i : 7 * i + 7]
                if not waiter.cancelled():
                    waiter.set_result(raw)
                elif raw[0]:  # admitted for a request that left meanwhile: refund it
                    self.settle(item.key, item.limits, -item.costs[i], -1)
        elif isinstance(item, _Pace):
            first, *rest = result
            for wait, booked in zip(str(first).split(","), item.waiters, strict=True):
                if not booked.cancelled():
                    booked.set_result([wait, *rest])
        elif not item[1].cancelled():
            item[1].set_result(result)

    def _fail(self, batch: list[_Bucket | _Pace | _Op]) -> None:
        """Waiters learn Redis did not answer; settles stay pending (charged later)."""
        for item in batch:
            waiters: list[asyncio.Future[Any]]
            if isinstance(item, _Bucket):
                if item.tokens or item.requests:
                    self._add_settle(item.key, item.limits, item.tokens, item.requests)
                waiters = list(item.waiters)
            elif isinstance(item, _Pace):
                waiters = list(item.waiters)
            else:
                waiters = [item[1]]
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(_Unavailable())

    # -- failures and recovery -------------------------------------------------------------------
    def _failed(self, exc: BaseException, *, outage: bool = False) -> None:
        kind = classify(exc)
        if kind is Failure.CONFIG:
            self._misconfigured(exc)
            return
        if kind is Failure.BUG and type(exc).__name__ not in self._bugs:
            self._bugs.add(type(exc).__name__)
            log.error(
                "unexpected error from Redis or its client (served by the fail mode; "
                "logged once per kind): %s",
                describe(exc),
                exc_info=exc,
            )
        if kind is Failure.DOWN or outage:
            self._mark_down(exc)
            return
        self._slow += 1
        if self._slow >= _SLOW_TO_DOWN:
            self._mark_down(exc)

    def _misconfigured(self, exc: BaseException) -> None:
        if self.misconfigured is None:
            self.misconfigured = describe(exc)
            log.error(
                "REDIS MISCONFIGURED: %s answered %s. A Redis Cluster must be configured as "
                "one (redis.cluster = true or a redis+cluster:// URL). Until a restart with "
                "a fixed configuration, limits are %s.",
                self.link.target.where(),
                self.misconfigured,
                "enforced per replica (fail open)"
                if self.fail_mode == "open"
                else "refused with 503 (fail closed)",
            )
            self._publish()

    def _mark_down(self, exc: BaseException) -> None:
        if self.up:
            n = self.fallback.divisor
            log.warning(
                "redis unreachable (%s); fail mode %s: %s",
                describe(exc),
                self.fail_mode,
                f"each replica enforces 1/{n} of every limit and domain quota "
                f"({n} replicas seen in the last minute) until it returns"
                if self.fail_mode == "open"
                else "requests refused with 503 until it returns",
            )
        self.up = False
        self._slow = 0
        self._publish()

    async def _heartbeat_now(self) -> bool:
        """One heartbeat, sent at once (outside the group commit): how the outage ends."""
        try:
            (result,) = await self.link.run([self._heartbeat_call("beat")])
            if isinstance(result, Exception):
                raise result
            self._beat(result)
        except Exception as exc:
            self._failed(exc, outage=True)
            return False
        return True

    def _heartbeat_call(self, op: str) -> Call:
        keys = (self._replicas_key, f"{self._replicas_key}:epoch")
        return Call("replicas.lua", keys, (op, self.replica_id, secrets.token_hex(8)))

    @property
    def _replicas_key(self) -> str:
        return f"{self.prefix}{{replicas}}"

    async def replicas(self) -> dict[str, float]:
        """Every process whose heartbeat Redis saw in the last minute, and when (unix
        seconds, Redis's clock): the status page's list of replicas."""
        if not self.usable:
            return {}
        call = Call(None, (), ("ZRANGE", self._replicas_key, 0, -1, "WITHSCORES"))
        try:
            (raw,) = await self.link.run([call])
            if isinstance(raw, Exception):
                raise raw
            pairs = _pairs(raw)
        except Exception as exc:
            self._failed(exc)
            return {}
        cutoff = time.time() - REPLICA_WINDOW_MS / 1000
        seen = {str(name): float(ms) / 1000 for name, ms in pairs}
        return {name: at for name, at in seen.items() if at >= cutoff}

    def peek(self, key: str, limits: Limits) -> Remaining | None:
        """Only while this replica enforces its share (fail open) does it know a key's
        buckets without asking; otherwise they are in Redis, not read per page."""
        if not self.usable and self.fail_mode == "open":
            return self.fallback.peek(key)
        return None

    def _beat(self, result: list[Any]) -> None:
        count, epoch = int(result[0]), str(result[1])
        lost = self._epoch is not None and epoch != self._epoch
        self._epoch = epoch
        self.fallback.replicas = count
        if not self.up:
            charges = self.fallback.recover(lost)
            self._charge(charges)
            log.warning(
                "redis reachable again; shared limits restored (%d keys charged what this "
                "replica admitted meanwhile%s)",
                len(charges),
                "; Redis had lost its data" if lost else "",
            )
            self.up = True
            self._kick()
        self._publish()

    async def housekeeping(self) -> None:
        """Once a second: the heartbeat (the live replica count; while down, the probe
        that ends the outage), in the group commit's next round trip. Live per-key limits
        are the database's (`app/db/overrides.py`), not a store's."""
        if self.misconfigured is not None:
            return
        if not self.up:
            await self._heartbeat_now()
            return
        beat: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._ops.append((self._heartbeat_call("beat"), beat))
        self._kick()
        try:
            self._beat(await beat)
        except _Unavailable:
            pass
        except Exception as exc:  # an answer that makes no sense: a failure like any
            self._failed(exc)

    # -- small shared values (the Responses API's response id -> domain map) --------------------
    async def _command(self, *args: Any) -> Any:
        """One plain command in the group commit's next round trip; None when Redis did
        not answer (the callers take that as a miss)."""
        if not self.usable:
            return None
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._ops.append((Call(None, (), args), waiter))
        self._kick()
        try:
            return await waiter
        except _Unavailable:
            return None

    async def put_text(self, name: str, value: str, ttl_sec: float) -> None:
        """SET with a TTL; dropped while Redis is unreachable (a later read then misses)."""
        await self._command("SET", f"{self.prefix}{name}", value, "PX", int(ttl_sec * 1000))

    async def get_text(self, name: str) -> str | None:
        """The value, or None if absent, expired or Redis is unreachable."""
        value = await self._command("GET", f"{self.prefix}{name}")
        return None if value is None else str(value)

    async def delete_text(self, name: str) -> None:
        await self._command("DEL", f"{self.prefix}{name}")

    # -- what the gateway shows -----------------------------------------------------------------
    def state(self) -> str:
        if self.misconfigured is not None:
            return "misconfigured"
        if self.up:
            return "shared"
        return "degraded" if self.fail_mode == "open" else "refusing"

    def _publish(self) -> None:
        if self._on_state is not None:
            degraded = not self.usable and self.fail_mode == "open"
            misconfigured = self.misconfigured is not None
            self._on_state(RedisState(self.up, degraded, misconfigured, self.fallback.replicas))

    def health(self) -> dict[str, object]:
        return {
            "redis": {
                "up": self.up,
                "fail_mode": self.fail_mode,
                "state": self.state(),
                "replicas": self.fallback.replicas,
                "divisor": 1 if self.usable else self.fallback.divisor,
            }
        }

    def refusing(self) -> bool:
        return not self.usable and self.fail_mode == "closed"

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {
            "kind": "redis",
            "where": self.link.target.where(),
            "shape": self.link.target.shape,
            "up": self.up,
            "state": self.state(),
            "fail_mode": self.fail_mode,
            "replicas": self.fallback.replicas,
        }
        if self.misconfigured is not None:
            out["error"] = self.misconfigured
        return out


def _pairs(raw: Any) -> list[tuple[Any, Any]]:
    """ZRANGE ... WITHSCORES as (member, score): RESP3 answers pairs, RESP2 a flat list."""
    items = list(raw)
    if items and isinstance(items[0], list | tuple):
        return [(a, b) for a, b in items]
    return list(zip(items[::2], items[1::2], strict=True))


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
