from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from app.billing.ledger import Ledger, UsageEntry
from app.config.schema import DatabaseConfig, LedgerConfig
from app.db.engine import Database
from app.db.usage import UsageBook
from app.errors import RateLimited
from app.limits.admission import Admission, KeyUse, duration
from app.limits.bucket import Limits, Remaining
from app.limits.limit_store import MemoryStore
from app.metrics import Metrics, new_registry
from app.runtime import KeySpec
from tests.support.clock import FakeClock


def unopened_ledger() -> Ledger:
    # Admission only hands entries to the ledger: it never reaches this (unopened) file.
    unused = Database(DatabaseConfig(path=str(Path(tempfile.gettempdir()) / "unused.sqlite3")))
    return Ledger(UsageBook(unused), LedgerConfig())


def admission(divisor: int = 1) -> tuple[Admission, FakeClock]:
    clock = FakeClock()
    store = MemoryStore(clock)
    return Admission(store, Metrics(new_registry()), unopened_ledger(), divisor=divisor), clock


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


async def test_use_reads_a_local_store_live_without_touching_it() -> None:
    adm, clock = admission()
    fresh = adm.use(KEY)
    assert (fresh.source, fresh.remaining) == ("live", (5, 1000))  # never seen: all of it
    await adm.admit(KEY, 400)
    await adm.admit(KEY, 100)
    assert adm.use(KEY).remaining == (3, 500)
    assert adm.use(KEY).remaining == (3, 500)  # reading spends nothing
    clock.advance(12)  # a fifth of a minute refills a fifth of each limit
    assert adm.use(KEY).remaining == (4, 700)
    await adm.admit(KEY, 600)  # and the refill it showed is really there
    assert adm.use(KEY).remaining == (3, 100)


class _SharedStore(MemoryStore):
    """A store whose buckets this process cannot read (as with Redis)."""

    def peek(self, key: str, limits: Limits) -> None:  # type: ignore[override]
        return None


async def test_use_of_a_shared_store_is_the_last_admission_refilled_since() -> None:
    clock = FakeClock()
    adm = Admission(_SharedStore(clock), Metrics(new_registry()), unopened_ledger(), clock=clock)
    assert adm.use(KEY) == KeyUse(Limits(5, 1000), None, "unknown")
    await adm.admit(KEY, 700)
    assert adm.use(KEY) == KeyUse(Limits(5, 1000), Remaining(4, 300), "last_request", 0.0)
    clock.advance(6)
    assert adm.use(KEY) == KeyUse(Limits(5, 1000), Remaining(4, 400), "last_request", 6.0)
    clock.advance(600)
    assert adm.use(KEY).remaining == (5, 1000)  # never above the limit
