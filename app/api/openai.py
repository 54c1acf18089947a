"""OpenAI-compatible routes: translate HTTP to a `ProxyCall` and the answer back."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.body import read_body
from app.api.deps import CallerDep, GatewayDep, request_id
from app.api.responses import SseResponse, json_response
from app.gateway import Gateway
from app.proxy.answer import StreamAnswer
from app.proxy.call import CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES, Endpoint
from app.proxy.wire import parse_call
from app.runtime import KeySpec
from app.upstream.client import forwardable

router = APIRouter()


async def _proxy(
    request: Request, gateway: Gateway, caller: KeySpec, endpoint: Endpoint
) -> Response:
    started = time.perf_counter()
    raw = await read_body(request, gateway.runtime.settings.server.max_body_bytes)
    forwarded = forwardable(request.scope["headers"])
    call = parse_call(endpoint, raw, caller, request_id(request), forwarded, started)
    answer = await gateway.proxy.handle(call)
    if isinstance(answer, StreamAnswer):
        return SseResponse(answer)
    return json_response(answer)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, gateway: GatewayDep, caller: CallerDep) -> Response:
    return await _proxy(request, gateway, caller, CHAT)


@router.post("/v1/completions")
async def completions(request: Request, gateway: GatewayDep, caller: CallerDep) -> Response:
    return await _proxy(request, gateway, caller, COMPLETIONS)


@router.post("/v1/embeddings")
async def embeddings(request: Request, gateway: GatewayDep, caller: CallerDep) -> Response:
    return await _proxy(request, gateway, caller, EMBEDDINGS)


@router.post("/v1/messages")
async def messages(request: Request, gateway: GatewayDep, caller: CallerDep) -> Response:
    return await _proxy(request, gateway, caller, MESSAGES)


@router.get("/v1/models")
async def list_models(gateway: GatewayDep, caller: CallerDep) -> dict[str, object]:
    allowed = caller.models
    data = [
        {"id": m, "object": "model", "created": 0, "owned_by": "tokengate"}
        for m in gateway.models()
        if allowed is None or m in allowed
    ]
    return {"object": "list", "data": data}
