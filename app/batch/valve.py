"""The pace at which deferred work is released: the domain's idle quota, nothing more.

A released batch item or held response still goes through the pipeline in the `batch`
class (behind every interactive request, within `batch.share` of the slots, paced to the
domain's quota). Left at that, up to `batch.concurrency` items of every running batch wait
in the domain's queue and book each grant of the quota the moment it frees, so an
interactive request that arrives finds the quota booked ahead of it. The valve keeps them
out of the queue until the quota is idle:

    for each item, per domain, one at a time:
      the domain's pace is unknown (no quota declared or learned)  → go (slots bound it)
      a cool-down (an upstream 429)                                → wait it out
      an interactive request waits, or any grant is booked ahead   → wait one spacing
      (the quota's burst is not whole again), or none is free
      else                                                         → go; the next item
                                                                     one spacing later

So deferred work takes a grant only when the quota's whole burst is unused: interactive
traffic arriving next always finds the rest of the burst free and goes at once, deferred
work gets what interactive traffic leaves, at most the domain's pace, and it never queues
in front of an interactive request. (With a shared pacer the burst is read from this
process's copy of the shared pace: a hint, the dispatcher's booking still rules.)
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from app.dispatch.domain import Domain
from app.limits.pacing import Pacer

_FLOOR = 0.001  # seconds: the shortest wait between looks
_IDLE_STEP = 0.05  # seconds between looks when the pace is unknown but interactive waits


class Valve:
    def __init__(self) -> None:
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._next: dict[str, float] = {}  # by domain: no item before this (loop clock)
        self.waits = 0  # times an item was held back (for tests and the curious)

    async def idle(self, domain: Domain | None) -> None:
        """Return when `domain` has a grant of its quota free and no interactive request
        waits; one item per spacing of the domain's pace."""
        if domain is None:
            return
        dispatcher = domain.dispatcher
        pacer = dispatcher.pacer
        loop = asyncio.get_running_loop()
        async with self._locks[domain.name]:
            if (early := self._next.get(domain.name, 0.0) - loop.time()) > 0:
                await asyncio.sleep(early)
            while True:
                rate = pacer.rate()
                cooling = pacer.cooling()
                if cooling > 0:
                    self.waits += 1
                    await asyncio.sleep(cooling)
                    continue
                busy = dispatcher.queue.interactive_waiting()
                if not busy and (not pacer.bounded() or _whole(pacer)):
                    break
                self.waits += 1
                await asyncio.sleep(max(_FLOOR, 1 / rate) if rate else _IDLE_STEP)
            self._next[domain.name] = loop.time() + (1 / rate if rate else 0.0)


def _whole(pacer: Pacer) -> bool:
    """Nothing booked ahead on the domain's pace (its burst is whole) and a grant free."""
    return pacer.state.tat_r <= pacer.now() and pacer.ready(0)
