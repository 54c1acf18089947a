"""The whole ASGI app in-process: `create_app` behind httpx's `ASGITransport`, its
lifespan run as a server would, the upstream an `httpx.MockTransport`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.limits.limit_store import Clock, MemoryStore
from app.main import create_app
from app.runtime import compile_runtime
from tests.support.inproc import (
    ADMIN_KEY,
    Handler,
    Lifespan,
    MakeClient,
    local_settings,
    mock_transport,
)


def models(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"object": "list", "data": [{"id": "m-1", "object": "model"}]})


@pytest.fixture
async def make_client(tmp_path: Path) -> AsyncIterator[MakeClient]:
    async with AsyncExitStack() as stack:
        count = 0

        async def build(
            settings: dict[str, Any] | None = None,
            *,
            handler: Handler = models,
            workers: int = 1,
            raise_app_exceptions: bool = True,
            clock: Clock | None = None,
        ) -> httpx.AsyncClient:
            nonlocal count
            count += 1
            home = tmp_path / f"app{count}"
            home.mkdir()
            runtime = compile_runtime(
                local_settings(home, settings),
                {"TAOTOKEN_API_KEY": "sk-upstream"},
                no_auth=True,
                workers=workers,
            )
            # A clock of the test's own stops the limit buckets refilling while it runs,
            # so what remains after each request does not depend on the machine's speed.
            store = MemoryStore(clock) if clock is not None else None
            app = create_app(runtime, transport_factory=mock_transport(handler), store=store)
            await stack.enter_async_context(Lifespan(app))
            # Starlette re-raises a bug after answering it; a real server logs it and goes on
            transport = httpx.ASGITransport(app, raise_app_exceptions=raise_app_exceptions)
            return await stack.enter_async_context(
                httpx.AsyncClient(transport=transport, base_url="http://gateway")
            )

        yield build


@pytest.fixture
async def client(make_client: MakeClient) -> httpx.AsyncClient:
    """The app on default settings, with the admin API enabled."""
    return await make_client({"admin_key": ADMIN_KEY})
