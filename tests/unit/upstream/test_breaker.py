from __future__ import annotations

import json

from app.config.schema import BreakerConfig
from app.upstream.breaker import Breaker, BreakerState
from tests.support.clock import FakeClock


def breaker(**cfg: object) -> tuple[Breaker, FakeClock]:
    clock = FakeClock()
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


def test_failures_older_than_the_window_no_longer_count() -> None:
    b, clock = breaker(failure_threshold=100, failure_rate=0.5, min_requests=10, window_sec=30)
    for _ in range(9):
        b.record(False)  # 9 failures at t=0: below min_requests
    clock.now = 30.5
    for i in range(10):
        b.record(i % 3 == 1)  # 7 of 10 fail, with the 9 old ones gone: 0.7 >= 0.5
    assert b.is_open
    b2, clock2 = breaker(failure_threshold=100, failure_rate=0.5, min_requests=10, window_sec=30)
    for _ in range(9):
        b2.record(False)
    clock2.now = 30.5
    for _ in range(20):
        b2.record(True)  # 20 fresh successes; had the old failures counted, 9 of 29 fail
    b2.record(False)
    assert not b2.is_open  # 1 of 21 inside the window


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


def test_states_are_plain_strings_on_the_wire() -> None:
    b, _ = breaker(failure_threshold=1)
    assert b.state is BreakerState.CLOSED and json.dumps({"b": b.state}) == '{"b": "closed"}'
    b.record(False)
    assert b.state == "open" and f"{b.state}" == "open"  # type: ignore[comparison-overlap]  # record() moved it on
