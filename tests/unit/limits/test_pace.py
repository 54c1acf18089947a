"""The domain pacer's arithmetic on a given clock. Every case taking `make` runs here
through `PaceState` and again, unchanged, through `pace.lua` on a real redis-server in
tests/unit/limits/test_pace_lua.py."""

from __future__ import annotations

import math
from typing import Any, Protocol

import pytest

from app.limits.constants import ACCEPTED_SHARE, BETA, HEADROOM, MIN_STEP
from app.limits.pacing import (
    PaceState,
    RateHeaders,
    Throttle,
    parse_duration,
    rate_headers,
)
from app.upstream.attempt import parse_retry_after

MS = 0.0015  # the Lua side answers in whole milliseconds


class Pace(Protocol):
    def reserve(self, now: float, requests: int = 1, tokens: int = 0) -> float: ...
    def throttled(
        self, now: float, wait: float | None, sent_at: float, accepted: float
    ) -> bool: ...
    def observe(self, now: float, headers: RateHeaders) -> None: ...
    def rate(self, now: float) -> float | None: ...
    def cooling(self, now: float) -> float: ...


class PyPace:
    def __init__(self, rpm: float | None, tpm: float | None, window: float) -> None:
        self.state = PaceState(rpm, tpm, window)

    def reserve(self, now: float, requests: int = 1, tokens: int = 0) -> float:
        return self.state.reserve(now, requests, tokens)

    def throttled(self, now: float, wait: float | None, sent_at: float, accepted: float) -> bool:
        return self.state.throttled(now, Throttle(wait, sent_at), accepted)

    def observe(self, now: float, headers: RateHeaders) -> None:
        self.state.observe(now, headers)

    def rate(self, now: float) -> float | None:
        return self.state.rate(now)

    def cooling(self, now: float) -> float:
        return max(0.0, self.state.cool_until - now)


@pytest.fixture
def make() -> Any:
    """`make(rpm, tpm, window)` -> a pacer of the kind under test."""
    return PyPace


def grants(pace: Pace, count: int, at: float = 1000.0) -> list[float]:
    """When each of `count` requests booked at once may go."""
    return [at + pace.reserve(at) for _ in range(count)]


def most_in_any(times: list[float], span: float) -> int:
    times = sorted(times)
    return max(sum(1 for t in times[i:] if t < start + span) for i, start in enumerate(times))


def test_unbounded_books_nothing(make: Any) -> None:
    pace = make(None, None, 1.0)
    assert pace.reserve(1000.0) == 0 and pace.rate(1000.0) is None


def test_no_window_gets_more_than_its_share_of_the_quota(make: Any) -> None:
    # 600/min counted per 1-s window: 10 at most in any second, 9.8/s sustained (98 %).
    times = grants(make(600, None, 1.0), 60)
    assert most_in_any(times, 1.0) <= 10
    assert most_in_any(times, 1.0 + 0.02) <= 10  # ... with 20 ms to spare for jitter
    assert times[0] == pytest.approx(1000.0)  # an idle domain sends at once
    sustained = 59 / (times[-1] - times[0])
    assert sustained == pytest.approx(9.8, rel=2e-3)


def test_a_longer_window_allows_a_bigger_burst(make: Any) -> None:
    times = grants(make(6000, None, 10.0), 200)
    burst = sum(1 for t in times if t <= 1000.0 + MS)
    assert burst == 49  # 5 % of the 980 a 10-s window holds at 98 %
    assert most_in_any(times, 10.0) <= 1000


def test_tokens_are_spaced_and_a_huge_request_goes_alone(make: Any) -> None:
    pace = make(None, 60_000, 1.0)  # 1000 tokens/s
    first = pace.reserve(1000.0, 0, 5_000)
    second = pace.reserve(1000.0, 0, 5_000)
    assert first == 0
    assert second >= 4.0  # the first one's tokens had to drain first


def test_a_first_429_aims_under_what_the_upstream_accepted(make: Any) -> None:
    pace = make(None, None, 1.0)
    assert pace.throttled(1000.0, 0.4, 999.9, accepted=10.0)
    assert pace.cooling(1000.0) == pytest.approx(0.4, abs=MS)
    assert pace.rate(1000.4) == pytest.approx(ACCEPTED_SHARE * 10.0, rel=1e-3)
    assert pace.reserve(1000.1) == pytest.approx(0.3, abs=MS)  # nothing before the end


def test_in_flight_429s_of_one_overload_are_one_episode(make: Any) -> None:
    pace = make(None, None, 1.0)
    assert pace.throttled(1000.0, 0.5, 999.9, accepted=10.0)
    learned = pace.rate(1000.5)
    # Sent before the cool-down ended: the same overload, answered a bit later.
    assert not pace.throttled(1000.05, 0.8, 999.95, accepted=3.0)
    assert pace.rate(1000.5) == pytest.approx(learned, rel=1e-3)
    assert pace.cooling(1000.05) == pytest.approx(0.8, abs=MS)  # the longer wait counts


def test_one_429_cools_the_domain_down_for_a_minute_at_most(make: Any) -> None:
    pace = make(None, None, 1.0)
    assert pace.throttled(1000.0, 3600.0, 999.9, accepted=5.0)
    assert pace.cooling(1000.0) == pytest.approx(60.0, abs=MS)
    assert not pace.throttled(1000.1, 7200.0, 999.95, accepted=5.0)  # same episode
    assert pace.cooling(1000.1) == pytest.approx(60.0, abs=MS)


def test_without_a_measure_the_rate_drops_by_beta(make: Any) -> None:
    pace = make(1200, None, 1.0)
    assert pace.throttled(1000.0, 0.1, 999.9, accepted=0.0)
    assert pace.rate(1000.1) == pytest.approx(BETA * 1200 / 60 * HEADROOM, rel=1e-3)


def test_a_429_never_raises_the_rate(make: Any) -> None:
    pace = make(120, None, 1.0)  # ~1.96/s configured; the upstream seemed to take 10/s
    assert pace.throttled(1000.0, 0.1, 999.9, accepted=10.0)
    assert pace.rate(1000.1) == pytest.approx(120 / 60 * HEADROOM, rel=1e-3)


def test_bare_429s_back_off_from_one_second_doubling_while_nothing_gets_through(
    make: Any,
) -> None:
    pace = make(None, None, 1.0)
    assert pace.throttled(1000.0, None, 999.9, accepted=10.0)
    assert pace.cooling(1000.0) == pytest.approx(1.0, abs=MS)
    assert pace.throttled(1001.2, None, 1001.1, accepted=0.0)  # nothing accepted since
    assert pace.cooling(1001.2) == pytest.approx(2.0, abs=MS)
    assert pace.throttled(1003.3, None, 1003.25, accepted=0.0)
    assert pace.cooling(1003.3) == pytest.approx(4.0, abs=MS)
    # Answers got through since that cool-down: the next episode starts from 1 s again
    # (a pace climbing back to the quota ends each climb with one 429).
    assert pace.throttled(1010.0, None, 1009.9, accepted=5.0)
    assert pace.cooling(1010.0) == pytest.approx(1.0, abs=MS)


def test_the_learned_rate_grows_back_linearly_to_the_ceiling(make: Any) -> None:
    pace = make(600, None, 1.0)
    ceiling = 600 / 60 * HEADROOM
    assert pace.throttled(1000.0, 1.0, 999.9, accepted=4.0)
    learned = ACCEPTED_SHARE * 4.0
    assert pace.rate(1001.0) == pytest.approx(learned, rel=1e-3)  # growth starts at the end
    assert pace.rate(1003.0) == pytest.approx(learned + 2 * MIN_STEP, rel=1e-3)
    assert pace.rate(1100.0) == pytest.approx(ceiling, rel=1e-3)


def test_without_a_ceiling_a_rate_that_doubled_is_forgotten(make: Any) -> None:
    pace = make(None, None, 1.0)
    assert pace.throttled(1000.0, 0.5, 999.9, accepted=10.0)  # learned 9/s from 1000.5
    assert pace.rate(1010.0) == pytest.approx(9.0 + 0.27 * 9.5, rel=1e-3)
    assert pace.rate(1034.0) is None  # 9 + 0.27 x 33.5 > 18: unbounded again
    assert pace.reserve(1034.0) == 0


def test_advertised_limits_lower_the_ceiling_and_an_empty_remaining_pauses(make: Any) -> None:
    pace = make(1200, None, 1.0)
    pace.observe(1000.0, RateHeaders(limit_requests=600))
    assert pace.rate(1000.0) == pytest.approx(600 / 60 * HEADROOM, rel=1e-3)
    pace.observe(1000.0, RateHeaders(remaining_requests=0, reset_requests=0.3))
    assert pace.cooling(1000.0) == pytest.approx(0.3, abs=MS)
    # A per-minute bucket's reset is its full refill: one window's pause is enough.
    pace.observe(1001.0, RateHeaders(remaining_requests=0, reset_requests=45.0))
    assert pace.cooling(1001.0) == pytest.approx(1.0, abs=MS)


# -- header parsing (Python only: the gateway parses, the script gets numbers) ---------------
@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0.25", 0.25),
        ("", None),
        ("soon", None),
        ("5x", None),
        ("12", 12.0),
    ],
)
def test_reset_durations(raw: str, seconds: float | None) -> None:
    parsed = parse_duration(raw)
    assert parsed == (None if seconds is None else pytest.approx(seconds))


def test_rate_headers_are_read_only_when_sent() -> None:
    assert rate_headers({"content-type": "application/json"}) is None
    parsed = rate_headers(
        {
            "x-ratelimit-limit-requests": "600",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "120ms",
            "x-ratelimit-limit-tokens": "nan",
        }
    )
    assert parsed is not None
    assert (parsed.limit_requests, parsed.limit_tokens) == (600, None)
    assert parsed.exhausted_for == pytest.approx(0.12)
    assert not math.isnan(parsed.limit_requests or 0)


def test_high_rates_keep_their_spacing_on_an_epoch_clock(make: Any) -> None:
    # Seconds since 1970 leave few digits for fractions: stored times must keep them all.
    times = grants(make(30_000, None, 1.0), 3000, at=1.7e9)
    rate = 30_000 / 60 * HEADROOM
    burst = math.floor(0.05 * rate)
    sustained = (len(times) - burst) / (times[-1] - times[0])
    assert sustained == pytest.approx(rate - (burst - 1), rel=1e-3)
    assert most_in_any(times, 1.0) <= 500  # under the real quota, 500 a second


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after": "inf"}, None),
        ({"retry-after-ms": "1e400"}, None),
        ({"retry-after": "nan", "retry-after-ms": "nan"}, None),
        ({"retry-after-ms": "x", "retry-after": "2"}, 2.0),
        ({"retry-after": "-3"}, 0.0),
    ],
)
def test_only_finite_waits_are_hints(headers: dict[str, str], wait: float | None) -> None:
    assert parse_retry_after(headers) == wait


def test_absurd_advertised_values_are_ignored() -> None:
    assert parse_duration("9" * 400 + "s") is None
    state = PaceState(600, None, 1.0)
    state.observe(1000.0, RateHeaders(limit_requests=1e-7))  # not a limit anyone means
    assert state.rate(1000.0) == pytest.approx(600 / 60 * HEADROOM)
