"""Retry budget per domain: retries may add at most `ratio` of recent traffic.

During an outage every request fails; without a budget each would be tried
`attempts` times and the gateway would multiply load on an upstream that is already
down. Counts live in one-second buckets over a sliding `window` (clock injected).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RetryBudget:
    def __init__(
        self,
        ratio: float,
        window_sec: int,
        min_retries: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ratio = ratio
        self.window = window_sec
        self.min_retries = min_retries
        self.clock = clock
        self._slots: deque[list[int]] = deque()  # [second, requests, retries]

    def _slot(self) -> list[int]:
        now = int(self.clock())
        while self._slots and self._slots[0][0] <= now - self.window:
            self._slots.popleft()
        if not self._slots or self._slots[-1][0] != now:
            self._slots.append([now, 0, 0])
        return self._slots[-1]

    def record_request(self) -> None:
        self._slot()[1] += 1

    def try_spend(self) -> bool:
        slot = self._slot()
        requests = sum(s[1] for s in self._slots)
        retries = sum(s[2] for s in self._slots)
        if retries < self.min_retries + self.ratio * requests:
            slot[2] += 1
            return True
        return False

    def snapshot(self) -> dict[str, int]:
        self._slot()
        return {
            "requests": sum(s[1] for s in self._slots),
            "retries": sum(s[2] for s in self._slots),
        }
