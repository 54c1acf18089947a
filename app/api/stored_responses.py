"""The Responses API routes that follow a stored response, and `input_tokens`.

Translators only: each relays to the domain that holds the response
(`ResponsesService.follow`), or counts input tokens (`ResponsesService.input_tokens`).
Creating a response (`POST /v1/responses`, `/v1/responses/compact`) is an edge route
(`app.api.edge`), the WebSocket mode is `app.api.responses_socket`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from app.api.access_note import note_of
from app.api.body import read_body
from app.api.deps import CallerDep, GatewayDep
from app.pipeline.responses_api import Relayed

router = APIRouter()


def _render(relayed: Relayed) -> Response:
    if relayed.chunks is not None:
        close = relayed.close
        return StreamingResponse(
            relayed.chunks,
            media_type=relayed.content_type,
            headers={**relayed.headers, "cache-control": "no-cache"},
            background=BackgroundTask(close) if close is not None else None,
        )
    return Response(relayed.body, relayed.status, relayed.headers, media_type=relayed.content_type)


def _request_id(request: Request) -> str:
    """The request's id; and its access-log line is `ResponsesService`'s to write."""
    note = note_of(request.scope)
    if note is not None:
        note.handled = True
    return str(request.scope["state"]["request_id"])


@router.post("/v1/responses/input_tokens")
async def input_tokens(request: Request, gateway: GatewayDep, caller: CallerDep) -> Response:
    limit = gateway.runtime.settings.server.max_body_bytes
    raw = await read_body(request.scope, request.receive, limit)
    return _render(await gateway.responses.input_tokens(caller, raw, _request_id(request)))


@router.get("/v1/responses/{response_id}")
async def retrieve(
    response_id: str, request: Request, gateway: GatewayDep, caller: CallerDep
) -> Response:
    relayed = await gateway.responses.follow(
        caller, _request_id(request), "GET", response_id, query=request.url.query
    )
    return _render(relayed)


@router.delete("/v1/responses/{response_id}")
async def delete(
    response_id: str, request: Request, gateway: GatewayDep, caller: CallerDep
) -> Response:
    relayed = await gateway.responses.follow(caller, _request_id(request), "DELETE", response_id)
    return _render(relayed)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel(
    response_id: str, request: Request, gateway: GatewayDep, caller: CallerDep
) -> Response:
    relayed = await gateway.responses.follow(
        caller, _request_id(request), "POST", response_id, "/cancel"
    )
    return _render(relayed)


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(
    response_id: str, request: Request, gateway: GatewayDep, caller: CallerDep
) -> Response:
    relayed = await gateway.responses.follow(
        caller,
        _request_id(request),
        "GET",
        response_id,
        "/input_items",
        query=request.url.query,
    )
    return _render(relayed)
