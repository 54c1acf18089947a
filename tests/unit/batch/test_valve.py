"""The release valve (`app/batch/valve.py`): deferred work goes only on idle quota, never
while an interactive request waits, and not during an upstream's cool-down. The tests
flip the domain's state themselves and only ask whether an item went: no wall time."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from app.batch.valve import Valve


class Pacer:
    def __init__(self, rate: float | None = 1000.0) -> None:
        self._rate, self.free, self.cool = rate, True, 0.0
        self.state = SimpleNamespace(tat_r=0.0)  # when the last booked grant is due

    def now(self) -> float:
        return 10.0

    def rate(self) -> float | None:
        return self._rate

    def bounded(self) -> bool:
        return self._rate is not None

    def ready(self, tokens: int) -> bool:
        return self.free

    def cooling(self) -> float:
        return self.cool


def domain(pacer: Pacer) -> Any:
    queue = SimpleNamespace(waiting=False)
    queue.interactive_waiting = lambda: queue.waiting
    return SimpleNamespace(name="d", dispatcher=SimpleNamespace(pacer=pacer, queue=queue))


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_an_item_goes_at_once_on_idle_quota_and_without_a_known_pace() -> None:
    valve = Valve()
    await asyncio.wait_for(valve.idle(domain(Pacer())), 30)
    await asyncio.wait_for(valve.idle(domain(Pacer(None))), 30)
    await asyncio.wait_for(valve.idle(None), 30)
    assert valve.waits == 0


async def test_an_item_waits_while_interactive_traffic_waits_or_any_quota_is_booked() -> None:
    valve, pacer = Valve(), Pacer()
    d = domain(pacer)
    d.dispatcher.queue.waiting = True
    going = asyncio.create_task(valve.idle(d))
    await asyncio.sleep(0.05)
    assert not going.done()
    d.dispatcher.queue.waiting, pacer.free = False, False  # no one waits, but no grant free
    await asyncio.sleep(0.05)
    assert not going.done()
    pacer.free, pacer.state.tat_r = True, 11.0  # free, but a grant is booked ahead
    await asyncio.sleep(0.05)
    assert not going.done()
    pacer.state.tat_r = 9.0  # the burst is whole again
    await asyncio.wait_for(going, 30)
    assert valve.waits >= 3


async def test_an_item_waits_out_a_cool_down() -> None:
    valve, pacer = Valve(), Pacer()
    pacer.cool = 0.01
    going = asyncio.create_task(valve.idle(domain(pacer)))
    await settle()
    assert not going.done()
    pacer.cool = 0.0
    await asyncio.wait_for(going, 30)
    assert valve.waits >= 1
