"""Retry budget per domain: retries may add at most `ratio` of recent traffic.

During an outage every request fails; without a budget each would be tried
`attempts` times and the gateway would multiply load on an upstream that is already
down. Requests and retries are counted over a sliding `window_sec` (`window.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from app.upstream.window import Window


class RetryBudget:
    def __init__(
        self,
        ratio: float,
        window_sec: int,
        min_retries: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ratio = ratio
        self.min_retries = min_retries
        self._window = Window(window_sec, clock)  # (requests, retries)

    def record_request(self) -> None:
        self._window.add(total=1)

    def try_spend(self) -> bool:
        requests, retries = self._window.totals()
        if retries < self.min_retries + self.ratio * requests:
            self._window.add(marked=1)
            return True
        return False

    def snapshot(self) -> dict[str, int]:
        requests, retries = self._window.totals()
        return {"requests": requests, "retries": retries}
