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

from app.errors import GatewayError, InternalError, InvalidRequest, NotFound, UpstreamRejected

log = logging.getLogger("tokengate.errors")


def render(exc: GatewayError) -> Response:
    if isinstance(exc, UpstreamRejected):
        return Response(
            exc.raw_body, exc.status, exc.response_headers(), media_type=exc.content_type
        )
    return Response(
        orjson.dumps(exc.body()), exc.status, exc.response_headers(), media_type="application/json"
    )


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return render(exc)


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    return render(
        InvalidRequest(f"{loc}: {first.get('msg', 'invalid request')}", param=loc or None)
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return render(NotFound(f"Unknown request URL: {request.method} {request.url.path}"))
    err = GatewayError(str(exc.detail), code=None)
    err.status, err.type = exc.status_code, "invalid_request_error"
    return render(err)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s", request.url.path, exc_info=exc)
    return render(InternalError())


def install(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
