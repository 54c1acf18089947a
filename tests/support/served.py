"""An ASGI app served by uvicorn inside the test's event loop, on a loopback port.

As uvicorn's own tests run a server (`run_server`): real sockets on both sides, so a
client sees what a client of `tokengate serve` sees (streaming as it is written, flow
control, connection reuse), while the test can still look inside the process and drive
the scripted upstream on the same loop.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from tests.support.waiting import PATIENCE


class Served:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Future[Any] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Served:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            lifespan="on",
            http="httptools",
            log_config=None,
            access_log=False,
            timeout_keep_alive=30,
        )
        server = self._server = uvicorn.Server(config)
        self._task = asyncio.ensure_future(server.serve(sockets=[sock]))
        async with asyncio.timeout(PATIENCE):
            while not server.started:
                if self._task.done():  # startup failed: raise what it raised
                    await self._task
                    raise RuntimeError("uvicorn stopped before it started")
                await asyncio.sleep(0.005)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None and self._task is not None
        self._server.should_exit = True
        async with asyncio.timeout(PATIENCE):
            await self._task
