"""The shared pacer's side in the gateway: it mirrors what the script answers, and
paces alone from its own state while Redis is unreachable (fail open)."""

from __future__ import annotations

from typing import Any

import pytest

from app.limits.pacing import PaceState, Throttle
from app.limits.shared_pace import RedisPacer


class Scripts:
    """A stand-in for `PaceBookings.pace`: canned replies, or None (Redis down)."""

    def __init__(self, reply: list[Any] | None, replicas: int = 1) -> None:
        self.reply = reply
        self.usable = reply is not None
        self.divisor = replicas
        self.calls: list[list[Any]] = []

    async def pace(self, key: str, args: list[Any]) -> list[Any] | None:
        self.calls.append(args)
        return self.reply


async def test_a_reservation_is_the_scripts_and_its_cool_down_is_mirrored() -> None:
    scripts = Scripts([250, 1500, "9.8", "-1", 1])
    pacer = RedisPacer(scripts, "tg:pace:{d}", PaceState(600, None, 1.0))
    assert await pacer.reserve(1, 0) == pytest.approx(0.25)
    op, ceiling_r, ceiling_t, window, now, requests, tokens = scripts.calls[0]
    assert (op, ceiling_t, window, now, requests, tokens) == ("reserve", -1, 1.0, "", 1, 0)
    assert ceiling_r == pytest.approx(600 / 60 * 0.98)
    assert pacer.cooling() == pytest.approx(1.5, abs=0.01)  # no round trip to know it
    assert not pacer.ready(1) and pacer.bounded()
    assert pacer.rate() == pytest.approx(9.8)
    assert pacer.snapshot()["shared"] is True and pacer.snapshot()["learned"] is True
    # The second booking of a queued request (its tokens) costs no round trip when no
    # token rate is paced.
    assert await pacer.reserve(0, 500) == 0 and len(scripts.calls) == 1


async def test_with_redis_down_it_paces_alone_from_the_configured_quota() -> None:
    pacer = RedisPacer(Scripts(None), "tg:pace:{d}", PaceState(600, None, 1.0))
    waits = [await pacer.reserve(1, 0) for _ in range(3)]
    assert waits[0] == 0 and waits[2] > waits[1] > 0  # spaced by its own state
    pacer.answered()
    added = await pacer.throttled(Throttle(0.5, pacer.now() - 0.1))
    assert added == pytest.approx(0.5, abs=0.01) and pacer.cooling() > 0
    assert pacer.snapshot()["shared"] is False


async def test_alone_it_paces_at_its_share_of_the_quota_and_of_what_was_learned() -> None:
    """Four replicas alive when Redis went away: each paces at a quarter, starting from
    the rate they had learned together, not from the configured quota."""
    alone = RedisPacer(Scripts(None, replicas=4), "tg:pace:{d}", PaceState(600, 60000, 1.0))
    assert alone.rate() == pytest.approx(600 / 60 * 0.98 / 4)
    assert alone.snapshot()["requests_per_sec"] == pytest.approx(2.45)
    scripts = Scripts([0, 0, "4.0", "-1", 1], replicas=4)
    pacer = RedisPacer(scripts, "tg:pace:{d}", PaceState(600, None, 1.0))
    await pacer.reserve(1, 0)  # the shared state answered: 4 requests/s, learned
    scripts.usable = False
    assert pacer.rate() == pytest.approx(1.0, abs=0.01)
    assert pacer.snapshot()["learned"] is True and pacer.snapshot()["shared"] is False
    scripts.usable = True
    assert pacer.rate() == pytest.approx(4.0)  # shared again, nothing carried over
