"""The shared-state engine: one Redis connection under every client that shares state.

    limits (shared_store.py)   pacer (shared_pace.py)   leases (concurrency.py)   spend
        │ feeder: buckets, settles  │ feeder: bookings       │ call()                │ call()
        ▼                           ▼                        ▼                       ▼
    RedisEngine: group commit ─► RedisLink.run([Call, ...]) (link.py): one pipeline, one round
            outage, fail mode, replica heartbeat, what the gateway shows

Group commit: whatever this process wants from Redis while a round trip is in flight
goes in the next one, as one pipeline (`_flush`). Clients that coalesce their work
(a key's reservations and settles in one `token_bucket.lua` call, a domain's bookings in
one `pace.lua` call) are *feeders*: the engine takes their pending items at each round
trip. Single calls (`call`) ride along. Under load a round trip serves dozens of
requests; at rest a request still costs one, with nothing added to wait for. Work that
may wait (a settle) asks for a round trip within `SETTLE_LAG` (`kick_later`).

States (`health`, `/health/ready`, the `tokengate_redis_*` gauges):
- `shared`: the above;
- `degraded` (Redis unreachable, fail open): each client serves alone, at this
  replica's share (`divisor`; limits: `app/limits/outage.py`), and hands Redis what it
  did meanwhile when Redis is back (feeders hear it through `heard`);
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
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple, Protocol

from app.state.link import Call, RedisFault, RedisLink, classify, describe
from app.state.scripts import Script

log = logging.getLogger("tokengate.redis")
SETTLE_LAG = 0.005  # seconds lazy work (a settle) may wait for a round trip to ride on
REPLICA_WINDOW_MS = 60_000  # a process seen within this long counts as alive
REPLICAS = Script.of("app.state", "replicas.lua", {"REPLICA_WINDOW_MS": REPLICA_WINDOW_MS})
_SLOW_TO_DOWN = 3
# Hands a coroutine to the lifecycle owner, which runs it as a task and awaits it on close.
Spawn = Callable[[Coroutine[Any, Any, None]], None]


class RedisState(NamedTuple):
    """What the gauges show: reachable, limits enforced per replica, misconfigured, and
    the replicas seen alive (the divisor of an outage)."""

    up: bool
    degraded: bool
    misconfigured: bool
    replicas: int


class Unanswered(Exception):
    """A call that Redis did not answer: the caller serves it by the fail mode."""


class Pending(Protocol):
    """One item of a round trip, as a feeder hands it over."""

    def call(self) -> Call: ...

    def deliver(self, result: Any) -> None:
        """Redis's answer; raising makes the item fail like an unanswered one."""
        ...

    def fail(self) -> None:
        """Redis did not answer: waiters learn it (`Unanswered`), work to redo is kept."""
        ...


class Feeder(Protocol):
    """A client that coalesces its work into the engine's next round trip."""

    def take(self) -> list[Pending]:
        """Everything pending, handed over (the feeder starts afresh)."""
        ...

    def urgent(self) -> bool:
        """Something waits for a round trip now (else only lazy work, if any)."""
        ...

    def lazy(self) -> bool:
        """Something may wait up to SETTLE_LAG for a round trip."""
        ...

    def heard(self, replicas: int, back: bool, lost: bool) -> None:
        """A heartbeat answered: the live replica count; `back`: it ended an outage
        (`lost`: Redis came back without its data)."""
        ...


class _Op:
    """A single call (`RedisEngine.call`) and its waiter."""

    __slots__ = ("_call", "waiter")

    def __init__(self, call: Call, waiter: asyncio.Future[Any]) -> None:
        self._call, self.waiter = call, waiter

    def call(self) -> Call:
        return self._call

    def deliver(self, result: Any) -> None:
        if not self.waiter.cancelled():
            self.waiter.set_result(result)

    def fail(self) -> None:
        if not self.waiter.done():
            self.waiter.set_exception(Unanswered())


class RedisEngine:
    def __init__(
        self,
        link: RedisLink,
        *,
        spawn: Spawn,
        fail_mode: str = "open",
        prefix: str = "tokengate:",
        assumed_replicas: int = 1,
        on_state: Callable[[RedisState], None] | None = None,
        replica: str | None = None,
    ) -> None:
        self.link = link
        self.fail_mode = fail_mode
        self.prefix = prefix
        self.up = True
        self.misconfigured: str | None = None
        self.replicas = 0  # processes seen alive in the last minute (0: not known yet)
        self.assumed = max(1, assumed_replicas)
        # This process in the replica set (the status page names replicas by it).
        self.replica_id = replica or f"{socket.gethostname()}:{os.getpid()}"
        self.feeders: list[Feeder] = []
        self._spawn = spawn
        self._on_state = on_state
        self._slow = 0  # consecutive timeouts / unexpected errors
        self._epoch: str | None = None
        self._bugs: set[str] = set()  # unexpected errors already logged (with traceback)
        self._ops: list[Pending] = []
        self._flushing = False
        self._timer: asyncio.TimerHandle | None = None
        link.know(REPLICAS)

    def attach(self, feeder: Feeder, *scripts: Script) -> None:
        """A feeder, served in attach order in each round trip; its scripts loaded at start."""
        self.feeders.append(feeder)
        self.link.know(*scripts)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self.link.start()
        except Exception as exc:
            self.failed(exc, outage=True)
            return
        log.info("shared limits in Redis: %s", self.link.target.where())
        await self._heartbeat_now()

    async def close(self) -> None:
        """Hand Redis what is still pending (the last settles), leave, disconnect."""
        if self._timer is not None:
            self._timer.cancel()
        if self.usable and (batch := self._take()):
            await self._send(batch)
        if self.usable:
            try:
                await self.link.run([self._heartbeat_call("leave")])
            except Exception as exc:
                log.debug("leaving the replica set failed: %s", describe(exc))
        await self.link.close()

    # -- what clients use -------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return self.up and self.misconfigured is None

    @property
    def divisor(self) -> int:
        """Replicas sharing the state: what a client divides a quota by while alone."""
        return max(self.replicas, self.assumed)

    async def call(self, call: Call) -> Any | None:
        """One call in the group commit's next round trip; None if Redis did not answer."""
        if not self.usable:
            return None
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._ops.append(_Op(call, waiter))
        self.kick()
        try:
            return await waiter
        except Unanswered:
            return None

    def kick(self) -> None:
        """A round trip now (or right after the one in flight): a client queued work."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._flushing:
            self._flushing = True
            self._spawn(self._flush())

    def kick_later(self) -> None:
        """A round trip within SETTLE_LAG, unless one comes sooner: lazy work queued."""
        if not self._flushing and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(SETTLE_LAG, self._on_timer)

    # -- the group commit ---------------------------------------------------------------------
    # (Per round trip, not per request: plain loops, no generator, no list when idle.)
    def _on_timer(self) -> None:
        self._timer = None
        self._kick_if_work()

    def _kick_if_work(self) -> None:
        if self._urgent() or self._lazy():
            self.kick()

    def _urgent(self) -> bool:
        if self._ops:
            return True
        for feeder in self.feeders:
            if feeder.urgent():
                return True
        return False

    def _lazy(self) -> bool:
        for feeder in self.feeders:
            if feeder.lazy():
                return True
        return False

    async def _flush(self) -> None:
        """Round trips back to back while urgent work keeps coming; lazy work alone waits
        (up to SETTLE_LAG) for urgent work to ride on."""
        try:
            while True:
                batch = self._take()
                if not batch:
                    break
                if not self.usable:
                    _fail(batch)
                    break
                await self._send(batch)
                if not self._urgent():
                    break
        finally:
            self._flushing = False
            if self.usable and self._timer is None and self._lazy():
                self.kick_later()

    def _take(self) -> list[Pending]:
        batch: list[Pending] = []
        for feeder in self.feeders:
            if feeder.urgent() or feeder.lazy():
                batch += feeder.take()
        if self._ops:
            batch += self._ops
            self._ops = []
        return batch

    async def _send(self, batch: list[Pending]) -> None:
        try:
            results = await self.link.run([item.call() for item in batch])
        except BaseException as exc:  # anything at all: no waiter is left hanging
            _fail(batch)
            if not isinstance(exc, Exception):
                raise
            self.failed(exc)
            return
        failed = False
        for item, result in zip(batch, results, strict=True):
            try:
                if isinstance(result, Exception):
                    raise result
                item.deliver(result)
            except Exception as exc:  # its own error, or an answer that makes no sense
                failed = True
                item.fail()
                self.failed(exc)
        if not failed:
            self._slow = 0

    # -- failures and recovery -------------------------------------------------------------------
    def failed(self, exc: BaseException, *, outage: bool = False) -> None:
        """What a failure means: misconfigured, down at once, or one more slow call."""
        kind = classify(exc)
        if kind is RedisFault.CONFIG:
            self._misconfigured(exc)
            return
        if kind is RedisFault.BUG and type(exc).__name__ not in self._bugs:
            self._bugs.add(type(exc).__name__)
            log.error(
                "unexpected error from Redis or its client (served by the fail mode; "
                "logged once per kind): %s",
                describe(exc),
                exc_info=exc,
            )
        if kind is RedisFault.DOWN or outage:
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
            n = self.divisor
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

    # -- the replica heartbeat ---------------------------------------------------------------
    async def _heartbeat_now(self) -> bool:
        """One heartbeat, sent at once (outside the group commit): how the outage ends."""
        try:
            (result,) = await self.link.run([self._heartbeat_call("beat")])
            if isinstance(result, Exception):
                raise result
            self._beat(result)
        except Exception as exc:
            self.failed(exc, outage=True)
            return False
        return True

    def _heartbeat_call(self, op: str) -> Call:
        keys = (self._replicas_key, f"{self._replicas_key}:epoch")
        return Call(REPLICAS, keys, (op, self.replica_id, secrets.token_hex(8)))

    @property
    def _replicas_key(self) -> str:
        return f"{self.prefix}{{replicas}}"

    async def replica_set(self) -> dict[str, float]:
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
            self.failed(exc)
            return {}
        cutoff = time.time() - REPLICA_WINDOW_MS / 1000
        seen = {str(name): float(ms) / 1000 for name, ms in pairs}
        return {name: at for name, at in seen.items() if at >= cutoff}

    def _beat(self, result: list[Any]) -> None:
        count, epoch = int(result[0]), str(result[1])
        lost = self._epoch is not None and epoch != self._epoch
        self._epoch = epoch
        self.replicas = count
        back = not self.up
        for feeder in self.feeders:
            feeder.heard(count, back, lost)
        if back:
            log.warning(
                "redis reachable again; shared limits restored%s",
                " (Redis had lost its data)" if lost else "",
            )
            self.up = True
            self._kick_if_work()
        self._publish()

    async def housekeeping(self) -> None:
        """Once a second: the heartbeat (the live replica count; while down, the probe
        that ends the outage), in the group commit's next round trip."""
        if self.misconfigured is not None:
            return
        if not self.up:
            await self._heartbeat_now()
            return
        beat: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._ops.append(_Op(self._heartbeat_call("beat"), beat))
        self.kick()
        try:
            self._beat(await beat)
        except Unanswered:
            pass
        except Exception as exc:  # an answer that makes no sense: a failure like any
            self.failed(exc)

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
            self._on_state(RedisState(self.up, degraded, misconfigured, self.replicas))

    def health(self) -> dict[str, object]:
        return {
            "redis": {
                "up": self.up,
                "fail_mode": self.fail_mode,
                "state": self.state(),
                "replicas": self.replicas,
                "divisor": 1 if self.usable else self.divisor,
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
            "replicas": self.replicas,
        }
        if self.misconfigured is not None:
            out["error"] = self.misconfigured
        return out


def _fail(batch: list[Pending]) -> None:
    for item in batch:
        item.fail()


def _pairs(raw: Any) -> list[tuple[Any, Any]]:
    """ZRANGE ... WITHSCORES as (member, score): RESP3 answers pairs, RESP2 a flat list."""
    items = list(raw)
    if items and isinstance(items[0], list | tuple):
        return [(a, b) for a, b in items]
    return list(zip(items[::2], items[1::2], strict=True))
