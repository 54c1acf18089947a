"""OpenAI-compatible routes served by FastAPI (the proxied POST routes are in `edge.py`)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api import views
from app.api.deps import CallerDep, GatewayDep

router = APIRouter()


@router.get("/v1/models")
async def list_models(gateway: GatewayDep, caller: CallerDep) -> dict[str, object]:
    allowed = caller.models
    data = [
        {"id": m, "object": "model", "created": 0, "owned_by": "tokengate"}
        for m in views.models(gateway)
        if allowed is None or m in allowed
    ]
    return {"object": "list", "data": data}
