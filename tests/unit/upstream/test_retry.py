"""The retry rule: what is retried, how long it waits, when it stops."""

from __future__ import annotations

import asyncio

import pytest
from tenacity import RetryCallState, Retrying

from app.upstream import retry
from app.upstream.attempt import AttemptFailed, Reason, parse_retry_after, status_failure
from app.upstream.budget import RetryBudget
from app.upstream.retry import RetrySpec, call_with_retries
from tests.support.clock import FakeClock

SPEC = RetrySpec(attempts=3, backoff=0.0001, max_backoff=0.0002, max_retry_after=1.0)


def budget(min_retries: int = 100, ratio: float = 1.0) -> RetryBudget:
    return RetryBudget(ratio, 10, min_retries, clock=FakeClock())


def backoff_wait(spec: RetrySpec, attempt: int, failure: AttemptFailed | None) -> float:
    """The wait the spec's tenacity policy takes after attempt `attempt` failed."""
    state = RetryCallState(Retrying(), None, (), {})
    state.attempt_number = attempt
    if failure is not None:
        state.set_exception((type(failure), failure, None))
    return spec.wait(state)


async def run(
    failures: list[AttemptFailed], spec: RetrySpec = SPEC, b: RetryBudget | None = None
) -> tuple[str | AttemptFailed, list[int]]:
    calls: list[int] = []

    async def attempt(n: int) -> str:
        calls.append(n)
        if failures:
            raise failures.pop(0)
        return "ok"

    try:
        return await call_with_retries(attempt, spec, b or budget(), lambda f: None), calls
    except AttemptFailed as exc:
        return exc, calls


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_retryable_statuses(status: int) -> None:
    assert status_failure(status, b"", "application/json", {}).retryable


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after-ms": "250", "retry-after": "1"}, 0.25),
        ({"retry-after": "2"}, 2.0),
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.5s"}, 1.5),
        ({"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "1.5s"}, None),
        ({}, None),
    ],
)
def test_a_429_is_flow_control_with_the_upstreams_wait(
    headers: dict[str, str], wait: float | None
) -> None:
    # Never retried in place (the pipeline requeues it) and never an upstream fault.
    failure = status_failure(429, b'{"error":{"code":"rate_limit_exceeded"}}', "x", headers)
    assert failure.reason == "throttled" and not failure.retryable
    assert not failure.upstream_fault
    assert failure.retry_after == wait


@pytest.mark.parametrize(
    "body",
    [
        b'{"error":{"message":"You exceeded your current quota","type":"insufficient_quota",'
        b'"param":null,"code":"insufficient_quota"}}',
        b'{"error":{"type":"billing","code":"insufficient_quota"}}',
    ],
)
def test_an_empty_balance_is_told_apart_from_a_rate_limit(body: bytes) -> None:
    failure = status_failure(429, body, "application/json", {"retry-after": "1"})
    assert failure.reason == "insufficient_quota"
    assert not failure.retryable and not failure.moves_on and not failure.upstream_fault


@pytest.mark.parametrize("body", [b"insufficient_quota", b'["insufficient_quota"]', b"{}"])
def test_a_mention_of_insufficient_quota_outside_the_error_is_a_rate_limit(body: bytes) -> None:
    assert status_failure(429, body, "text/plain", {}).reason == "throttled"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422])
def test_other_4xx_are_not_retried(status: int) -> None:
    assert not status_failure(status, b"", "application/json", {}).retryable


async def test_transient_failures_then_success() -> None:
    fail = AttemptFailed(Reason.STATUS_503, retryable=True)
    result, calls = await run([fail, fail])
    assert result == "ok" and calls == [1, 2, 3]


async def test_stops_after_max_attempts_with_the_last_failure() -> None:
    fails = [AttemptFailed(Reason.CONNECT, retryable=True) for _ in range(5)]
    result, calls = await run(fails)
    assert isinstance(result, AttemptFailed) and calls == [1, 2, 3]


async def test_non_retryable_is_raised_at_once() -> None:
    result, calls = await run([AttemptFailed(Reason.STATUS_4XX, retryable=False)])
    assert isinstance(result, AttemptFailed) and calls == [1]


async def test_a_retry_after_beyond_the_cap_stops_retrying() -> None:
    long_wait = AttemptFailed(Reason.STATUS_503, retryable=True, retry_after=5.0)
    result, calls = await run([long_wait])
    assert isinstance(result, AttemptFailed) and calls == [1]


async def test_exhausted_budget_stops_retrying() -> None:
    result, calls = await run(
        [AttemptFailed(Reason.TIMEOUT, retryable=True)] * 3, b=budget(min_retries=0, ratio=0.0)
    )
    assert isinstance(result, AttemptFailed) and calls == [1]


def test_backoff_is_full_jitter_capped_and_retry_after_wins() -> None:
    spec = RetrySpec(attempts=10, backoff=0.5, max_backoff=8.0, max_retry_after=20)
    waits = [backoff_wait(spec, n, None) for n in range(1, 12) for _ in range(50)]
    assert all(0 <= w <= 8.0 for w in waits) and max(waits) > 4.0
    assert all(backoff_wait(spec, 1, None) <= 0.5 for _ in range(50))
    assert (
        backoff_wait(spec, 1, AttemptFailed(Reason.STATUS_503, retryable=True, retry_after=1.5))
        == 1.5
    )


def test_retry_after_headers_ms_first() -> None:
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None


def test_budget_allows_a_ratio_of_recent_requests(clock: FakeClock) -> None:
    b = RetryBudget(0.2, 10, 1, clock=clock)
    for _ in range(10):
        b.record_request()
    assert sum(b.try_spend() for _ in range(10)) == 3  # 1 + 0.2 x 10
    clock.now = 11.0  # the window slid past them
    assert b.try_spend() is True


def test_a_misspelt_reason_fails_loudly_and_a_reason_reads_as_its_label() -> None:
    with pytest.raises(ValueError):
        AttemptFailed("status_05", retryable=True)  # type: ignore[arg-type]
    failure = AttemptFailed("status_503", retryable=True, detail="d")  # type: ignore[arg-type]
    assert failure.reason is Reason.STATUS_503 and str(failure) == "status_503: d"
    assert f"{Reason.STATUS_5XX}" == str(Reason.STATUS_5XX) == "status_5xx"


async def test_each_retry_is_told_before_its_wait_and_only_retries_spend_budget() -> None:
    events: list[object] = []
    fails = [AttemptFailed(Reason.RESET, retryable=True) for _ in range(2)]

    async def attempt(n: int) -> str:
        events.append(n)
        if fails:
            raise fails.pop(0)
        return "ok"

    b = budget(min_retries=2, ratio=0.0)
    assert await call_with_retries(attempt, SPEC, b, lambda f: events.append(f.reason)) == "ok"
    assert events == [1, Reason.RESET, 2, Reason.RESET, 3]
    assert not b.try_spend()  # both retries were paid for
    b = budget(min_retries=1, ratio=0.0)
    await run([AttemptFailed(Reason.STATUS_503, retryable=True, retry_after=5.0)], b=b)
    await run([AttemptFailed(Reason.STATUS_4XX, retryable=False)], b=b)
    assert b.try_spend()  # neither stop spent the one retry allowed


async def test_concurrent_calls_keep_their_own_attempts() -> None:
    async def one() -> tuple[str | AttemptFailed, list[int]]:
        return await run([AttemptFailed(Reason.TIMEOUT, retryable=True) for _ in range(2)])

    results = await asyncio.gather(*(one() for _ in range(20)))
    assert all(r == ("ok", [1, 2, 3]) for r in results)


async def test_a_first_attempt_that_succeeds_never_asks_tenacity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Most requests succeed at once: their attempt runs without building tenacity's
    controller, which only a failure needs."""
    built: list[object] = []

    class Counted(Retrying):
        def __init__(self, *args: object, **kwargs: object) -> None:
            built.append(self)
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(retry, "Retrying", Counted)
    result, calls = await run([])
    assert result == "ok" and calls == [1] and built == []
    result, calls = await run([AttemptFailed(Reason.RESET, retryable=True)] * 2)
    assert result == "ok" and calls == [1, 2, 3] and len(built) == 1


async def test_a_cancelled_attempt_is_not_retried() -> None:
    calls: list[int] = []

    async def attempt(n: int) -> str:
        calls.append(n)
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await call_with_retries(attempt, SPEC, budget(), lambda f: None)
    assert calls == [1]


# -- the resend rule: never twice where the upstream may have acted ----------------------------


def ambiguous(reason: Reason = Reason.RESET) -> AttemptFailed:
    return AttemptFailed(reason, retryable=True, ambiguous=True)


@pytest.mark.parametrize("reason", [Reason.RESET, Reason.TIMEOUT, Reason.BAD_RESPONSE])
async def test_an_ambiguous_failure_is_not_retried_by_default(reason: Reason) -> None:
    result, calls = await run([ambiguous(reason), ambiguous(reason)])
    assert isinstance(result, AttemptFailed) and result.reason is reason
    assert calls == [1]
    assert not SPEC.may_resend(ambiguous(reason))


async def test_a_failure_before_anything_was_sent_is_retried() -> None:
    nothing_sent = AttemptFailed(Reason.CONNECT, retryable=True)
    assert SPEC.may_resend(nothing_sent)
    result, calls = await run([nothing_sent, nothing_sent])
    assert (result, calls) == ("ok", [1, 2, 3])


async def test_retry_unanswered_retries_ambiguous_failures_too() -> None:
    spec = RetrySpec(
        attempts=3, backoff=0.0001, max_backoff=0.0002, max_retry_after=1.0, retry_unanswered=True
    )
    assert spec.may_resend(ambiguous())
    result, calls = await run([ambiguous(), ambiguous(Reason.TIMEOUT)], spec)
    assert (result, calls) == ("ok", [1, 2, 3])
