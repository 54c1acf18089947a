from __future__ import annotations

from app.config.schema import BreakerConfig
from app.upstream.breaker import Breaker


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def breaker(**cfg: object) -> tuple[Breaker, Clock]:
    clock = Clock()
    return Breaker(BreakerConfig.model_validate({"open_sec": 10, **cfg}), clock), clock


def test_opens_after_consecutive_failures() -> None:
    b, _ = breaker(failure_threshold=3)
    for _ in range(2):
        b.record(False)
    assert b.allows()
    b.record(False)
    assert b.is_open and not b.allows()


def test_success_resets_the_consecutive_count() -> None:
    b, _ = breaker(failure_threshold=3)
    for ok in (False, False, True, False, False):
        b.record(ok)
    assert not b.is_open


def test_opens_on_failure_rate_with_enough_requests() -> None:
    b, _ = breaker(failure_threshold=100, failure_rate=0.5, min_requests=10, window_sec=30)
    for i in range(10):
        b.record(i % 2 == 0)  # alternating: never 2 failures in a row
    assert b.is_open


def test_half_open_lets_one_probe_and_closes_on_success() -> None:
    b, clock = breaker(failure_threshold=1)
    b.record(False)
    clock.now = 10.0
    assert b.allows() and b.state == "half-open"
    assert not b.allows()  # only one probe at a time
    b.record(True)
    assert b.state == "closed" and b.allows()


def test_failed_probe_reopens() -> None:
    b, clock = breaker(failure_threshold=1)
    b.record(False)
    clock.now = 10.0
    assert b.allows()
    b.record(False)
    assert b.is_open
    clock.now = 15.0
    assert not b.allows()
