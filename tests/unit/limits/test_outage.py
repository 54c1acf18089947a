"""The arithmetic of an outage (`app/limits/outage.py`), on a fake clock: shares of a
limit, buckets seeded from what Redis last said, and what is charged when it is back."""

from __future__ import annotations

import pytest

from app.limits.bucket import Decision, Limits
from app.limits.outage import Fallback
from tests.support.clock import FakeClock

LIMITS = Limits(requests_per_minute=60, tokens_per_minute=6000)


def seen(requests: int, tokens: int) -> Decision:
    return Decision(True, None, 0.0, 60, requests, 0.0, 6000, tokens, 0.0)


def admitted(fb: Fallback, n: int, cost: int = 10) -> int:
    return sum(fb.reserve("k", LIMITS, cost).allowed for _ in range(n))


def test_each_of_four_replicas_enforces_a_quarter_of_the_limit() -> None:
    clock = FakeClock()
    replicas = [Fallback(clock) for _ in range(4)]
    for fb in replicas:
        fb.replicas = 4
    assert [admitted(fb, 100) for fb in replicas] == [15] * 4  # 60 in all, never 4 x 60
    clock.advance(60)
    assert [admitted(fb, 100) for fb in replicas] == [15] * 4  # and refill at a quarter


def test_the_assumed_count_is_a_floor_for_a_replica_that_has_seen_nobody() -> None:
    fb = Fallback(FakeClock(), assumed_replicas=3)
    assert fb.divisor == 3 and admitted(fb, 100) == 20
    fb.replicas = 5
    assert fb.divisor == 5


def test_buckets_start_where_redis_left_them_never_full() -> None:
    clock = FakeClock()
    fb = Fallback(clock)
    fb.replicas = 2
    fb.seen("k", seen(requests=8, tokens=6000))  # the shared bucket had 8 requests left
    clock.advance(10)  # 10 s later Redis goes away: a share refilled 10 s at 30/min
    assert admitted(fb, 100) == 4 + 5
    first = fb.reserve("k", LIMITS, 10)
    assert not first.allowed and first.requests_limit == 30 and first.retry_after == 2.0


def test_a_share_below_one_request_still_refills_at_the_share() -> None:
    clock = FakeClock()
    fb = Fallback(clock)
    fb.replicas = 4
    small = Limits(2, 6000)  # half a request per minute each
    assert [fb.reserve("k", small, 1).allowed for _ in range(3)] == [True, False, False]
    clock.advance(60)
    assert not fb.reserve("k", small, 1).allowed
    clock.advance(60)
    assert fb.reserve("k", small, 1).allowed  # two minutes per request: 2/min over 4


def test_a_request_within_the_limit_but_over_the_share_goes_once_the_share_is_full() -> None:
    fb = Fallback(FakeClock())
    fb.replicas = 4
    big = fb.reserve("k", LIMITS, 4000)  # over the 1500-token share, under the 6000 limit
    assert big.allowed and not big.too_large
    assert not fb.reserve("k", LIMITS, 10).allowed  # the share is in debt now
    huge = fb.reserve("k", LIMITS, 7000)
    assert huge.too_large  # over the whole limit: never


def test_a_short_outage_charges_what_was_admitted() -> None:
    clock = FakeClock()
    fb = Fallback(clock)
    fb.replicas = 2
    fb.seen("k", seen(requests=40, tokens=1000))  # a share of 20 requests, 500 tokens
    assert admitted(fb, 5, cost=100) == 5
    fb.settle("k", LIMITS, -300, 0)  # the answers used 300 tokens fewer than reserved
    clock.advance(5)  # the shared bucket refilled meanwhile too: it pays for all of it
    assert fb.recover(lost=False) == {"k": (LIMITS, 200, 5)}
    assert not fb.active


def test_a_long_outage_charges_no_more_than_the_share_has_spent() -> None:
    clock = FakeClock()
    fb = Fallback(clock)
    fb.replicas = 2
    total = 0
    for _ in range(10):  # ten minutes at the share's full rate
        total += admitted(fb, 100, cost=1)
        clock.advance(60)
    clock.advance(-0.5)
    assert total == 30 * 10
    charged = fb.recover(lost=False)["k"]
    # The shared bucket refilled to full meanwhile; charging 300 would lock the key out for
    # a minute. The share's own deficit (about half a second of refill) is what is spent.
    assert charged[2] == 1


def test_when_redis_lost_its_data_the_deficit_is_charged() -> None:
    clock = FakeClock()
    fb = Fallback(clock)
    fb.replicas = 2
    fb.seen("k", seen(requests=0, tokens=0))  # drained just before the outage
    clock.advance(20)  # 10 requests of refill in the share
    assert admitted(fb, 3, cost=1) == 3
    limits, tokens, requests = fb.recover(lost=True)["k"]
    # The share has 30 - (10 - 3) = 23 requests' deficit: a fresh (full) shared bucket
    # charged that by each of the two replicas ends near what they had left together.
    assert (requests, limits) == (23, LIMITS) and tokens == pytest.approx(2003, abs=1)


def test_refunds_alone_pass_through_and_nothing_is_charged_without_an_outage() -> None:
    fb = Fallback(FakeClock())
    fb.replicas = 1
    fb.settle("k", LIMITS, -50, -1)  # a pre-outage reservation refunded during the outage
    assert fb.recover(lost=False) == {"k": (LIMITS, -50, -1)}
    assert fb.recover(lost=False) == {}


def test_a_limit_changed_live_during_the_outage_keeps_the_fraction_used() -> None:
    fb = Fallback(FakeClock())
    fb.replicas = 2
    assert admitted(fb, 15) == 15  # half the 30-request share
    doubled = Limits(120, 12000)
    assert sum(fb.reserve("k", doubled, 10).allowed for _ in range(100)) == 30


def test_a_flapping_redis_continues_one_bucket_and_never_hands_out_a_fresh_share() -> None:
    clock = FakeClock()
    fb = Fallback(clock)
    fb.replicas = 2
    fb.seen("k", seen(requests=20, tokens=6000))  # a share of 10 requests
    served = 0
    for _ in range(30):  # each call times out, is decided here and charged at once
        served += fb.reserve("k", LIMITS, 10).allowed
        charged = fb.recover(lost=False)
        assert not fb.active and sum(c[2] for c in charged.values()) <= 1
    assert served == 10  # one share for all the flaps, not one per timed-out call
    clock.advance(1)
    fb.seen("k", seen(requests=30, tokens=6000))  # Redis answers: its level never raises it
    assert admitted(fb, 100) == 0
    clock.advance(2)  # two seconds refill a share of 30/min by one request
    assert admitted(fb, 100) == 1


def test_redis_answering_lowers_a_kept_bucket_to_the_shared_level() -> None:
    clock = FakeClock()
    fb = Fallback(clock)
    fb.replicas = 2
    assert admitted(fb, 3) == 3  # an outage: the local bucket has 27 of its 30 left
    fb.recover(lost=False)
    fb.seen("k", seen(requests=4, tokens=6000))  # the other replica spent meanwhile
    assert admitted(fb, 100) == 2  # the next flap starts at 4 / 2, not 27
    clock.advance(120)
    fb.recover(lost=False)  # refilled to full: dropped, a new flap seeds from Redis
    fb.seen("k", seen(requests=10, tokens=6000))
    assert admitted(fb, 100) == 5
