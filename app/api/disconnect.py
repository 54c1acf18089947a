"""Cancel a request's work the moment its client disconnects.

ASGI servers only report a disconnect through `receive()`, which nobody calls once
the body has been read; without this, a queued request would still be dispatched
and an upstream generation would run to its end for nobody. Once the body is
consumed, a watcher awaits the next message; `http.disconnect` cancels the request's
task, which closes its upstream connection (the upstream sees the cancellation) or
removes it from its domain queue. The watcher is a child of the request and always
ends with it; the cancellation it caused is absorbed here, not reported as an error.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class CancelOnDisconnect:
    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...] = ("/v1/",)) -> None:
        self.app = app
        self.prefixes = prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        watcher: asyncio.Task[None] | None = None
        gone = finished = False

        async def watch() -> None:
            nonlocal gone
            message = await receive()
            # Servers also answer `http.disconnect` once the response is complete.
            if message["type"] == "http.disconnect" and not finished:
                gone = True
                task.cancel()

        async def tracked_send(message: Message) -> None:
            nonlocal finished
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        async def tracked_receive() -> Message:
            nonlocal watcher
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                watcher = asyncio.create_task(watch())
            return message

        try:
            await self.app(scope, tracked_receive, tracked_send)
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()
        finally:
            if watcher is not None and not watcher.done():
                watcher.cancel()
