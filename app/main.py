"""The ASGI application factory: wiring only.

`create_app(runtime)` builds the gateway, mounts the routers and the pure-ASGI
middleware, and hands the lifecycle to `Gateway` through the lifespan. There is no
module-level app: `factory()` builds one from the environment for uvicorn's
`--workers` mode (each worker process calls it).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext

from fastapi import FastAPI

from app.api import admin, batches, errors, health, openai
from app.api.disconnect import CancelOnDisconnect
from app.api.middleware import RequestContext
from app.gateway import Gateway, TransportFactory
from app.metrics import Metrics, new_registry
from app.runtime import Runtime
from app.server import lifecycle_signals


def create_app(
    runtime: Runtime,
    *,
    metrics: Metrics | None = None,
    transport_factory: TransportFactory | None = None,
    handle_signals: bool = False,
) -> FastAPI:
    gateway = Gateway(
        runtime, metrics or Metrics(new_registry()), transport_factory=transport_factory
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        drain = runtime.settings.server.drain_delay_sec
        guard = (
            lifecycle_signals(gateway.begin_drain, gateway.request_reload, drain)
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
    )
    app.state.gateway = gateway
    errors.install(app)
    app.include_router(openai.router)
    app.include_router(batches.router)
    app.include_router(health.router)
    app.include_router(admin.router)
    app.add_middleware(CancelOnDisconnect)
    app.add_middleware(RequestContext, draining=lambda: gateway.draining)
    return app


def factory() -> FastAPI:
    """Entry point of `uvicorn --factory` worker processes (`tokengate serve --workers N`)."""
    from app.bootstrap import load_runtime, setup_process

    runtime = load_runtime(
        no_auth=os.environ.get("TOKENGATE_NO_AUTH") == "1",
        workers=int(os.environ.get("TOKENGATE_WORKERS", "1")),
    )
    setup_process(runtime)
    return create_app(runtime, handle_signals=True)
