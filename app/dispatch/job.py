"""A request waiting for (or holding) a dispatch slot on one domain."""

from __future__ import annotations

import asyncio

from app.kinds import QueueClass


class QueueExpired(Exception):
    """Set on a job's future when it waited longer than `max_queue_wait_ms`."""


class Job:
    # A plain slotted class: one is built for every queued request.
    __slots__ = (
        "cancelled",
        "cost",
        "enqueued_at",
        "granted",
        "in_queue",
        "key",
        "priority",
        "tag",
    )

    def __init__(
        self,
        key: str,
        priority: QueueClass,
        cost: int,
        enqueued_at: float,
        granted: asyncio.Future[None] | None = None,
    ) -> None:
        self.key = key
        self.priority = priority
        self.cost = cost
        self.enqueued_at = enqueued_at
        self.granted = asyncio.get_running_loop().create_future() if granted is None else granted
        self.cancelled = False
        self.in_queue = False
        self.tag = -1.0  # fair-queuing start tag it was served at; -1: never served

    def grant(self) -> bool:
        """Wake the waiting request; False if it already gave up (timeout, disconnect)."""
        if self.cancelled or self.granted.done():
            return False
        self.granted.set_result(None)
        return True

    def expire(self) -> None:
        """The wait's deadline passed: the request gives up, unless granted just before."""
        if not self.granted.done():
            self.granted.set_exception(QueueExpired())
