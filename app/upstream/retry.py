"""Retries, in exactly one place (tenacity is banned elsewhere by ruff).

Rule: an attempt is retried only if it failed with a connection error, a timeout, a
reset, or status 429/500/502/503/504, while attempts remain (`Runtime.attempts`) and
the domain's retry budget allows. The wait is exponential with full jitter,
`uniform(0, min(max_backoff, backoff * 2**(n-1)))`, unless the upstream sent
`retry-after-ms`/`Retry-After`: that is honoured exactly, and one longer than
`max_retry_after_ms` ends retrying at once (waiting would outlive the client).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from app.upstream.attempt import AttemptFailed
from app.upstream.budget import RetryBudget

T = TypeVar("T")


@dataclass(frozen=True)
class RetrySpec:
    attempts: int
    backoff: float
    max_backoff: float
    max_retry_after: float


def _failure(state: RetryCallState) -> AttemptFailed | None:
    outcome = state.outcome
    if outcome is None or not outcome.failed:
        return None
    exc = outcome.exception()
    return exc if isinstance(exc, AttemptFailed) else None


def backoff_wait(spec: RetrySpec, attempt: int, failure: AttemptFailed | None) -> float:
    if failure is not None and failure.retry_after is not None:
        return failure.retry_after
    ceiling = min(spec.max_backoff, spec.backoff * 2 ** (attempt - 1))
    return random.uniform(0, ceiling)


async def call_with_retries(
    attempt: Callable[[int], Awaitable[T]],
    spec: RetrySpec,
    budget: RetryBudget,
    on_retry: Callable[[AttemptFailed], None],
) -> T:
    """Run `attempt(n)` (n = 1, 2, ...) until it returns or retrying must stop.

    The first attempt runs outside tenacity: most requests succeed at once, and building
    a retry controller costs more than the rest of the hot path. Its failure is then
    replayed to tenacity as attempt 1, so every decision is still tenacity's.
    """
    try:
        return await attempt(1)
    except AttemptFailed as failure:
        if not failure.retryable or spec.attempts <= 1:
            raise
        first = failure

    def stop(state: RetryCallState) -> bool:
        failure = _failure(state)
        if state.attempt_number >= spec.attempts or failure is None:
            return True
        if failure.retry_after is not None and failure.retry_after > spec.max_retry_after:
            return True
        return not budget.try_spend()

    def before_sleep(state: RetryCallState) -> None:
        failure = _failure(state)
        if failure is not None:
            on_retry(failure)

    retrying = AsyncRetrying(
        stop=stop,
        wait=lambda s: backoff_wait(spec, s.attempt_number, _failure(s)),
        retry=retry_if_exception(lambda e: isinstance(e, AttemptFailed) and e.retryable),
        before_sleep=before_sleep,
        reraise=True,
    )
    result: T = await retrying(_numbered(attempt, first))
    return result


def _numbered(
    attempt: Callable[[int], Awaitable[T]], first: AttemptFailed
) -> Callable[[], Awaitable[T]]:
    count = 0

    async def run() -> T:
        nonlocal count
        count += 1
        if count == 1:
            raise first
        return await attempt(count)

    return run
