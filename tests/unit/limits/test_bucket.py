"""Token-bucket arithmetic with an injected clock (no sleeps)."""

from __future__ import annotations

import math

from app.limits.bucket import Bucket, decide


def pair(rpm: int = 60, tpm: int = 600, now: float = 0.0) -> tuple[Bucket, Bucket]:
    return Bucket.full(rpm, now), Bucket.full(tpm, now)


def test_admits_until_empty_then_refuses_with_exact_wait() -> None:
    r, t = pair(rpm=3)
    assert all(decide(r, t, 1, 0.0).allowed for _ in range(3))
    d = decide(r, t, 1, 0.0)
    assert not d.allowed and d.limit == "requests"
    assert math.isclose(d.retry_after, 20.0)  # 3/min refills one request every 20 s
    assert decide(r, t, 1, 19.9).allowed is False
    assert decide(r, t, 1, 20.0).allowed is True


def test_a_refused_request_uses_up_nothing() -> None:
    r, t = pair(rpm=10, tpm=100)
    assert decide(r, t, 90, 0.0).allowed
    before = (r.level, t.level)
    d = decide(r, t, 50, 0.0)  # tokens refuse; the request bucket must not be charged
    assert not d.allowed and d.limit == "tokens"
    assert (r.level, t.level) == before


def test_refill_is_continuous_and_capped_at_capacity() -> None:
    r, t = pair(tpm=600)
    decide(r, t, 600, 0.0)
    t.refill(30.0)
    assert math.isclose(t.level, 300.0)
    t.refill(1000.0)
    assert t.level == 600.0


def test_more_than_a_minute_of_tokens_can_never_fit() -> None:
    r, t = pair(tpm=100)
    d = decide(r, t, 101, 0.0)
    assert not d.allowed and d.too_large and math.isinf(d.retry_after)


def test_debit_may_go_into_debt_bounded_by_one_capacity() -> None:
    b = Bucket.full(100, 0.0)
    b.debit(150)
    assert b.level == -50
    b.debit(1000)
    assert b.level == -100
    b.debit(-10_000)  # a refund never overfills
    assert b.level == 100


def test_headers_report_remaining_and_time_to_full() -> None:
    r, t = pair(rpm=60, tpm=600)
    d = decide(r, t, 60, 0.0)
    assert (d.requests_remaining, d.tokens_remaining) == (59, 540)
    assert math.isclose(d.requests_reset, 1.0) and math.isclose(d.tokens_reset, 6.0)


def test_resize_keeps_the_fraction_used() -> None:
    b = Bucket.full(100, 0.0)
    b.debit(50)
    b.resize(200)
    assert (b.capacity, b.level) == (200, 100)
