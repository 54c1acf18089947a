"""What the client is told when the last upstream attempt failed.

One arm per `Reason`, checked exhaustive by mypy (`assert_never`): a new reason without
an answer here fails the lint, it does not quietly become a 502. In `cooperate` mode
(`retry_policy.client_retries`) an answer after the gateway's own retries says
`x-should-retry: false`, so the SDK does not multiply them. A failure after which the
upstream may have acted on the request (`AttemptFailed.ambiguous`) and that the gateway
did not send again says `x-should-retry: false` in either mode, and says why: an SDK's
retry could bill the request twice just as the gateway's would.
"""

from __future__ import annotations

import logging
from typing import assert_never

from app.errors import (
    GatewayError,
    ModelNotFound,
    ServiceUnavailable,
    UpstreamFailed,
    UpstreamQuotaExhausted,
    UpstreamRejected,
    UpstreamTimeout,
)
from app.pipeline.trace import Trace
from app.upstream.attempt import AttemptFailed, Reason

log = logging.getLogger("tokengate.pipeline")
HELD_BACK = (
    "; the upstream may have received the request, so it was not sent again (a re-send "
    "could bill it twice)"
)


def client_error(
    last: AttemptFailed, trace: Trace, *, cooperate: bool, resent: bool = True
) -> GatewayError:
    """The client's error for the attempt that failed last (`resent`: whether the retry
    policy let such a failure go out again): one arm per `Reason`, and mypy rejects the
    match if a reason has none (`assert_never`)."""
    held = not resent  # ambiguous, and not sent again: an SDK retry could bill twice too
    spent = False if cooperate or held else None
    tries = len(trace.attempts)
    why = HELD_BACK if held else ""
    match last.reason:
        case Reason.STATUS_4XX | Reason.RESPONSE_NOT_FOUND if last.status is not None:
            return UpstreamRejected(last.status, last.body, last.content_type)
        case Reason.MODEL_NOT_FOUND if trace.endpoint.startswith("responses"):
            return ModelNotFound(
                f"the upstream answered 404 for model '{trace.attempts[-1].model}' on the "
                "Responses API: it may not serve the model, or not /v1/responses at all "
                "(operators: set responses = false on such a [[scale_up]] domain)",
                param="model",
            )
        case Reason.MODEL_NOT_FOUND:
            return ModelNotFound(
                f"the upstream does not serve model '{trace.attempts[-1].model}'; "
                "GET /v1/models lists what is served",
                param="model",
            )
        case Reason.TIMEOUT:
            return UpstreamTimeout(
                f"upstream did not answer in time ({tries} attempt(s)){why}", should_retry=spent
            )
        case Reason.INSUFFICIENT_QUOTA:
            return UpstreamQuotaExhausted(
                "the upstream account's balance is exhausted (insufficient_quota); retrying "
                "will not help until operators top it up"
            )
        case Reason.UPSTREAM_AUTH:
            log.error("upstream refused the gateway's credentials (status %s)", last.status)
            return UpstreamFailed(
                "the upstream refused the gateway's credentials; operators: see the gateway log",
                should_retry=spent,
            )
        case Reason.CIRCUIT_OPEN:
            cause = f" (the last: {last.detail})" if last.detail else ""
            return ServiceUnavailable(
                f"the upstream circuit is open after repeated failures{cause}",
                code="no_healthy_domain",
                retry_after=5.0,
                should_retry=spent,
            )
        case (
            Reason.CONNECT
            | Reason.RESET
            | Reason.BAD_REQUEST
            | Reason.BAD_RESPONSE
            | Reason.THROTTLED
            | Reason.STATUS_500
            | Reason.STATUS_502
            | Reason.STATUS_503
            | Reason.STATUS_504
            | Reason.STATUS_5XX
            | Reason.STATUS_4XX  # without a status: nothing to relay
            | Reason.RESPONSE_NOT_FOUND
        ):
            return UpstreamFailed(
                f"upstream failed after {tries} attempt(s): {last.reason}{why}",
                should_retry=spent,
            )
        case _:
            assert_never(last.reason)
