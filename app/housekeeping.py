"""The gateway's once-a-second upkeep, step by step.

Each step runs on its own: one that raises is logged with its name and counted
(`tokengate_housekeeping_failures_total{step}`), and the steps after it still run, this
second and the next. A step may run every N seconds (`every`, from the `offset`-th).
The steps themselves are the gateway's (`Gateway._upkeep`); this loop knows only names.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

log = logging.getLogger("tokengate.gateway")


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[], Awaitable[None] | None]
    every: int = 1  # seconds (ticks) between runs
    offset: int = 0  # the first tick it runs on, modulo `every`


class Housekeeping:
    def __init__(
        self,
        steps: Sequence[Step],
        on_failure: Callable[[str], None],
        *,
        interval: float = 1.0,
    ) -> None:
        self.steps = tuple(steps)
        self.on_failure = on_failure
        self.interval = interval
        self.ticks = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.tick()

    async def tick(self) -> None:
        """One round: every step due at this tick, each guarded on its own."""
        self.ticks += 1
        for step in self.steps:
            if self.ticks % step.every != step.offset % step.every:
                continue
            try:
                result = step.run()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # one bad step must not end the upkeep, nor skip others
                log.error("housekeeping step %s failed (tried again next time): %r", step.name, exc)
                self.on_failure(step.name)
