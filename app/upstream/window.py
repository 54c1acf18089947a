"""Two counts over a sliding window of one-second buckets (pure, clock injected).

The circuit breaker counts (outcomes, failures) and the retry budget (requests,
retries) over their last `seconds`. Both keep one bucket `[second, total, marked]`
per second, not one entry per event: at thousands of answers a second an entry per
event held a window of 100k tuples, and every failure summed them all, exactly when an
outage made failures frequent. A bucket leaves the window once it is `seconds` old.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class Window:
    __slots__ = ("_buckets", "clock", "seconds")

    def __init__(self, seconds: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self._buckets: deque[list[int]] = deque()  # [second, total, marked]

    def _prune(self, second: int) -> None:
        buckets = self._buckets
        while buckets and buckets[0][0] <= second - self.seconds:
            buckets.popleft()

    def add(self, total: int = 0, marked: int = 0) -> None:
        """Count `total` events, `marked` of a second kind (failures, retries), now."""
        second = int(self.clock())
        self._prune(second)
        buckets = self._buckets
        if not buckets or buckets[-1][0] != second:
            buckets.append([second, 0, 0])
        bucket = buckets[-1]
        bucket[1] += total
        bucket[2] += marked

    def totals(self) -> tuple[int, int]:
        """(total, marked) over the last `seconds`, this one included."""
        self._prune(int(self.clock()))
        return sum(b[1] for b in self._buckets), sum(b[2] for b in self._buckets)

    def clear(self) -> None:
        self._buckets.clear()
