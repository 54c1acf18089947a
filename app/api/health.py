"""Orchestrator and scraper endpoints; none of them needs a key or shows a secret."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import JSONResponse, Response

from app.api import views
from app.api.deps import GatewayDep
from app.metrics import CONTENT_TYPE

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/health/ready")
async def ready(gateway: GatewayDep) -> Response:
    ok, body = views.readiness(gateway)
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics")
async def metrics(gateway: GatewayDep) -> Response:
    return Response(gateway.render_metrics(), media_type=CONTENT_TYPE)
