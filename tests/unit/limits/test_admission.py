from __future__ import annotations

import pytest

from app.errors import RateLimited
from app.limits.admission import Admission, duration
from app.limits.ledger import Ledger, UsageEntry
from app.limits.store import MemoryStore
from app.metrics import Metrics, new_registry
from app.runtime import KeySpec
from tests.support.clock import FakeClock


def admission(divisor: int = 1) -> tuple[Admission, FakeClock]:
    clock = FakeClock()
    store = MemoryStore(clock)
    return Admission(store, Metrics(new_registry()), Ledger(path=None), divisor=divisor), clock


KEY = KeySpec("k", ("d",), tokens_per_minute=1000, requests_per_minute=5)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0201, "21ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (59.9, "59.9s"),
        (360, "6m0s"),
        (75.25, "1m15.25s"),
    ],
)
def test_openai_reset_format(seconds: float, text: str) -> None:
    assert duration(seconds) == text


async def test_refusal_is_429_with_retry_after_and_headers() -> None:
    adm, _ = admission()
    for _ in range(5):
        await adm.admit(KEY, 10)
    with pytest.raises(RateLimited) as err:
        await adm.admit(KEY, 10)
    e = err.value
    assert e.code == "rate_limit_exceeded" and e.retry_after == pytest.approx(12.0)
    h = e.response_headers()
    assert h["retry-after"] == "12" and h["retry-after-ms"] == "12000"
    assert h["x-ratelimit-remaining-requests"] == "0" and h["x-should-retry"] == "true"


async def test_request_larger_than_a_minute_says_so() -> None:
    adm, _ = admission()
    with pytest.raises(RateLimited) as err:
        await adm.admit(KEY, 5000)
    assert "more than this key's whole allowance" in err.value.message
    assert err.value.should_retry is False


async def test_settle_moves_the_reservation_to_real_usage() -> None:
    adm, _ = admission()
    ticket = await adm.admit(KEY, 900)  # reserve 900 of 1000
    with pytest.raises(RateLimited):
        await adm.admit(KEY, 200)
    adm.settle(
        ticket,
        UsageEntry("k", "m", prompt_tokens=40, completion_tokens=10),
        dispatched=True,
    )
    await adm.admit(KEY, 900)  # 50 used: room again


async def test_undispatched_request_is_refunded_entirely() -> None:
    adm, _ = admission()
    tickets = [await adm.admit(KEY, 1) for _ in range(5)]
    adm.settle(tickets[0], UsageEntry("k", "m", error=True), dispatched=False)
    await adm.admit(KEY, 1)  # the refunded request slot is usable again


async def test_workers_without_shared_store_split_each_limit() -> None:
    adm, _ = admission(divisor=2)
    assert adm.limits_for(KEY).requests_per_minute == 2
    assert adm.limits_for(KEY).tokens_per_minute == 500
