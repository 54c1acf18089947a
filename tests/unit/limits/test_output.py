"""The output reservation of `reserve_output = "estimate"`: a percentile of the key's
recent completions per model, capped by max_tokens, the default until enough are known."""

from __future__ import annotations

import math
import random

from app.limits.output import MAX_SERIES, MIN_SAMPLES, SAMPLES, OutputEstimator


def test_the_default_holds_until_enough_answers_are_known() -> None:
    est = OutputEstimator(0.95)
    for _ in range(MIN_SAMPLES - 1):
        est.observe("k", "m", 300)
    assert est.reserve("k", "m", 128_000, 1024) == 1024
    assert est.reserve("k", "m", 500, 1024) == 500  # capped by max_tokens
    est.observe("k", "m", 300)
    assert est.reserve("k", "m", 128_000, 1024) == 300


def test_the_percentile_of_recent_answers_is_reserved_capped_by_max_tokens() -> None:
    est = OutputEstimator(0.95)
    for size in range(1, 101):  # 1..100 tokens
        est.observe("k", "m", size)
    assert est.reserve("k", "m", None, 1024) == 95
    assert est.reserve("k", "m", 50, 1024) == 50
    assert est.reserve("k", "other-model", None, 1024) == 1024  # per model
    assert est.reserve("other-key", "m", None, 1024) == 1024  # per key


def test_only_the_last_samples_count() -> None:
    est = OutputEstimator(1.0)
    est.observe("k", "m", 10_000)
    for _ in range(SAMPLES):
        est.observe("k", "m", 200)
    assert est.reserve("k", "m", None, 1024) == 200  # the outlier aged out


def test_the_number_of_series_is_bounded() -> None:
    est = OutputEstimator()
    for i in range(MAX_SERIES + 10):
        est.observe(f"k{i}", "m", 1)
    assert len(est._series) == MAX_SERIES
    assert est.estimate("k0", "m") is None  # the least recently seen went first


def test_the_estimate_is_the_percentile_of_exactly_the_last_samples() -> None:
    """The ordered copy kept as samples come and go answers as sorting them would."""
    rng = random.Random(7)
    for percentile in (0.5, 0.95, 1.0):
        est = OutputEstimator(percentile)
        seen: list[int] = []
        for _ in range(3 * SAMPLES + 17):
            value = rng.choice((0, 1, 5, 5, 5, 64, 300, 301, 4096, -3))
            est.observe("k", "m", value)
            seen.append(max(0, value))
            last = sorted(seen[-SAMPLES:])
            rank = max(0, math.ceil(percentile * len(last)) - 1)
            want = last[rank] if len(last) >= MIN_SAMPLES else None
            assert est.estimate("k", "m") == want
