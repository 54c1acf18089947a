"""Orchestrator and scraper endpoints; none of them shows a secret. Probes need no key;
`/metrics` asks for `metrics.token` when one is set."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from app.api import views
from app.api.deps import GatewayDep
from app.auth import bearer_matches
from app.errors import AuthenticationFailed
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
async def metrics(request: Request, gateway: GatewayDep) -> Response:
    token = gateway.runtime.settings.metrics.token
    if token is not None and not bearer_matches(
        request.headers.get("authorization"), token.get_secret_value()
    ):
        raise AuthenticationFailed(
            "scrape token required: `Authorization: Bearer <metrics.token>`",
            code="missing_scrape_token",
        )
    return Response(gateway.render_metrics(), media_type=CONTENT_TYPE)
