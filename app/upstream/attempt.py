"""What one failed upstream attempt tells the retry logic.

Transport failures (from `client.py`, translated from the HTTP library) and failing
statuses (from the proxy) both become an `AttemptFailed` carrying a `Reason` (its
value is the label of `tokengate_upstream_retries_total`), whether a retry may help,
and any `Retry-After` the upstream sent. The reasons are one enum so that every place
that tells them apart is checked by mypy: a misspelt reason fails loudly instead of
quietly becoming a 502.

`ambiguous` is the fact the resend rule turns on: the request was written and no answer
saying it failed came back (the connection broke or went silent after the request went
out, or the answer was not valid HTTP), so the upstream may have acted on it, and billed
it. Only a failure before any byte of the request was written (DNS, connect, proxy
CONNECT, TLS handshake, a pool wait) or a failing status the upstream chose to send is
unambiguous. `RetrySpec.may_resend` says whether an ambiguous failure may be re-sent.

A 429 is one of two things. `throttled`: flow control (the pipeline requeues the
request and the domain's pacer cools down; never retried here, never a fault).
`insufficient_quota`: the account's balance is empty (OpenAI's code): no wait helps,
so it is answered at once after this one attempt.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum

import orjson

from app.limits.pacing import rate_headers
from app.upstream.cause import Cause, Failure, of_status


class Reason(StrEnum):
    """Why an attempt failed; a `StrEnum`, so metric labels and log lines show the value."""

    CONNECT = "connect"  # no connection (refused, DNS, TLS, proxy refusal)
    TIMEOUT = "timeout"  # no connection in time, or no answer in time
    RESET = "reset"  # the connection broke off mid-exchange
    BAD_REQUEST = "bad_request"  # a header the transport refused to send
    BAD_RESPONSE = "bad_response"  # not valid HTTP, not an API answer, or a 200 without JSON
    UPSTREAM_AUTH = "upstream_auth"  # 401 / 403: the gateway's upstream key
    MODEL_NOT_FOUND = "model_not_found"  # 404
    # 400/404 `previous_response_not_found`: that domain does not hold the response
    RESPONSE_NOT_FOUND = "response_not_found"
    CIRCUIT_OPEN = "circuit_open"  # the domain's breaker refused the attempt
    THROTTLED = "throttled"  # 429 as flow control
    INSUFFICIENT_QUOTA = "insufficient_quota"  # 429, the account's balance is empty
    STATUS_500 = "status_500"
    STATUS_502 = "status_502"
    STATUS_503 = "status_503"
    STATUS_504 = "status_504"
    STATUS_5XX = "status_5xx"  # any other 5xx
    STATUS_4XX = "status_4xx"  # any other 4xx (relayed to the client as it came)


_RETRYABLE = {
    500: Reason.STATUS_500,
    502: Reason.STATUS_502,
    503: Reason.STATUS_503,
    504: Reason.STATUS_504,
}
RETRYABLE_STATUSES = frozenset(_RETRYABLE)
# Failures after which another domain or the fallback model may still succeed.
MOVES_ON = frozenset(
    {
        Reason.CONNECT,
        Reason.TIMEOUT,
        Reason.RESET,
        Reason.BAD_RESPONSE,
        Reason.UPSTREAM_AUTH,
        Reason.MODEL_NOT_FOUND,
        Reason.RESPONSE_NOT_FOUND,
        Reason.CIRCUIT_OPEN,
        *_RETRYABLE.values(),
    }
)
# Failures that say the upstream (not the client) is broken: they feed the breaker.
UPSTREAM_FAULTS = MOVES_ON - {
    Reason.MODEL_NOT_FOUND,
    Reason.RESPONSE_NOT_FOUND,
    Reason.CIRCUIT_OPEN,
}


# What a failure says of the upstream when it came with no status to classify.
_CAUSES: dict[Reason, Cause] = {
    Reason.CONNECT: Cause.UNREACHABLE,
    Reason.TIMEOUT: Cause.TIMEOUT,
    Reason.RESET: Cause.BROKEN,
    Reason.BAD_RESPONSE: Cause.BROKEN,
    Reason.THROTTLED: Cause.RATE_LIMITED,
    Reason.INSUFFICIENT_QUOTA: Cause.RATE_LIMITED,
}


class AttemptFailed(Exception):
    def __init__(
        self,
        reason: Reason,
        *,
        retryable: bool,
        status: int | None = None,
        body: bytes = b"",
        content_type: str = "application/json",
        retry_after: float | None = None,
        detail: str = "",
        ambiguous: bool = False,
        cause: Cause | None = None,
    ) -> None:
        self.reason = Reason(reason)  # a value that is no reason raises here, not later
        super().__init__(f"{self.reason}{': ' + detail if detail else ''}")
        self.retryable = retryable
        self.ambiguous = ambiguous
        self.status = status
        self.body = body
        self.content_type = content_type
        self.retry_after = retry_after
        self.detail = detail
        self.cause = cause  # what the transport saw of a failed connect (DNS, TLS, ...)

    def failure(self, where: str) -> Failure | None:
        """What this says of the upstream at `where` (host:port) for the domain's state,
        or None when it says nothing of it (a model it lacks, our own refusal)."""
        cause = _CAUSES.get(self.reason)
        if cause is None and self.status is not None and self.reason in UPSTREAM_FAULTS:
            cause = of_status(self.status)
        if cause is None:
            return None
        return Failure(self.cause or cause, where, self.status)

    @property
    def moves_on(self) -> bool:
        return self.reason in MOVES_ON

    @property
    def upstream_fault(self) -> bool:
        return self.reason in UPSTREAM_FAULTS


def status_failure(
    status: int, body: bytes, content_type: str, headers: Mapping[str, str]
) -> AttemptFailed:
    if status == 429:
        return _too_many(body, content_type, headers)
    if status in (400, 404) and b"previous_response_not_found" in body:
        reason = Reason.RESPONSE_NOT_FOUND  # another domain may hold it
    elif status in _RETRYABLE:
        reason = _RETRYABLE[status]
    elif status in (401, 403):
        reason = Reason.UPSTREAM_AUTH
    elif status == 404:
        reason = Reason.MODEL_NOT_FOUND
    elif status >= 500:
        reason = Reason.STATUS_5XX
    else:
        reason = Reason.STATUS_4XX
    return AttemptFailed(
        reason,
        retryable=status in RETRYABLE_STATUSES,
        status=status,
        body=body,
        content_type=content_type,
        retry_after=parse_retry_after(headers),
    )


def _too_many(body: bytes, content_type: str, headers: Mapping[str, str]) -> AttemptFailed:
    if _insufficient_quota(body):
        return AttemptFailed(
            Reason.INSUFFICIENT_QUOTA,
            retryable=False,
            status=429,
            body=body,
            content_type=content_type,
        )
    wait = parse_retry_after(headers)
    if wait is None and (advertised := rate_headers(headers)) is not None:
        wait = advertised.exhausted_for
    return AttemptFailed(
        Reason.THROTTLED,
        retryable=False,
        status=429,
        body=body,
        content_type=content_type,
        retry_after=wait,
    )


def _insufficient_quota(body: bytes) -> bool:
    if b"insufficient_quota" not in body:
        return False
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    if not isinstance(error, dict):
        return False
    return "insufficient_quota" in (error.get("code"), error.get("type"))


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """`retry-after-ms` (OpenAI's, exact) first, then `retry-after` in seconds; anything
    not a finite number (an HTTP date, `inf`, `nan`) is no hint at all."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if not raw:
            continue
        try:
            value = float(raw) / scale
        except ValueError:
            continue
        if math.isfinite(value):
            return max(0.0, value)
    return None
