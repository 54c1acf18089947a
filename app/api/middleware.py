"""Pure-ASGI middleware (no per-request BaseHTTPMiddleware tasks or body copies).

`RequestContext` gives every request an id (the client's `x-request-id` when it is
a sane token, else a fresh one), stores it in `scope["state"]` and returns it in the
`x-request-id` response header, on errors too. While the gateway drains it also sends
`connection: close`, so keep-alive clients reconnect (to a live worker or replica)
instead of racing the listener's shutdown on an idle connection. It is also where a
request nothing deeper recorded gets its access-log line (`app.api.access_note`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from random import getrandbits

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.access_note import AccessNote, AccessRecorder, refused
from app.api.error_handlers import render
from app.errors import HeadersTooLarge

_SAFE_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


def new_request_id() -> str:
    # An id, not a secret: 96 bits from the (per-process seeded) PRNG are unique enough
    # and cost less than a getrandom(2) syscall per request. `bytes.hex` writes the same
    # 24 lowercase digits as `f"{n:024x}"` at about a third of its instructions.
    return "req_" + getrandbits(96).to_bytes(12, "big").hex()


class RequestContext:
    def __init__(
        self,
        app: ASGIApp,
        draining: Callable[[], bool] = lambda: False,
        max_header_bytes: int = 64 * 1024,
        max_headers: int = 128,
        recorder: AccessRecorder | None = None,
    ) -> None:
        self.app = app
        self.draining = draining
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.recorder = recorder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = None
        size = 0
        for name, value in scope["headers"]:
            size += len(name) + len(value)
            if name == b"x-request-id" and rid is None and _SAFE_ID.match(value):
                rid = value.decode()
        started = time.perf_counter()
        note = AccessNote()
        note.endpoint = scope["path"][:200]
        state = scope.setdefault("state", {})
        state["access"] = note
        status: int | None = None
        if size > self.max_header_bytes or len(scope["headers"]) > self.max_headers:
            # httptools sets no bound of its own; headers must not bypass the body limit
            error = HeadersTooLarge(self.max_header_bytes, self.max_headers)
            refused(scope, error)
            rid = new_request_id()
            response = render(error)
            response.headers["x-request-id"] = rid
            await response(scope, receive, send)
            self._record(scope, note, rid, error.status, started)
            return
        rid = rid or new_request_id()
        state["request_id"] = rid
        header = (b"x-request-id", rid.encode())

        def send_with_id(message: Message) -> Awaitable[None]:
            # Not a coroutine of its own: it hands back the server's `send(message)` for the
            # caller to await, one frame less for every message (each SSE event is one).
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), header]
                if self.draining():
                    headers.append((b"connection", b"close"))
                message["headers"] = headers
            return send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            self._record(scope, note, rid, status, started)  # None: the client left
            raise
        except BaseException:
            self._record(scope, note, rid, status or 500, started)
            raise
        self._record(scope, note, rid, status, started)

    def _record(
        self, scope: Scope, note: AccessNote, rid: str, status: int | None, started: float
    ) -> None:
        if self.recorder is not None and not note.handled:
            ms = (time.perf_counter() - started) * 1000
            self.recorder.record(scope, note, rid, status, ms)
