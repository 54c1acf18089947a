"""The one renderer of errors: every failure leaves as an OpenAI error body.

`GatewayError`s render as themselves. FastAPI/Starlette's own (validation, unknown
route, wrong method) are translated. Anything else is a bug: logged with its
traceback (redacted by the log filter), answered with a generic 500 and no detail.
"""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from app.api.access_note import refused
from app.errors import (
    FrameworkRefused,
    GatewayError,
    InternalError,
    InvalidRequest,
    NotFound,
    UpstreamRejected,
)

log = logging.getLogger("tokengate.errors")


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def render(exc: GatewayError, *, anthropic: bool = False) -> Response:
    """OpenAI's error body, or Anthropic's on `/v1/messages` (what that SDK expects)."""
    if isinstance(exc, UpstreamRejected):
        return Response(
            exc.raw_body, exc.status, exc.response_headers(), media_type=exc.content_type
        )
    body: object = exc.body()
    if anthropic:
        kind = _ANTHROPIC_TYPES.get(exc.status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": exc.message}}
    return Response(
        orjson.dumps(body), exc.status, exc.response_headers(), media_type="application/json"
    )


def _answer(request: Request, exc: GatewayError) -> Response:
    refused(request.scope, exc)  # its code goes on the request's access-log line
    return render(exc, anthropic=request.url.path == "/v1/messages")


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return _answer(request, exc)


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    where = loc or "request body (a JSON object is expected)"
    return _answer(
        request,
        InvalidRequest(f"{where}: {first.get('msg', 'invalid request')}", param=loc or None),
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return _answer(
            request, NotFound(f"Unknown request URL: {request.method} {request.url.path}")
        )
    return _answer(request, FrameworkRefused(exc.status_code, str(exc.detail)))


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s", request.url.path, exc_info=exc)
    return _answer(request, InternalError())


def install(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
