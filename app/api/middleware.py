"""Pure-ASGI middleware (no per-request BaseHTTPMiddleware tasks or body copies).

`RequestContext` gives every request an id (the client's `x-request-id` when it is
a sane token, else a fresh one), stores it in `scope["state"]` and returns it in the
`x-request-id` response header, on errors too. While the gateway drains it also sends
`connection: close`, so keep-alive clients reconnect (to a live worker or replica)
instead of racing the listener's shutdown on an idle connection.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_SAFE_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


def new_request_id() -> str:
    return "req_" + os.urandom(12).hex()


class RequestContext:
    def __init__(self, app: ASGIApp, draining: Callable[[], bool] = lambda: False) -> None:
        self.app = app
        self.draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                if _SAFE_ID.match(value):
                    rid = value.decode()
                break
        rid = rid or new_request_id()
        scope.setdefault("state", {})["request_id"] = rid
        header = (b"x-request-id", rid.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [header, (b"connection", b"close")] if self.draining() else [header]
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        await self.app(scope, receive, send_with_id)
