"""Retries, in exactly one place (tenacity is banned elsewhere by ruff).

Rule: an attempt is retried only if it failed with a connection error, a timeout, a
reset, or status 500/502/503/504 (`AttemptFailed.retryable`), and never, by default,
when the upstream may have acted on it (`AttemptFailed.ambiguous`: the request was
written and no answer saying it failed came back; a re-send could bill it twice), unless
`retry_policy.retry_unanswered` says availability matters more (`RetrySpec.may_resend`,
which the pipeline also asks before sending the request to another domain or model),
while attempts remain
(`Runtime.attempts`) and the domain's retry budget allows (`RetryBudget.try_spend`,
asked last, so a retry the other rules refuse spends nothing). The wait is exponential
with full jitter, `uniform(0, min(max_backoff, backoff * 2**(n-1)))` (tenacity's
`wait_random_exponential`), unless the upstream sent `retry-after-ms`/`Retry-After`:
that is honoured exactly, and one longer than `max_retry_after_ms` ends retrying at
once (waiting would outlive the client). `on_retry` hears of each failure that is
retried, before the wait.

The first attempt is made directly: only a failure can be retried, so tenacity has
nothing to decide before one, and building its controller for every request (most of
which succeed at once) cost about 11 µs each (deploy/BENCHMARKS.md). On the first
failure `call_with_retries` builds tenacity's controller, hands it that failure as the
outcome of attempt 1 (with the time the call began), and from then on asks it what to
do next (sleep, or raise the last failure) and does it. The policy (stop, wait, the
retry predicate, the hook) is built once per `RetrySpec`; per retried call only the
controller is made, as tenacity's own decorator does, since it keeps scratch state of
the call in progress. What differs per call (the domain's budget, the hook) reaches the
shared policy as the call's argument, which tenacity keeps in `RetryCallState.args`.

The controller is tenacity's synchronous `Retrying`, driven by an async loop, rather
than `AsyncRetrying`: the decisions are the same synchronous code either way, but
`AsyncRetrying` wraps and inspects every callback at every step, which cost more than
the rest of a request's retry handling together. A success ends the loop at once:
only failures are ever retried, so asking tenacity about a result could only say stop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tenacity import DoSleep, RetryCallState, Retrying, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base
from tenacity.wait import wait_base, wait_random_exponential

from app.upstream.attempt import AttemptFailed
from app.upstream.budget import RetryBudget

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Call:
    """What the shared policy needs to know of one call: whose budget, whom to tell."""

    budget: RetryBudget
    on_retry: Callable[[AttemptFailed], None]


def _call(state: RetryCallState) -> _Call:
    call: _Call = state.args[0]
    return call


def _failure(state: RetryCallState) -> AttemptFailed | None:
    outcome = state.outcome
    if outcome is None or not outcome.failed:
        return None
    exc = outcome.exception()
    return exc if isinstance(exc, AttemptFailed) else None


class _RetryAfterOr(wait_base):
    """The upstream's own wait when it sent one, else the jittered backoff."""

    def __init__(self, backoff: wait_base) -> None:
        self.backoff = backoff

    def __call__(self, retry_state: RetryCallState) -> float:
        failure = _failure(retry_state)
        if failure is not None and failure.retry_after is not None:
            return failure.retry_after
        return self.backoff(retry_state)


class _RetryAfterBeyond(stop_base):
    """Stop when the upstream asks for a longer wait than the client would sit out."""

    def __init__(self, longest: float) -> None:
        self.longest = longest

    def __call__(self, retry_state: RetryCallState) -> bool:
        failure = _failure(retry_state)
        return failure is None or (
            failure.retry_after is not None and failure.retry_after > self.longest
        )


class _BudgetSpent(stop_base):
    """Stop when the domain's retry budget has nothing left; a retry spends from it."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        return not _call(retry_state).budget.try_spend()


def _before_sleep(state: RetryCallState) -> None:
    failure = _failure(state)
    if failure is not None:
        _call(state).on_retry(failure)


@dataclass(frozen=True)
class RetrySpec:
    attempts: int
    backoff: float
    max_backoff: float
    max_retry_after: float
    retry_unanswered: bool = False  # re-send ambiguous failures too (may bill twice)
    # tenacity's policy for these numbers, built once (the budget is asked last)
    stop: stop_base = field(init=False, repr=False, compare=False)
    wait: wait_base = field(init=False, repr=False, compare=False)
    retry: retry_if_exception = field(init=False, repr=False, compare=False)

    def may_resend(self, failure: AttemptFailed) -> bool:
        """May this request go out again, here or elsewhere, after `failure`? Never,
        by default, when the upstream may have acted on it."""
        return not failure.ambiguous or self.retry_unanswered

    def _retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, AttemptFailed) and exc.retryable and self.may_resend(exc)

    def __post_init__(self) -> None:
        stop = (
            stop_after_attempt(self.attempts)
            | _RetryAfterBeyond(self.max_retry_after)
            | _BudgetSpent()
        )
        jitter = wait_random_exponential(multiplier=self.backoff, max=self.max_backoff)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "wait", _RetryAfterOr(jitter))
        object.__setattr__(self, "retry", retry_if_exception(self._retryable))


async def call_with_retries(
    attempt: Callable[[int], Awaitable[T]],
    spec: RetrySpec,
    budget: RetryBudget,
    on_retry: Callable[[AttemptFailed], None],
) -> T:
    """Run `attempt(n)` (n = 1, 2, ...) until it returns or retrying must stop; the last
    failure is raised as it came (tenacity's `reraise`)."""
    started = time.monotonic()
    try:
        return await attempt(1)
    except BaseException as exc:  # tenacity's to judge, cancellation included
        first = exc
    return await retry_after(first, started, attempt, spec, budget, on_retry)


async def retry_after(
    first: BaseException,
    started: float,
    attempt: Callable[[int], Awaitable[T]],
    spec: RetrySpec,
    budget: RetryBudget,
    on_retry: Callable[[AttemptFailed], None],
) -> T:
    """`call_with_retries` once its first attempt, started at `started` (monotonic), failed
    with `first`. A caller on the hot path runs attempt 1 itself and comes here only on a
    failure: an answer then has one coroutine frame less to pass through."""
    controller = Retrying(
        stop=spec.stop, wait=spec.wait, retry=spec.retry, before_sleep=_before_sleep, reraise=True
    )
    controller.begin()
    state = RetryCallState(controller, None, (_Call(budget, on_retry),), {})
    state.start_time = started
    state.set_exception((type(first), first, first.__traceback__))
    while True:
        # A failure is the outcome to judge: tenacity answers how long to sleep before
        # the next attempt, or raises that failure because retrying stops.
        do = controller.iter(state)
        assert isinstance(do, DoSleep)  # a failed outcome never asks for an attempt at once
        state.prepare_for_next_attempt()
        await asyncio.sleep(do)
        try:
            return await attempt(state.attempt_number)
        except BaseException as exc:  # tenacity's to judge, cancellation included
            state.set_exception((type(exc), exc, exc.__traceback__))


def backoff_delay(failed: int, backoff: float, max_backoff: float) -> float:
    """The wait after the `failed`-th failed try (1, 2, ...) under the same policy as an
    upstream retry: exponential with full jitter, `uniform(0, min(max_backoff, backoff *
    2**(failed-1)))`. For work retried across time (spend alerts' webhooks), whose
    schedule is kept in the database rather than in a running loop."""
    state = RetryCallState(Retrying(), None, (), {})
    state.attempt_number = failed
    return float(wait_random_exponential(multiplier=backoff, max=max_backoff)(state))
