"""Cancel a request's work when its client disconnects.

ASGI servers only report a disconnect through `receive()`, which nobody calls once
the body has been read; without this, a queued request would still be dispatched
and an upstream generation would run to its end for nobody. Once the body is
consumed, a watcher awaits the next message; `http.disconnect` cancels the request's
task, which closes its upstream connection (the upstream sees the cancellation) or
removes it from its domain queue. The cancellation it caused is absorbed here, not
reported as an error.

The watcher starts 100 to 200 ms (`WATCH_AFTER_SEC` to twice that) after the body is
read, not at once: a task per request was a measurable share of the gateway's
instructions per proxied request (deploy/BENCHMARKS.md, "Figures behind the design"),
and short answers end before it would start. Nor does each request set a timer of its
own (a timer per request was 3 % of the gateway's own CPU): one tick every
`WATCH_AFTER_SEC`, running only while requests are in flight, starts the watchers of
the requests armed before the previous tick. The price: a client that leaves is
noticed up to 200 ms later, and an upstream call started meanwhile is cancelled then.
The watcher is a child of the request and always ends with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

WATCH_AFTER_SEC = 0.1


class CancelOnDisconnect:
    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...] = ("/v1/",)) -> None:
        self.app = app
        self.prefixes = prefixes
        self.ticker = _Ticker()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        watch = _Watch(task, receive, send, self.ticker)
        try:
            await self.app(scope, watch.receive, watch.send)
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            task.uncancel()
        finally:
            watch.stop()


class _Ticker:
    """Starts the watchers of requests whose body was read a tick or more ago. Two
    generations: armed since the last tick (`fresh`), and armed before it (`due`)."""

    __slots__ = ("_handle", "due", "fresh")

    def __init__(self) -> None:
        self.fresh: dict[_Watch, None] = {}  # insertion-ordered set
        self.due: dict[_Watch, None] = {}
        self._handle: asyncio.TimerHandle | None = None

    def arm(self, watch: _Watch) -> None:
        self.fresh[watch] = None
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(WATCH_AFTER_SEC, self._tick)

    def disarm(self, watch: _Watch) -> None:
        self.fresh.pop(watch, None)
        self.due.pop(watch, None)

    def _tick(self) -> None:
        due, self.due, self.fresh = self.due, self.fresh, {}
        for watch in due:
            watch.start()
        self._handle = (
            asyncio.get_running_loop().call_later(WATCH_AFTER_SEC, self._tick) if self.due else None
        )


class _Watch:
    __slots__ = ("_receive", "_send", "_ticker", "_watcher", "finished", "gone", "task")

    def __init__(
        self, task: asyncio.Task[object], receive: Receive, send: Send, ticker: _Ticker
    ) -> None:
        self.task = task
        self._receive = receive
        self._send = send
        self._ticker = ticker
        self._watcher: asyncio.Task[None] | None = None
        self.gone = self.finished = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            self._ticker.arm(self)
        return message

    def send(self, message: Message) -> Awaitable[None]:
        # Not a coroutine of its own: the server's `send(message)` goes back to the caller
        # to await, one frame less for every message (each SSE event is one).
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished = True
        return self._send(message)

    def start(self) -> None:
        if not self.finished and self._watcher is None:
            self._watcher = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        message = await self._receive()
        # Servers also answer `http.disconnect` once the response is complete.
        if message["type"] == "http.disconnect" and not self.finished:
            self.gone = True
            self.task.cancel()

    def stop(self) -> None:
        self._ticker.disarm(self)
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
