"""Limits shared by every replica through Redis.

One round trip per admission and one per settle: both are a single EVALSHA of
`token_bucket.lua` (loaded once; redis-py's `Script` re-sends it after a Redis
restart flushed the script cache). The usage ledger is not here: it is durable, in SQL
(`app/limits/ledger.py`), whatever the limit store.

Redis unreachable: the store marks itself down (metric `tokengate_redis_up 0`, one
warning line, `/health/ready` says so) and, per `redis.fail_mode`:
- `open`: admissions use this process's own buckets until it answers again;
- `closed`: admissions fail with 503 `redis_unavailable`.
Every call after `_RETRY_SEC` tries Redis again, and the gateway's probe loop pings
it, so recovery needs no restart.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout

from app.errors import ServiceUnavailable
from app.limits import lua
from app.limits.bucket import Decision, Limits, Remaining
from app.limits.concurrency import KeySlots, SharedSlots
from app.limits.pacing import Pacer, PaceState
from app.limits.shared_pace import RedisPacer
from app.limits.store import MemoryBuckets

log = logging.getLogger("tokengate.redis")
_RETRY_SEC = 1.0
_SLOW_TO_DOWN = 3
_LIMIT_NAMES = {0: None, 1: "requests", 2: "tokens"}
REPLICA_TTL_SEC = 60  # a replica silent this long drops off the status page's list


class RedisStore:
    synchronous = False
    shared = True

    def __init__(
        self,
        url: str,
        *,
        fail_mode: str = "open",
        prefix: str = "tokengate:",
        timeout_ms: int = 250,
        max_connections: int = 64,
        on_state: Any = None,
        replica: str | None = None,
    ) -> None:
        timeout = timeout_ms / 1000
        # A blocking pool: under a burst, callers wait (briefly) for a free connection
        # instead of failing with MaxConnectionsError, which would look like an outage.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=max(timeout, 1.0),
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            decode_responses=True,
        )
        self._client = aioredis.Redis(connection_pool=pool)
        self._script = self._client.register_script(lua.script("token_bucket.lua"))
        self._pace = self._client.register_script(lua.script("pace.lua"))
        self._lease = self._client.register_script(lua.script("lease.lua"))
        self.fail_mode = fail_mode
        self.prefix = prefix
        self.up = True
        self._down_since = 0.0
        self._local = MemoryBuckets()
        self._slow = 0  # consecutive timeouts
        self._on_state = on_state
        self.replica = replica  # our member of the `replicas` set (status page)

    # -- lifecycle --------------------------------------------------------------
    async def start(self) -> None:
        await self.probe()

    async def close(self) -> None:
        if await self.probe() and self.replica is not None:
            # a clean stop leaves the list at once; a crash ages out (REPLICA_TTL_SEC)
            await self._client.zrem(f"{self.prefix}replicas", self.replica)
        # The pool was passed in, so the client would leave its connections open.
        await self._client.aclose(close_connection_pool=True)

    async def probe(self) -> bool:
        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            self._mark_down(exc)
            return False
        await self._mark_up()
        return True

    def _failed(self, exc: BaseException) -> None:
        """A refused connection is an outage at once; a timeout may be this process's own
        event loop lagging under load, so only several in a row count as one. Either way
        this one call is served by the fail mode."""
        if isinstance(exc, RedisTimeout):
            self._slow += 1
            if self._slow < _SLOW_TO_DOWN:
                return
        self._mark_down(exc)

    def _mark_down(self, exc: BaseException) -> None:
        if self.up:
            log.warning(
                "redis unreachable (%s); fail mode %s: %s",
                type(exc).__name__,
                self.fail_mode,
                "limits enforced per process until it returns"
                if self.fail_mode == "open"
                else "requests refused with 503 until it returns",
            )
        self.up = False
        self._down_since = time.monotonic()
        if self._on_state is not None:
            self._on_state(False)

    async def _mark_up(self) -> None:
        was_down = not self.up
        if was_down:
            # Idle pooled connections predate the outage (a restarted Redis closed them):
            # drop them, or the first commands after recovery fail on dead sockets.
            await self._client.connection_pool.disconnect(inuse_connections=False)
            log.warning("redis reachable again; shared limits restored")
        self.up = True
        if self._on_state is not None:
            self._on_state(True)

    # -- keys ---------------------------------------------------------------------
    def _bucket_keys(self, key: str) -> list[str]:
        return [f"{self.prefix}rl:{{{key}}}:requests", f"{self.prefix}rl:{{{key}}}:tokens"]

    async def _call(self, keys: list[str], args: list[Any]) -> Any:
        return await self._script(keys=keys, args=args)

    def _available(self) -> bool:
        return self.up or time.monotonic() - self._down_since >= _RETRY_SEC

    # -- store interface --------------------------------------------------------------
    async def reserve(self, key: str, limits: Limits, cost: int) -> Decision:
        if self._available():
            try:
                raw = await self._call(
                    self._bucket_keys(key),
                    ["reserve", limits.requests_per_minute, limits.tokens_per_minute, cost],
                )
            except (RedisError, OSError) as exc:
                self._failed(exc)
            else:
                self._slow = 0
                if not self.up:
                    await self._mark_up()
                return _decision(raw, limits)
        if self.fail_mode == "closed":
            raise ServiceUnavailable(
                "shared rate-limit store (Redis) is unreachable; retry shortly",
                code="redis_unavailable",
                retry_after=_RETRY_SEC,
                should_retry=True,
            )
        return self._local.reserve(key, limits, cost)

    async def settle(self, key: str, limits: Limits, token_delta: int, request_delta: int) -> None:
        if self._available():
            args = [
                "settle",
                limits.requests_per_minute,
                limits.tokens_per_minute,
                token_delta,
                request_delta,
            ]
            try:
                await self._call(self._bucket_keys(key), args)
            except (RedisError, OSError) as exc:
                self._failed(exc)
            else:
                self._slow = 0
                return
        self._local.settle(key, limits, token_delta, request_delta)

    def settle_sync(self, key: str, limits: Limits, token_delta: int, request_delta: int) -> None:
        raise NotImplementedError("the Redis store settles asynchronously")

    async def save_override(self, key: str, limits: Limits) -> None:
        value = f"{limits.requests_per_minute},{limits.tokens_per_minute}"
        await self._client.hset(f"{self.prefix}limits", key, value)

    async def load_overrides(self) -> dict[str, Limits]:
        """Live limits set on any replica (admin API); polled every second by each."""
        try:
            raw = await self._client.hgetall(f"{self.prefix}limits")
        except (RedisError, OSError) as exc:
            self._mark_down(exc)
            return {}
        out = {}
        for key, value in raw.items():
            rpm, _, tpm = str(value).partition(",")
            out[str(key)] = Limits(int(rpm), int(tpm))
        return out

    async def housekeeping(self) -> dict[str, Limits]:
        """Down: try to reconnect. Up: read the live limits (both one round trip)."""
        if not self.up:
            await self.probe()
            return {}
        await self._heartbeat()
        return await self.load_overrides()

    async def _heartbeat(self) -> None:
        """Say this replica is alive (status page), and forget those long silent."""
        if self.replica is None:
            return
        now, key = time.time(), f"{self.prefix}replicas"
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zadd(key, {self.replica: now})
                pipe.zremrangebyscore(key, "-inf", now - REPLICA_TTL_SEC)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            self._mark_down(exc)

    async def replicas(self) -> dict[str, float]:
        if not self.up:
            return {}
        try:
            key = f"{self.prefix}replicas"
            raw: list[Any] = await self._client.zrange(key, 0, -1, withscores=True)
        except (RedisError, OSError) as exc:
            self._mark_down(exc)
            return {}
        cutoff = time.time() - REPLICA_TTL_SEC
        pairs = ((str(name), float(at)) for name, at in raw)
        return {name: at for name, at in pairs if at >= cutoff}

    def peek(self, key: str, limits: Limits) -> Remaining | None:
        """Only while Redis is down in `open` mode does this process know (its own
        buckets then decide); otherwise the buckets are in Redis, not read per page."""
        if not self.up and self.fail_mode == "open":
            return self._local.peek(key, limits)
        return None

    def health(self) -> dict[str, object]:
        return {"redis": {"up": self.up, "fail_mode": self.fail_mode}}

    def refusing(self) -> bool:
        return not self.up and self.fail_mode == "closed"

    def pacer(self, domain: str, state: PaceState) -> Pacer:
        return RedisPacer(self, f"{self.prefix}pace:{{{domain}}}", state)

    async def pace(self, key: str, args: list[Any]) -> list[Any] | None:
        """One step of `pace.lua`; None while Redis is unreachable (the caller then paces
        with its own state, as every replica alone)."""
        if not self._available():
            return None
        try:
            raw = await self._pace(keys=[key], args=args)
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None
        self._slow = 0
        if not self.up:
            await self._mark_up()
        return list(raw)

    def key_slots(self) -> KeySlots:
        return SharedSlots(self, self.prefix)

    async def lease(self, key: str, args: list[Any]) -> Any:
        """One step of `lease.lua` (per-key concurrency leases and live caps); None
        while Redis is unreachable (the caller then counts this replica's own)."""
        if not self._available():
            return None
        try:
            raw = await self._lease(keys=[key], args=args)
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None
        self._slow = 0
        return raw

    def describe(self) -> dict[str, object]:
        return {
            "kind": "redis",
            "up": self.up,
            "fail_mode": self.fail_mode,
        }


def _decision(raw: list[Any], limits: Limits) -> Decision:
    allowed, limit, retry_ms, r_left, r_reset, t_left, t_reset = (int(v) for v in raw)
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
