"""A domain's pace shared by every replica through Redis (`pace.lua`).

The bookings of a domain that meet in one round trip of the shared-state engine go as
one call (`PaceBookings`, a feeder of `app/state/redis_engine.py`): this module never touches
Redis itself. While Redis is unreachable the replica paces alone at its share of the quota
(the quota, or the rate learned together, / the replicas seen alive in the last minute).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.limits.constants import MAX_COOL_DOWN, PACE_LUA, values
from app.limits.pacing import (
    LocalPacer,
    PaceState,
    RateHeaders,
    Throttle,
    pace_view,
)
from app.state.link import Call
from app.state.redis_engine import Pending, RedisEngine, Unanswered
from app.state.scripts import Script

PACE_SCRIPT = Script.of("app.limits", "pace.lua", values(PACE_LUA))


@dataclass(slots=True)
class _Bookings:
    """One `pace.lua` reserve call: a domain's bookings, in order."""

    key: str
    head: tuple[Any, ...]
    pairs: list[int] = field(default_factory=list)
    waiters: list[asyncio.Future[list[Any]]] = field(default_factory=list)

    def call(self) -> Call:
        return Call(PACE_SCRIPT, (self.key,), (*self.head, *self.pairs))

    def deliver(self, result: Any) -> None:
        first, *rest = result
        for wait, booked in zip(str(first).split(","), self.waiters, strict=True):
            if not booked.cancelled():
                booked.set_result([wait, *rest])

    def fail(self) -> None:
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_exception(Unanswered())


class PaceBookings:
    """Every domain's `pace.lua` calls, as a feeder of the engine: the bookings of one
    domain that meet in a round trip are one call; other steps ride along alone."""

    def __init__(self, engine: RedisEngine) -> None:
        self.engine = engine
        self._groups: dict[tuple[str, tuple[Any, ...]], _Bookings] = {}

    @property
    def usable(self) -> bool:
        return self.engine.usable

    @property
    def divisor(self) -> int:
        return self.engine.divisor

    async def pace(self, key: str, args: list[Any]) -> list[Any] | None:
        """One step of `pace.lua`; None when Redis did not answer (the pacer then paces
        alone, at its share)."""
        engine = self.engine
        if not engine.usable:
            return None
        if args[0] != "reserve":
            answer: list[Any] | None = await engine.call(Call(PACE_SCRIPT, (key,), tuple(args)))
            return answer
        head = tuple(args[:5])
        group = self._groups.get((key, head))
        if group is None:
            group = self._groups[(key, head)] = _Bookings(key, head)
        waiter: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        group.pairs += args[5:7]
        group.waiters.append(waiter)
        engine.kick()
        try:
            return await waiter
        except Unanswered:
            return None

    def take(self) -> list[Pending]:
        batch: list[Pending] = list(self._groups.values())
        self._groups = {}
        return batch

    def urgent(self) -> bool:
        return bool(self._groups)

    def lazy(self) -> bool:
        return False

    def heard(self, replicas: int, back: bool, lost: bool) -> None:
        """Nothing to hand over: a domain paced alone meanwhile starts afresh."""


class PaceScripts(Protocol):
    @property
    def usable(self) -> bool: ...

    @property
    def divisor(self) -> int: ...

    async def pace(self, key: str, args: list[Any]) -> list[Any] | None: ...


class RedisPacer:
    """A domain's pace kept in Redis (`pace.lua`), so replicas on one upstream key pace
    together: one round trip per reservation, and none at all while the shared state
    paces nothing (no quota, nothing learned: polled once a second by `sync`).

    The local `PaceState` mirrors the shared cool-down for the dispatcher's cheap checks.
    While Redis is unreachable a `LocalPacer` paces this replica alone at its share
    (`_alone`), started from what was shared: the cool-down, and the rate in force."""

    shared = True

    def __init__(self, store: PaceScripts, key: str, state: PaceState) -> None:
        self.store, self.key, self.state = store, key, state
        self.now = time.monotonic
        self.accepted = LocalPacer(state, self.now).accepted  # one measure, also alone
        self._local: LocalPacer | None = None  # pacing alone (Redis unreachable)
        self._rate: float | None = state.ceiling()
        self._token_rate: float | None = state.ceiling_t
        self._learned = False
        self._unreported = 0  # answers not yet reported to the shared state

    def _args(self, op: str, *extra: Any) -> list[Any]:
        s = self.state
        ceilings = [-1 if c is None else c for c in (s.ceiling_r, s.ceiling_t)]
        return [op, *ceilings, s.window, "", *extra]

    def _apply(self, raw: list[Any]) -> float:
        """Mirror a reply; the first field back (op-specific)."""
        first, cool_ms, rate, token_rate, learned = raw
        self.state.cool_until = self.now() + int(cool_ms) / 1000
        value, tokens = float(rate), float(token_rate)
        self._rate = None if value < 0 else value
        self._token_rate = None if tokens < 0 else tokens
        self._learned = bool(int(learned))
        return float(first)

    def _alone(self) -> LocalPacer | None:
        """The pacer of this replica alone while Redis is unreachable, else None."""
        if self.store.usable:
            self._local = None
            return None
        return self._fallback()

    def _fallback(self) -> LocalPacer:
        if self._local is None:
            n, s = self.store.divisor, self.state
            rpm, tpm = s.configured
            alone = PaceState(
                None if rpm is None else rpm / n, None if tpm is None else tpm / n, s.window
            )
            alone.cool_until = s.cool_until
            if self._rate is not None and self._learned:
                alone.learned, alone.learned_at = self._rate / n, self.now()  # grows back
            elif self._rate is not None:
                alone.header_r = self._rate / n  # an advertised limit under the quota
            if self._token_rate is not None:
                alone.header_t = self._token_rate / n
            self._local = LocalPacer(alone, self.now)
            self._local.accepted = self.accepted
        return self._local

    def bounded(self) -> bool:
        if (alone := self._alone()) is not None:
            return alone.bounded()
        return self._rate is not None or self.cooling() > 0 or self._token_rate is not None

    def ready(self, tokens: int) -> bool:
        # The shared bookings are only known by asking, so a paced request always goes
        # through the queue (priority, fairness, its deadline), never sleeps on a slot.
        return not self.bounded()

    def cooling(self) -> float:
        alone = self._alone()
        until = self.state.cool_until if alone is None else alone.state.cool_until
        return max(0.0, until - self.now())

    async def reserve(self, requests: int, tokens: int) -> float:
        if (alone := self._alone()) is not None:
            return await alone.reserve(requests, tokens)
        if not requests and self._token_rate is None:
            return 0.0  # tokens are not paced: nothing to book, no round trip
        raw = await self.store.pace(self.key, self._args("reserve", requests, tokens))
        if raw is None:  # Redis did not answer this one: booked alone
            return await self._fallback().reserve(requests, tokens)
        return self._apply(raw) / 1000

    async def throttled(self, throttle: Throttle) -> float:
        now = self.now()
        before = max(now, self.state.cool_until)
        wait = -1 if throttle.wait is None else round(min(throttle.wait, MAX_COOL_DOWN) * 1000)
        ago = max(0, round((now - throttle.sent_at) * 1000))
        args = self._args("throttled", wait, ago, self.accepted.rate(now, self.state.cool_until))
        if (alone := self._alone()) is not None:
            return await alone.throttled(throttle)
        raw = await self.store.pace(self.key, args)
        if raw is None:
            return await self._fallback().throttled(throttle)
        self._apply(raw)
        return max(0.0, self.state.cool_until - before)

    async def observe(self, headers: RateHeaders) -> float:
        now = self.now()
        before = max(now, self.state.cool_until)
        exhausted = headers.exhausted_for
        args = self._args(
            "observe",
            headers.limit_requests or -1,
            headers.limit_tokens or -1,
            -1 if exhausted is None else round(min(exhausted, self.state.window) * 1000),
        )
        if (alone := self._alone()) is not None:
            return await alone.observe(headers)
        raw = await self.store.pace(self.key, args)
        if raw is None:
            return await self._fallback().observe(headers)
        self._apply(raw)
        return max(0.0, self.state.cool_until - before)

    def answered(self) -> None:
        self.accepted.tick(self.now())
        self._unreported += 1

    async def sync(self) -> None:
        """Once a second: read what other replicas learned, and report this one's answers
        (a throttle then aims under what all replicas together got, not one's share)."""
        if not self.store.usable:
            return
        raw = await self.store.pace(self.key, self._args("state", self._unreported))
        if raw is not None:
            self._unreported = 0
            self._apply(raw)

    def rate(self) -> float | None:
        alone = self._alone()
        return self._rate if alone is None else alone.rate()

    def snapshot(self) -> dict[str, object]:
        if (alone := self._alone()) is not None:
            return alone.snapshot()  # pacing alone meanwhile: not shared
        return pace_view(True, self._rate, self._learned, self.cooling())
