"""A clock the test moves by hand: pure cores take `clock: Callable[[], float]`."""

from __future__ import annotations


class FakeClock:
    """Stands still until a test sets `now` (or calls `advance`): no sleeps, no flakes."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
