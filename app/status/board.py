"""What the status page shows of recent traffic: the ring of time buckets and the last
error answers, owned by the gateway and fed through the `Metrics` verbs (the one place
every request is already recorded), so the page and Prometheus never disagree on what
was counted."""

from __future__ import annotations

import time

from app.status.recent import RecentErrors
from app.status.ring import Clock, Ring


class StatusBoard:
    def __init__(
        self,
        step_sec: float = 5.0,
        span_sec: float = 900.0,
        errors: int = 50,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
    ) -> None:
        self.ring = Ring(step_sec, span_sec, clock, wall)
        self.errors = RecentErrors(errors, wall)

    def snapshot(self) -> dict[str, object]:
        return {"series": self.ring.series(), "errors": self.errors.snapshot()}
