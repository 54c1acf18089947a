"""The ASGI application factory: wiring only.

`create_app(runtime)` builds the gateway, mounts the routers and the pure-ASGI
middleware, and hands the lifecycle to `Gateway` through the lifespan. There is no
module-level app: `factory()` builds one from the environment for uvicorn's
`--workers` mode (each worker process calls it).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, nullcontext
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp

from app.api import (
    admin,
    batches,
    budget_admin,
    changes,
    error_handlers,
    openai,
    probes,
    stored_responses,
    ui,
)
from app.api.access_note import AccessRecorder
from app.api.browser import BrowserGuard
from app.api.disconnect import CancelOnDisconnect
from app.api.edge import ROUTES, EdgeRoutes
from app.api.middleware import RequestContext
from app.assembly import TransportFactory
from app.gateway import Gateway
from app.limits.limit_store import LimitStore
from app.metrics import Metrics, new_registry
from app.runtime import Runtime
from app.signals import lifecycle_signals, tune_gc


def create_app(
    runtime: Runtime,
    *,
    metrics: Metrics | None = None,
    transport_factory: TransportFactory | None = None,
    store: LimitStore | None = None,
    handle_signals: bool = False,
    on_started: Callable[[Gateway], None] | None = None,
) -> ASGIApp:
    """The gateway's ASGI app: the pure-ASGI front (request id, disconnects, edge routes)
    around FastAPI, which serves every other route. `on_started` is told once the
    gateway has started (the CLI prints what the first probes found). `store` stands in for
    the limit store the gateway would build: tests give one on a clock of their own."""
    gateway = Gateway(
        runtime,
        metrics or Metrics(new_registry()),
        transport_factory=transport_factory,
        store=store,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        if on_started is not None:
            on_started(gateway)
        if handle_signals:  # a real server process, not a test harness
            tune_gc()
        drain = runtime.settings.server.drain_delay_sec
        guard = (
            lifecycle_signals(
                gateway.begin_drain,
                gateway.request_reload,
                drain,
                busy=lambda: gateway.socket_turns > 0,
                patience=runtime.settings.server.drain_timeout_sec,
            )
            if handle_signals
            else nullcontext()
        )
        try:
            with guard:
                yield
        finally:
            await gateway.close()

    app = FastAPI(
        title="tokengate",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        # No trailing-slash redirects: they are built from the client's Host header.
        redirect_slashes=False,
    )
    app.state.gateway = gateway
    error_handlers.install(app)
    app.include_router(openai.router)
    app.include_router(batches.router)
    app.include_router(stored_responses.router)
    app.include_router(probes.router)
    app.include_router(admin.router)
    app.include_router(budget_admin.router)
    app.include_router(changes.router)
    if runtime.settings.ui.enabled:
        ui.install(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    # Outside FastAPI, so a proxied request crosses none of its middleware layers.
    front = EdgeRoutes(app, gateway)
    server = runtime.settings.server
    return RequestContext(
        BrowserGuard(
            CancelOnDisconnect(front),
            server.allowed_origins,
            open_gateway=not runtime.auth_enabled,
        ),
        draining=lambda: gateway.draining,
        max_header_bytes=server.max_header_bytes,
        max_headers=server.max_headers,
        recorder=AccessRecorder(gateway.metrics, lambda: gateway.runtime.settings.billing.currency),
    )


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the pure-ASGI edge routes (`app.api.edge`)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path, endpoint in ROUTES.items():
            schema["paths"][path] = {"post": _edge_operation(endpoint.name)}
        app.openapi_schema = schema
    return app.openapi_schema


def _edge_operation(name: str) -> dict[str, Any]:
    body = {
        "type": "object",
        "required": ["messages"] if name in ("chat", "messages") else [],
        "additionalProperties": True,
    }
    return {
        "summary": f"{name} (proxied to the upstream of the serving domain)",
        "operationId": f"create_{name}",
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            "200": {"description": "the upstream's answer (JSON or text/event-stream)"},
            "default": {"description": "an OpenAI-style error body"},
        },
        "security": [{"bearer": []}],
    }


def factory() -> ASGIApp:
    """Entry point of `uvicorn --factory` worker processes (`tokengate serve --workers N`)."""
    from app.bootstrap import load_runtime, setup_process

    runtime = load_runtime(
        no_auth=os.environ.get("TOKENGATE_NO_AUTH") == "1",
        workers=int(os.environ.get("TOKENGATE_WORKERS", "1")),
    )
    setup_process(runtime)
    return create_app(runtime, handle_signals=True)
