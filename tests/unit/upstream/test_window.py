"""The sliding window of one-second buckets under the breaker and the retry budget."""

from __future__ import annotations

from app.upstream.window import Window
from tests.support.clock import FakeClock


def test_counts_add_up_within_the_window(clock: FakeClock) -> None:
    w = Window(10, clock)
    w.add(total=1)
    w.add(total=1, marked=1)
    clock.now = 9.9
    w.add(marked=1)
    assert w.totals() == (2, 2)


def test_a_bucket_leaves_once_it_is_a_window_old(clock: FakeClock) -> None:
    w = Window(10, clock)
    clock.now = 0.5
    w.add(total=3, marked=1)  # the bucket of second 0
    clock.now = 5.0
    w.add(total=1)
    clock.now = 9.99
    assert w.totals() == (4, 1)  # second 0 is still one of the last 10
    clock.now = 10.0
    assert w.totals() == (1, 0)  # second 0 left; second 5 stays
    clock.now = 15.0
    assert w.totals() == (0, 0)


def test_events_of_one_second_share_one_bucket(clock: FakeClock) -> None:
    w = Window(60, clock)
    for i in range(1000):
        clock.now = 7 + i / 1000
        w.add(total=1, marked=i % 2)
    assert len(w._buckets) == 1 and w.totals() == (1000, 500)


def test_reading_does_not_add_and_clear_forgets(clock: FakeClock) -> None:
    w = Window(5, clock)
    assert w.totals() == (0, 0) and not w._buckets
    w.add(total=2)
    w.clear()
    assert w.totals() == (0, 0)


def test_the_default_clock_is_monotonic_time() -> None:
    w = Window(5)
    w.add(total=1)
    assert w.totals() == (1, 0)
