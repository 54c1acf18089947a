"""The status page's ring: rates per bucket, quantiles, the window sliding, fixed memory."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.status.histogram import BINS, Histogram, bin_of, value_of
from app.status.ring import STATUS_CLASSES, Ring, status_class
from tests.support.clock import FakeClock


def series(r: Ring) -> dict[str, Any]:
    """The ring's series, read as the page's JavaScript reads them."""
    return r.series()


def ring(step: float = 5.0, span: float = 60.0) -> tuple[Ring, FakeClock]:
    clock = FakeClock(1000.0)  # a bucket edge: 1000 / 5
    return Ring(step, span, clock, wall=lambda: clock.now + 1_700_000_000), clock


@pytest.mark.parametrize(
    ("status", "name"),
    [(200, "2xx"), (201, "2xx"), (400, "4xx"), (404, "4xx"), (499, "4xx"), (429, "429"),
     (500, "5xx"), (502, "5xx"), (504, "5xx")],
)  # fmt: skip
def test_status_classes_keep_429_apart(status: int, name: str) -> None:
    assert STATUS_CLASSES[status_class(status)] == name


def test_a_complete_bucket_becomes_a_rate_and_the_current_one_only_a_total() -> None:
    r, clock = ring()
    for _ in range(10):
        r.answered(200, prompt=7, completion=3)
    r.answered(503)
    r.answered(429)
    s = series(r)
    assert s["points"] == 12 and len(s["requests_per_sec"]["2xx"]) == 12
    assert s["requests_per_sec"]["2xx"][-1] == 0  # (still filling)
    assert s["totals"]["requests"] == {"2xx": 10, "4xx": 0, "429": 1, "5xx": 1}
    assert s["totals"]["tokens"] == {"prompt": 70, "completion": 30}

    clock.advance(5)
    s = series(r)
    assert s["requests_per_sec"]["2xx"][-1] == 2.0  # 10 in 5 s
    assert s["requests_per_sec"]["5xx"][-1] == 0.2
    assert s["tokens_per_sec"] == {
        "prompt": [0] * 11 + [14.0],
        "completion": [0] * 11 + [6.0],
    }
    assert s["end_unix"] == 1_700_001_005.0


def test_buckets_older_than_the_span_read_as_empty_and_are_reused() -> None:
    r, clock = ring(span=60.0)
    r.answered(200)
    clock.advance(5)
    assert sum(series(r)["requests_per_sec"]["2xx"]) == 0.2
    clock.advance(60)  # the bucket left the window: gone without any sweep
    assert sum(series(r)["requests_per_sec"]["2xx"]) == 0
    assert series(r)["totals"]["requests"]["2xx"] == 0
    r.answered(500)  # lands in the same slot of the ring, reset first
    clock.advance(5)
    assert series(r)["requests_per_sec"]["5xx"][-1] == 0.2
    assert series(r)["totals"]["requests"] == {"2xx": 0, "4xx": 0, "429": 0, "5xx": 1}


def test_an_idle_gap_inside_the_window_is_zeros_not_stale_data() -> None:
    r, clock = ring()
    r.answered(200)
    clock.advance(20)
    r.answered(200)
    clock.advance(5)
    assert series(r)["requests_per_sec"]["2xx"][-5:] == [0.2, 0, 0, 0, 0.2]


def test_quantiles_per_bucket_and_over_the_window() -> None:
    r, clock = ring()
    for ms in range(1, 101):  # 1..100 ms
        r.ttft(ms / 1000)
        r.queue_wait(0.0)
    r.queue_wait(2.0)
    clock.advance(5)
    s = series(r)
    p50 = s["ttft_ms"]["p50"][-1]
    p95 = s["ttft_ms"]["p95"][-1]
    assert 50 / 1.1 <= p50 <= 50 * 1.1 and 95 / 1.1 <= p95 <= 95 * 1.1
    assert s["ttft_ms"]["p50"][0] is None  # no sample: a gap, not 0
    assert s["queue_wait_ms"]["p95"][-1] == 0.0  # most never waited
    assert s["totals"]["ttft_ms"]["p95"] == p95


def test_upstream_429s_are_a_rate() -> None:
    r, clock = ring()
    for _ in range(3):
        r.throttled()
    clock.advance(5)
    assert series(r)["upstream_429_per_sec"][-1] == 0.6
    assert series(r)["totals"]["upstream_429"] == 3


def test_recent_statuses_cover_the_last_minute_and_the_current_bucket() -> None:
    r, clock = ring(span=900.0)
    r.answered(500)
    clock.advance(120)
    r.answered(200)
    clock.advance(70)
    r.answered(502)
    assert r.recent_statuses(60) == {"2xx": 0, "4xx": 0, "429": 0, "5xx": 1}
    assert r.recent_statuses(900) == {"2xx": 1, "4xx": 0, "429": 0, "5xx": 2}


def test_memory_is_bounded_whatever_the_traffic() -> None:
    r, clock = ring(span=900.0)
    for i in range(20000):
        r.ttft((i % 977) / 10)  # 0..97 s: many distinct bins
        r.answered(200, 1, 1)
        clock.advance(0.1)
    buckets = r._buckets
    assert len(buckets) == 181
    assert max(len(b.ttft.bins) for b in buckets) <= BINS


def test_histogram_bins_are_within_ten_percent() -> None:
    for seconds in (0.0011, 0.01, 0.137, 1.0, 9.9, 240.0):
        assert abs(value_of(bin_of(seconds)) / seconds - 1) < 0.1
    assert bin_of(0.0) == 0 and value_of(0) == 0.0
    assert bin_of(10_000.0) == BINS - 1  # beyond the last bin: counted in it


def test_histogram_quantile_ranks() -> None:
    h = Histogram()
    assert h.quantile(0.5) is None
    for _ in range(99):
        h.add(0.010)
    h.add(5.0)
    assert math.isclose(h.quantile(0.99) or 0, value_of(bin_of(0.010)))
    assert math.isclose(h.quantile(1.0) or 0, value_of(bin_of(5.0)))
    other = Histogram()
    other.add(5.0)
    h.merge(other)
    assert h.count == 101 and h.bins[bin_of(5.0)] == 2
