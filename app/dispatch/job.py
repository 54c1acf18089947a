"""A request waiting for (or holding) a dispatch slot on one domain."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(eq=False)
class Job:
    key: str
    priority: str
    cost: int
    enqueued_at: float
    granted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    cancelled: bool = False
    in_queue: bool = False

    def grant(self) -> bool:
        """Wake the waiting request; False if it already gave up (timeout, disconnect)."""
        if self.cancelled or self.granted.done():
            return False
        self.granted.set_result(None)
        return True
