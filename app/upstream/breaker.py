"""Circuit breaker per domain (pure, clock injected).

    closed ──(N consecutive failures, or failure rate >= r over the window
    │         with at least min_requests)──► open ──(open_sec)──► half-open
    ▲                                                             │
    └──────────────── success of the one probe request ◄──────────┘
                       (a failed probe re-opens for another open_sec)

Only upstream faults count (connection errors, timeouts, 5xx, 429 storms); a 4xx
the client caused says nothing about the upstream. The failure rate is counted over
a sliding window of one-second buckets (`window.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum

from app.config.schema import BreakerConfig
from app.upstream.window import Window


class BreakerState(StrEnum):
    """A `StrEnum`: `/health/ready` and `/admin/status` show the plain value."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class Breaker:
    def __init__(self, cfg: BreakerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self.state = BreakerState.CLOSED
        self.consecutive = 0
        self.opened_at = 0.0
        self._probe_out = False
        self._window = Window(cfg.window_sec, clock)  # (outcomes, failures)

    def allows(self) -> bool:
        """May a request be sent now? In half-open, only one probe at a time."""
        if self.state is BreakerState.OPEN and self.clock() - self.opened_at >= self.cfg.open_sec:
            self.state = BreakerState.HALF_OPEN
            self._probe_out = False
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.HALF_OPEN and not self._probe_out:
            self._probe_out = True
            return True
        return False

    @property
    def is_open(self) -> bool:
        return self.state is BreakerState.OPEN and self.clock() - self.opened_at < self.cfg.open_sec

    def record(self, ok: bool) -> None:
        self._window.add(total=1, marked=0 if ok else 1)
        if ok:
            self.consecutive = 0
            if self.state is BreakerState.HALF_OPEN:
                self.state = BreakerState.CLOSED
                self._window.clear()
            return
        self.consecutive += 1
        if self.state is BreakerState.HALF_OPEN or self._should_open():
            self.state = BreakerState.OPEN
            self.opened_at = self.clock()

    def _should_open(self) -> bool:
        if self.consecutive >= self.cfg.failure_threshold:
            return True
        n, failures = self._window.totals()
        if n < self.cfg.min_requests:
            return False
        return failures / n >= self.cfg.failure_rate

    def release_probe(self) -> None:
        """A half-open probe ended without a verdict (client left): allow another."""
        self._probe_out = False
