"""Retry hints on every error class: retry-after(-ms) and x-should-retry."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.errors import (
    AuthenticationFailed,
    InvalidRequest,
    PayloadTooLarge,
    RateLimited,
    ServiceUnavailable,
    UpstreamFailed,
    UpstreamQuotaExhausted,
    UpstreamRejected,
    UpstreamTimeout,
)
from app.gateway import Gateway
from app.pipeline.trace import Attempt, Trace
from app.upstream.attempt import AttemptFailed, Reason
from tests.support.inproc import MakeGateway


@pytest.fixture
def proxy(make_local_gateway: MakeGateway) -> Callable[..., Gateway]:
    def build(mode: str = "cooperate") -> Gateway:
        return make_local_gateway({"retry_policy": {"client_retries": mode}})

    return build


def trace(n: int = 3) -> Trace:
    t = Trace("r", "k", "chat", "m", False, 0.0)
    t.attempts = [Attempt(i + 1, "d", "m", "x", 1.0) for i in range(n)]
    return t


def test_retry_after_is_integer_seconds_rounded_up_and_exact_ms() -> None:
    h = RateLimited("x", retry_after=1.2).response_headers()
    assert (h["retry-after"], h["retry-after-ms"]) == ("2", "1200")
    h = ServiceUnavailable("x", retry_after=0.05).response_headers()
    assert (h["retry-after"], h["retry-after-ms"]) == ("1", "50")


def test_retry_after_never_exceeds_what_the_sdk_honours() -> None:
    h = RateLimited("x", retry_after=3600).response_headers()
    assert int(h["retry-after"]) <= 60 and int(h["retry-after-ms"]) <= 60000


@pytest.mark.parametrize(
    ("failure", "kind", "status"),
    [
        (AttemptFailed(Reason.STATUS_500, retryable=True), UpstreamFailed, 502),
        (AttemptFailed(Reason.CONNECT, retryable=True), UpstreamFailed, 502),
        (AttemptFailed(Reason.TIMEOUT, retryable=True), UpstreamTimeout, 504),
        (AttemptFailed(Reason.CIRCUIT_OPEN, retryable=False), ServiceUnavailable, 503),
    ],
)
def test_exhausted_upstream_says_do_not_retry_in_cooperate_mode(
    failure: AttemptFailed, kind: type, status: int, proxy: Callable[..., Gateway]
) -> None:
    err = proxy().pipeline.failover.final_error(failure, trace())
    assert isinstance(err, kind) and err.status == status
    assert err.response_headers()["x-should-retry"] == "false"
    relaxed = proxy("client").pipeline.failover.final_error(failure, trace())
    assert "x-should-retry" not in relaxed.response_headers()


@pytest.mark.parametrize("mode", ["cooperate", "client"])
def test_an_empty_upstream_balance_is_a_429_no_sdk_should_retry(
    proxy: Callable[..., Gateway], mode: str
) -> None:
    err = proxy(mode).pipeline.failover.final_error(
        AttemptFailed(Reason.INSUFFICIENT_QUOTA, retryable=False, status=429), trace()
    )
    assert isinstance(err, UpstreamQuotaExhausted) and err.status == 429
    assert err.body()["error"]["code"] == "insufficient_quota"  # type: ignore[index]
    assert "balance is exhausted" in err.message
    headers = err.response_headers()
    assert headers["x-should-retry"] == "false" and "retry-after" not in headers


def test_relayed_client_errors_are_permanent(proxy: Callable[..., Gateway]) -> None:
    err = proxy().pipeline.failover.final_error(
        AttemptFailed(Reason.STATUS_4XX, retryable=False, status=422, body=b"{}"), trace(1)
    )
    assert isinstance(err, UpstreamRejected) and err.status == 422
    assert err.response_headers()["x-should-retry"] == "false"


def test_permanent_4xx_of_the_gateway() -> None:
    assert PayloadTooLarge("x", should_retry=False).response_headers()["x-should-retry"] == "false"
    for err in (InvalidRequest("x"), AuthenticationFailed("x")):
        headers = err.response_headers()
        assert "retry-after" not in headers and headers["x-should-retry"] == "false"


def test_short_limit_and_short_queue_say_retry() -> None:
    assert (
        RateLimited("x", retry_after=1, should_retry=True).response_headers()["x-should-retry"]
        == "true"
    )


@pytest.mark.parametrize(
    ("reason", "kind"), [(Reason.RESET, UpstreamFailed), (Reason.TIMEOUT, UpstreamTimeout)]
)
@pytest.mark.parametrize("mode", ["cooperate", "client"])
def test_an_ambiguous_failure_held_back_says_why_and_no_sdk_should_retry(
    proxy: Callable[..., Gateway], mode: str, reason: Reason, kind: type
) -> None:
    failure = AttemptFailed(reason, retryable=True, ambiguous=True)
    err = proxy(mode).pipeline.failover.final_error(failure, trace(1))
    assert isinstance(err, kind)
    assert err.response_headers()["x-should-retry"] == "false"  # an SDK retry bills twice too
    assert "not sent again" in err.message
