"""What one failed upstream attempt tells the retry logic.

Transport failures (from `client.py`, translated from the HTTP library) and failing
statuses (from the proxy) both become an `AttemptFailed` carrying a short `reason`
(the label of `tokengate_upstream_retries_total`), whether a retry may help, and any
`Retry-After` the upstream sent.

A 429 is one of two things. `throttled`: flow control (the pipeline requeues the
request and the domain's pacer cools down; never retried here, never a fault).
`insufficient_quota`: the account's balance is empty (OpenAI's code): no wait helps,
so it is answered at once after this one attempt.
"""

from __future__ import annotations

import orjson

from app.limits.pacing import rate_headers

RETRYABLE_STATUSES = frozenset({500, 502, 503, 504})
# Failures after which another domain or the fallback model may still succeed.
MOVES_ON = frozenset(
    {
        "connect",
        "timeout",
        "reset",
        "bad_response",
        "upstream_auth",
        "model_not_found",
        "circuit_open",
        "status_500",
        "status_502",
        "status_503",
        "status_504",
    }
)
# Failures that say the upstream (not the client) is broken: they feed the breaker.
UPSTREAM_FAULTS = MOVES_ON - {"model_not_found", "circuit_open"}


class AttemptFailed(Exception):
    def __init__(
        self,
        reason: str,
        *,
        retryable: bool,
        status: int | None = None,
        body: bytes = b"",
        content_type: str = "application/json",
        retry_after: float | None = None,
        detail: str = "",
    ) -> None:
        super().__init__(f"{reason}{': ' + detail if detail else ''}")
        self.reason = reason
        self.retryable = retryable
        self.status = status
        self.body = body
        self.content_type = content_type
        self.retry_after = retry_after
        self.detail = detail

    @property
    def moves_on(self) -> bool:
        return self.reason in MOVES_ON

    @property
    def upstream_fault(self) -> bool:
        return self.reason in UPSTREAM_FAULTS


def status_failure(
    status: int, body: bytes, content_type: str, headers: dict[str, str]
) -> AttemptFailed:
    if status == 429:
        return _too_many(body, content_type, headers)
    if status in RETRYABLE_STATUSES:
        reason = f"status_{status}"
    elif status in (401, 403):
        reason = "upstream_auth"
    elif status == 404:
        reason = "model_not_found"
    elif status >= 500:
        reason = "status_5xx"
    else:
        reason = "status_4xx"
    return AttemptFailed(
        reason,
        retryable=status in RETRYABLE_STATUSES,
        status=status,
        body=body,
        content_type=content_type,
        retry_after=parse_retry_after(headers),
    )


def _too_many(body: bytes, content_type: str, headers: dict[str, str]) -> AttemptFailed:
    if _insufficient_quota(body):
        return AttemptFailed(
            "insufficient_quota", retryable=False, status=429, body=body, content_type=content_type
        )
    wait = parse_retry_after(headers)
    if wait is None and (advertised := rate_headers(headers)) is not None:
        wait = advertised.exhausted_for
    return AttemptFailed(
        "throttled",
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


def parse_retry_after(headers: dict[str, str]) -> float | None:
    """`retry-after-ms` (OpenAI's, exact) first, then `retry-after` in seconds."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw:
        try:
            return max(0.0, float(raw))
        except ValueError:
            return None  # an HTTP date: rare from APIs, fall back to our own backoff
    return None
