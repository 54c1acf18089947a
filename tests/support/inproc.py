"""The gateway in-process: a `Gateway` (or the whole ASGI app) on a test's own settings.

`local_settings` fills in what every in-process test wants (no health probes, the
database file under the test's tmp dir); `Lifespan` runs an ASGI app's
startup and shutdown, which httpx's `ASGITransport` does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp, Message

from app.assembly import TransportFactory
from app.config.schema import Settings
from app.db import migrate
from app.db.usage import UsageQuery
from app.gateway import Gateway
from app.upstream.httpx_transport import HttpxTransport
from app.upstream.transport import Timeouts

Handler = Callable[[httpx.Request], httpx.Response]
MakeGateway = Callable[..., Gateway]  # the `make_local_gateway` fixture (tests/unit/conftest.py)
MakeClient = Callable[..., Awaitable[httpx.AsyncClient]]  # `make_client` (tests/unit/api/)
ADMIN_KEY = "adm-unit-0123456789"
# A chat completion as an upstream answers it (model m-1), for MockTransport handlers.
CHAT_OK = {
    "id": "c",
    "object": "chat.completion",
    "model": "m-1",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}


def local_settings(tmp_path: Path, data: dict[str, Any] | None = None) -> Settings:
    return Settings.model_validate(
        {
            "health_check": {"enabled": False},
            "database": {"path": str(tmp_path / "tokengate.sqlite3")},
            **(data or {}),
        }
    )


async def ledger_rows(gateway: Gateway) -> list[dict[str, Any]]:
    """`/admin/usage`'s rows, from a gateway that may not have been started."""
    await migrate.prepare(gateway.db)
    return await gateway.ledger.report(UsageQuery())


def mock_transport(handler: Handler) -> TransportFactory:
    """A transport factory answering every upstream request with `handler`."""
    return lambda spec: HttpxTransport(Timeouts(1, 5), 5, 8, transport=httpx.MockTransport(handler))


class Lifespan:
    """Drives the ASGI lifespan protocol, like the server would around the test."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def _send(self, message: Message) -> None:
        await self._outbox.put(message)

    async def _step(self, kind: str) -> None:
        await self._inbox.put({"type": f"lifespan.{kind}"})
        message = await asyncio.wait_for(self._outbox.get(), 10)
        assert message["type"] == f"lifespan.{kind}.complete", message

    async def __aenter__(self) -> Lifespan:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._task = asyncio.ensure_future(self.app(scope, self._inbox.get, self._send))
        await self._step("startup")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._step("shutdown")
        assert self._task is not None
        await asyncio.wait_for(self._task, 10)


def gateway_of(client: httpx.AsyncClient) -> Gateway:
    """The `Gateway` behind a client of `make_client`: FastAPI's state, under the
    pure-ASGI layers that wrap it."""
    app: Any = client._transport.app  # type: ignore[attr-defined]
    while not hasattr(app, "state"):
        app = app.app
    gateway: Gateway = app.state.gateway
    return gateway
