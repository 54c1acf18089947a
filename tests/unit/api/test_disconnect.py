"""A client that leaves cancels its request's work; many requests share one timer."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from app.api.disconnect import CancelOnDisconnect

SCOPE: Scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST"}


class Client:
    """Sends its body, then leaves when told (`leave`), as a server reports it."""

    def __init__(self) -> None:
        self.left = asyncio.Event()
        self.sent: list[Message] = []
        self._body_sent = False

    async def receive(self) -> Message:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)


async def test_a_client_that_leaves_cancels_the_work_it_was_waiting_for() -> None:
    cancelled = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        try:
            await asyncio.Event().wait()  # an upstream that never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise

    client = Client()
    request = asyncio.create_task(CancelOnDisconnect(app)(SCOPE, client.receive, client.send))
    await asyncio.sleep(0)
    client.left.set()
    await asyncio.wait_for(cancelled.wait(), 30)  # the watcher started on a tick
    await request  # the cancellation it caused is absorbed, not raised
    assert not request.cancelled()


async def test_an_answer_sent_in_time_starts_no_watcher_and_leaves_nothing_armed() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard = CancelOnDisconnect(app)
    client = Client()
    await guard(SCOPE, client.receive, client.send)
    assert [m["type"] for m in client.sent] == ["http.response.start", "http.response.body"]
    assert not guard.ticker.fresh and not guard.ticker.due


async def test_requests_in_flight_share_one_timer(monkeypatch: Any) -> None:
    loop = asyncio.get_running_loop()
    timers = 0
    real = loop.call_later

    def counted(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        nonlocal timers
        timers += 1
        return real(delay, callback, *args)

    monkeypatch.setattr(loop, "call_later", counted)
    release = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard = CancelOnDisconnect(app)
    clients = [Client() for _ in range(50)]
    requests = [asyncio.create_task(guard(SCOPE, c.receive, c.send)) for c in clients]
    await asyncio.sleep(0)
    assert timers == 1  # not one per request
    release.set()
    await asyncio.gather(*requests)
    assert all(c.sent[-1]["type"] == "http.response.body" for c in clients)
