"""Circuit breaker per domain (pure, clock injected).

    closed ──(N consecutive failures, or failure rate >= r over the window
    │         with at least min_requests)──► open ──(open_sec)──► half-open
    ▲                                                             │
    └──────────────── success of the one probe request ◄──────────┘
                       (a failed probe re-opens for another open_sec)

Only upstream faults count (connection errors, timeouts, 5xx, 429 storms); a 4xx
the client caused says nothing about the upstream.

The failure-rate window is kept as one-second buckets `[second, outcomes, failures]`,
not one entry per outcome: at thousands of answers a second an entry per outcome
held a window of 100k tuples, and every failure summed them all, exactly when an
outage made failures frequent.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from app.config.schema import BreakerConfig


class Breaker:
    def __init__(self, cfg: BreakerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self.state = "closed"
        self.consecutive = 0
        self.opened_at = 0.0
        self._probe_out = False
        self._window: deque[list[int]] = deque()  # [second, outcomes, failures]

    def allows(self) -> bool:
        """May a request be sent now? In half-open, only one probe at a time."""
        if self.state == "open" and self.clock() - self.opened_at >= self.cfg.open_sec:
            self.state = "half-open"
            self._probe_out = False
        if self.state == "closed":
            return True
        if self.state == "half-open" and not self._probe_out:
            self._probe_out = True
            return True
        return False

    @property
    def is_open(self) -> bool:
        return self.state == "open" and self.clock() - self.opened_at < self.cfg.open_sec

    def record(self, ok: bool) -> None:
        now = self.clock()
        self._count(int(now), ok)
        if ok:
            self.consecutive = 0
            if self.state == "half-open":
                self.state = "closed"
                self._window.clear()
            return
        self.consecutive += 1
        if self.state == "half-open" or self._should_open():
            self.state = "open"
            self.opened_at = now

    def _count(self, second: int, ok: bool) -> None:
        window = self._window
        while window and window[0][0] <= second - self.cfg.window_sec:
            window.popleft()
        if not window or window[-1][0] != second:
            window.append([second, 0, 0])
        slot = window[-1]
        slot[1] += 1
        if not ok:
            slot[2] += 1

    def _should_open(self) -> bool:
        if self.consecutive >= self.cfg.failure_threshold:
            return True
        n = sum(slot[1] for slot in self._window)
        if n < self.cfg.min_requests:
            return False
        failures = sum(slot[2] for slot in self._window)
        return failures / n >= self.cfg.failure_rate

    def release_probe(self) -> None:
        """A half-open probe ended without a verdict (client left): allow another."""
        self._probe_out = False
