"""The gateway's one error tree.

    GatewayError                  status  type / code
    ├── InvalidRequest            400     invalid_request_error
    ├── AuthenticationFailed      401     authentication_error / invalid_api_key
    │   └── KeyExpired            401     authentication_error / expired_api_key
    ├── PermissionDenied          403     permission_error / model_not_allowed
    │   ├── ModelNotPriced        403     permission_error / model_not_priced
    │   └── BrowserRefused        403     permission_error / origin_not_allowed |
    │                                      host_not_allowed (a web page's request)
    ├── NotFound                  404     invalid_request_error / not_found
    │   └── ModelNotFound         404     invalid_request_error / model_not_found
    ├── MethodNotAllowed          405     invalid_request_error / method_not_allowed
    ├── Conflict                  409     invalid_request_error / (not_shared)
    ├── UpgradeRequired           426     invalid_request_error / websocket_not_served
    ├── PayloadTooLarge           413     invalid_request_error / request_too_large
    ├── UnsupportedMediaType      415     invalid_request_error / unsupported_media_type
    ├── HeadersTooLarge           431     invalid_request_error / headers_too_large
    ├── RateLimited               429     rate_limit_error / rate_limit_exceeded
    ├── UpstreamQuotaExhausted    429     insufficient_quota (the upstream balance is empty)
    ├── BudgetExceeded            429     insufficient_quota / budget_exceeded (a key's or
    │                                      team's budget for the period is spent)
    ├── ServiceUnavailable        503     service_unavailable / (queue_full, queue_timeout,
    │                                      no_healthy_domain, draining, redis_unavailable)
    ├── UpstreamFailed            502     upstream_error / upstream_error
    ├── UpstreamTimeout           504     timeout_error / upstream_timeout
    ├── UpstreamRejected          4xx     the upstream's own 4xx, relayed (body scrubbed)
    ├── FrameworkRefused          4xx     Starlette/FastAPI's own refusal (wrong method on a
    │                                      FastAPI route...), at the status it chose
    └── InternalError             500     server_error (generic, never any detail)

Each knows its HTTP status, its OpenAI `type`/`code`, whether an SDK retry can help
(`should_retry`) and its `retry_after`. `app.api.error_handlers` is the only renderer. Only
messages written here reach clients; anything else becomes `InternalError`.
"""

from __future__ import annotations

import math


class GatewayError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None
    permanent = False  # the same request can never succeed: tell SDKs not to retry

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        should_retry: bool | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after = retry_after
        self.should_retry = should_retry
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.retry_after is not None:
            wait = max(0.0, self.retry_after)
            # Integer seconds for RFC 9110 readers, exact milliseconds for the OpenAI SDKs,
            # which read retry-after-ms first. Capped at 60 s: the SDK ignores longer waits.
            headers["retry-after"] = str(min(60, max(1, math.ceil(wait))))
            headers["retry-after-ms"] = str(min(60000, max(1, math.ceil(wait * 1000))))
        should_retry = False if self.should_retry is None and self.permanent else self.should_retry
        if should_retry is not None:
            headers["x-should-retry"] = "true" if should_retry else "false"
        return headers


class InvalidRequest(GatewayError):
    permanent = True
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class AuthenticationFailed(GatewayError):
    permanent = True
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class KeyExpired(AuthenticationFailed):
    """A right key past its `expires_at`. Carries the key's alias (not a secret) so the
    access log says whose key it was."""

    code = "expired_api_key"

    def __init__(self, message: str, *, alias: str) -> None:
        super().__init__(message)
        self.alias = alias


class PermissionDenied(GatewayError):
    permanent = True
    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class ModelNotPriced(PermissionDenied):
    """The key (or its team) has a cost budget and the model has no price: its spend could
    not be counted, so it is not served until the operator adds the price."""

    code = "model_not_priced"


class BrowserRefused(PermissionDenied):
    """A request only a browser sends: a web page on an origin the operator did not list
    (`server.allowed_origins`), or a `Host` that is not the gateway's (DNS rebinding)."""

    code = "origin_not_allowed"


class NotFound(GatewayError):
    permanent = True
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(GatewayError):
    """An edge route asked with another method than POST; says which one is allowed."""

    permanent = True
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"

    def __init__(self, method: str, path: str) -> None:
        super().__init__(f"{method} is not allowed on {path}: use POST", headers={"allow": "POST"})


class Conflict(GatewayError):
    """The request is valid but the gateway's set-up cannot honour it (e.g. a live limit
    change that would reach one worker only). Not permanent: the set-up can change."""

    status = 409
    type = "invalid_request_error"
    code = "conflict"


class UpgradeRequired(GatewayError):
    """A WebSocket upgrade the gateway will not serve (the Responses WebSocket mode off, or
    no domain serving the Responses API). 426, never 404/405: Codex CLI falls back to HTTP
    at once on a 426, but retries anything else for seconds first."""

    status = 426
    type = "invalid_request_error"
    code = "websocket_not_served"


class PayloadTooLarge(GatewayError):
    permanent = True
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedMediaType(GatewayError):
    """A body sent as something else than JSON: an admin body as a form, text or XML, or
    a CORS-simple type (text/plain, form-encoded, multipart) on a JSON route, which is what
    a web page can send cross-origin without asking first."""

    permanent = True
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class HeadersTooLarge(GatewayError):
    """Request headers past `server.max_header_bytes` / `server.max_headers`: refused
    before anything reads the body (httptools sets no bound of its own). It has never
    carried `x-should-retry`, so it is not marked permanent."""

    status = 431
    type = "invalid_request_error"
    code = "headers_too_large"

    def __init__(self, max_bytes: int, max_headers: int) -> None:
        super().__init__(
            f"request headers exceed the gateway's limit ({max_bytes} bytes, "
            f"{max_headers} headers)",
            headers={"connection": "close"},
        )


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class FlexUnavailable(GatewayError):
    """A `service_tier: "flex"` request found no spare capacity in time: the 429 OpenAI
    documents for flex ("Resource Unavailable"); nothing was sent upstream, so nothing is
    charged. Worth retrying later, or at once with another tier."""

    status = 429
    type = "rate_limit_error"
    code = "resource_unavailable"


class UpstreamQuotaExhausted(GatewayError):
    """The upstream account has no balance left (OpenAI's `insufficient_quota` 429): no
    wait helps, only a top-up, so SDKs are told not to retry."""

    permanent = True
    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"


class BudgetExceeded(GatewayError):
    """A key's or team's budget has no room for this request until its period resets.
    OpenAI's `insufficient_quota` type, so clients treat it as a quota and not as a rate:
    the SDKs are told not to retry (no wait short of the reset helps)."""

    permanent = True
    status = 429
    type = "insufficient_quota"
    code = "budget_exceeded"


class SessionBudgetExceeded(BudgetExceeded):
    """One agent session of a key has spent its key's `session_budget`: a runaway loop is
    stopped, with a message the agent shows its user; other sessions of the key go on."""

    code = "session_budget_exceeded"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "service_unavailable"


class UpstreamFailed(GatewayError):
    status = 502
    type = "upstream_error"
    code = "upstream_error"


class UpstreamTimeout(GatewayError):
    status = 504
    type = "timeout_error"
    code = "upstream_timeout"


class UpstreamRejected(GatewayError):
    """An upstream 4xx that is the client's fault (bad parameter...): relayed as it came."""

    type = "invalid_request_error"

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__("upstream rejected the request", should_retry=False)
        self.status = status
        self.raw_body = body
        self.content_type = content_type


class FrameworkRefused(GatewayError):
    """Starlette's or FastAPI's own `HTTPException` other than 404 (a wrong method on a
    FastAPI route, mostly), translated at the boundary: its status and detail, no code."""

    type = "invalid_request_error"
    code = None

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class InternalError(GatewayError):
    status = 500
    type = "server_error"
    code = "internal_error"

    def __init__(self, message: str = "internal error; see the gateway log") -> None:
        super().__init__(message)
