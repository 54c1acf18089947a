"""The edge routes as a pure-ASGI app: the hot path of the gateway.

`POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/messages` are
answered here, in front of FastAPI, because FastAPI's per-request machinery (request
object, dependency solving, exception middleware) was a large share of the gateway's
CPU per proxied request (figures: deploy/BENCHMARKS.md, "Figures behind the design").
Everything else falls through to the FastAPI app. The route is still a translator: raw
ASGI in, `ClientRequest` to the pipeline, its answer out; errors use the same renderer as
every other route. Their OpenAPI description is added in `app.main` so schema-driven
clients still see them.
"""

from __future__ import annotations

import logging
import time

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.access_note import note_of, refused
from app.api.body import ClientGone, read_body
from app.api.error_handlers import render
from app.api.relay import SseResponse, send_json
from app.api.responses_socket import not_served, serve_socket
from app.errors import GatewayError, InternalError, MethodNotAllowed, UpgradeRequired
from app.gateway import Gateway
from app.pipeline.answer import Answer
from app.pipeline.conversation import SESSION_HEADERS
from app.pipeline.replies import JsonAnswer
from app.pipeline.request import (
    CHAT,
    COMPLETIONS,
    COUNT_TOKENS,
    EMBEDDINGS,
    MESSAGES,
    RESPONSES,
    RESPONSES_COMPACT,
    Endpoint,
)
from app.pipeline.wire import parse_call
from app.upstream.client import FORWARDED

log = logging.getLogger("tokengate.errors")
ROUTES: dict[str, Endpoint] = {
    e.path: e
    for e in (CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES, COUNT_TOKENS, RESPONSES, RESPONSES_COMPACT)
}


class EdgeRoutes:
    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = ROUTES.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None:
            if scope["type"] == "websocket":
                # /v1/responses is the only WebSocket route; any other upgrade is a 426
                # too (never a 403 or 404, which cost Codex seconds of reconnects)
                await serve_socket(scope, receive, send, self.gateway)
                return
            await self.app(scope, receive, send)
            return
        response: Response
        if (note := note_of(scope)) is not None:
            note.endpoint = endpoint.name
        if scope["method"] != "POST":
            if endpoint is RESPONSES and _upgrade(scope):
                # A WebSocket upgrade that reached us as plain HTTP: this server runs without
                # a WebSocket implementation. 426 sends the client to HTTP at once.
                refusal = not_served(self.gateway) or UpgradeRequired(
                    "this server does not accept WebSocket upgrades; use POST /v1/responses"
                )
                self.gateway.metrics.record_socket_upgrade(426)
                await render(refusal)(scope, receive, send)
                return
            # OpenAI's body on every path, /v1/messages included (as it always was)
            wrong = MethodNotAllowed(scope["method"], scope["path"])
            refused(scope, wrong)
            response = render(wrong)
            await response(scope, receive, send)
            return
        try:
            answer = await self._answer(endpoint, scope, receive)
        except GatewayError as exc:
            refused(scope, exc)
            response = render(exc, anthropic=endpoint.anthropic)
        except ClientGone:
            return
        except Exception as exc:
            log.error("unhandled error on %s", scope["path"], exc_info=exc)
            bug = InternalError()
            refused(scope, bug)
            response = render(bug, anthropic=endpoint.anthropic)
        else:
            if isinstance(answer, JsonAnswer):
                await send_json(answer, send)
                return
            response = SseResponse(answer)
        await response(scope, receive, send)

    async def _answer(self, endpoint: Endpoint, scope: Scope, receive: Receive) -> Answer:
        started = time.perf_counter()
        gateway = self.gateway
        authorization = api_key = session = None
        forwarded: dict[str, str] = {}  # the allowlisted API-semantics headers: usually none
        for name, value in scope["headers"]:  # one pass over the headers
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"x-api-key":
                api_key = value.decode("latin-1")
            elif name in SESSION_HEADERS:
                session = value.decode("latin-1")
            elif name in FORWARDED:
                forwarded[name.decode("latin-1")] = value.decode("latin-1")
        caller = gateway.keys.authenticate(authorization, api_key)
        note = scope["state"].get("access")
        if note is not None:
            note.key, note.team = caller.alias, caller.team
        raw = await read_body(scope, receive, gateway.runtime.settings.server.max_body_bytes)
        request_id = scope["state"]["request_id"]
        call = parse_call(endpoint, raw, caller, request_id, forwarded, started)
        call.session_header = session
        if gateway.tracer is not None:
            call.trace_context = _trace_headers(scope["headers"])
        if note is not None:
            note.model = call.model
        try:
            if not endpoint.generates:
                return await gateway.pipeline.count_tokens(call)
            if endpoint.responses:
                return await gateway.responses.create(call)
            return await gateway.pipeline.handle(call)
        finally:
            if note is not None:  # the pipeline wrote the line of a request it took
                note.handled = call.in_pipeline


def _upgrade(scope: Scope) -> bool:
    return any(
        name == b"upgrade" and value.lower() == b"websocket" for name, value in scope["headers"]
    )


def _trace_headers(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The client's W3C trace context, continued by the request's span (tracing on)."""
    return {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in headers
        if name in (b"traceparent", b"tracestate")
    }
