"""`GET /v1/responses` with `Upgrade: websocket`: the Responses API's WebSocket mode.

The upgrade is refused at once when it cannot be served: 426 when the mode is off
(`responses.websocket = false`), no domain serves the Responses API, the gateway is
draining, or the path is not `/v1/responses` (every "no WebSocket here" is a 426: Codex CLI then
falls back to HTTP for the whole session, in one round trip; a 404 or 405 would cost it
seven attempts over several seconds), 401 for a bad key. Both are real HTTP answers with
OpenAI's error body (the ASGI WebSocket denial response), sent before the handshake.

Accepted, the connection is two tasks in one `TaskGroup` (they end together, no task
outlives the connection): the reader takes client frames into a short inbox, and the
worker answers them one at a time through a `SocketSession`. A client that leaves cancels
the worker, which cancels its queued or streaming request like an HTTP disconnect does
(slot freed, upstream closed, key charged what was streamed). The client's close frame is
answered by uvicorn's protocol itself (`ws="auto"` is websockets-sansio), at once and
whatever the worker is doing; the reader then gets `websocket.disconnect` (a dropped TCP
connection gives one too), and a send after it raises, so the turn ends either way
(tests/e2e/test_socket_close.py). While the gateway drains,
the worker closes the socket (1001) after the response in flight: the client reconnects,
to a live replica, and sends its whole conversation again.

Limits (issue 31): a key holds at most `max_websockets` connections (else
`server.max_websockets_per_key`; one more is a 429 before the handshake); a connection on
which the client sends nothing for `server.websocket_idle_timeout_sec`, with no answer in
flight, is closed (1001); a key that stops being valid (revoked by a reload, expired) is
refused on its next message, which ends the connection (1008). Frames are at most
`server.max_body_bytes` (uvicorn's `ws_max_size`), and so is the conversation a
connection accumulates (`SocketSession`).
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from app.api.deps import caller_of
from app.api.error_handlers import render
from app.api.middleware import new_request_id
from app.errors import GatewayError, RateLimited, UpgradeRequired
from app.gateway import Gateway
from app.pipeline.conversation import SESSION_HEADERS
from app.pipeline.socket_session import SocketSession
from app.runtime import KeySpec
from app.upstream.client import forwardable
from app.upstream.websocket import UpstreamSockets

log = logging.getLogger("tokengate.errors")
MAX_PENDING = 8  # client messages waiting behind the one being answered
GOING_AWAY = 1001
POLICY = 1008
INTERNAL = 1011
_GONE = (WebSocketDisconnect, WebSocketDisconnected, OSError)


def not_served(gateway: Gateway, path: str = "/v1/responses") -> UpgradeRequired | None:
    if path != "/v1/responses":
        return UpgradeRequired(
            f"no WebSocket mode on {path[:200]}; the Responses WebSocket mode is at "
            "/v1/responses (use HTTP here)"
        )
    if gateway.draining:
        return UpgradeRequired(
            "the gateway is restarting and takes no new WebSocket connections; "
            "use POST /v1/responses"
        )
    if not gateway.runtime.settings.responses.websocket:
        return UpgradeRequired(
            "the Responses WebSocket mode is off on this gateway (responses.websocket); "
            "use POST /v1/responses"
        )
    if not gateway.pipeline.planner.responders:
        return UpgradeRequired(
            "no domain of this gateway serves the Responses API; use POST /v1/responses"
        )
    return None


async def serve_socket(scope: Scope, receive: Receive, send: Send, gateway: Gateway) -> None:
    ws: WebSocket = WebSocket(scope, receive, send)
    if (await ws.receive())["type"] != "websocket.connect":
        return
    try:
        refusal = not_served(gateway, scope["path"])
        if refusal is not None:
            raise refusal
        caller = caller_of(scope, gateway)
        _take_place(gateway, caller)
    except GatewayError as exc:
        gateway.metrics.record_socket_upgrade(exc.status)
        await _deny(ws, exc)
        return
    try:
        await ws.accept()
        gateway.metrics.record_socket_upgrade(101)
        gateway.metrics.socket_opened()
        session = _session(gateway, scope)
        try:
            await _converse(ws, gateway, session)
        except* _GONE:
            pass  # the client left: its request was cancelled with the worker
        except* Exception as group:
            log.error("responses websocket failed", exc_info=group.exceptions[0])
            await _close(ws, INTERNAL, "internal error; see the gateway log")
        finally:
            gateway.metrics.socket_closed()
            await session.close()
    finally:
        gateway.socket_counts.give_back(caller.alias)


def _take_place(gateway: Gateway, caller: KeySpec) -> None:
    """One of the key's connections (`max_websockets`), or 429 before the handshake."""
    cap = caller.max_websockets or gateway.runtime.settings.server.max_websockets_per_key
    cap = max(1, cap // gateway.divisor)  # without Redis, each of N workers holds 1/N
    if not gateway.socket_counts.take(caller.alias, cap):
        gateway.metrics.record_rate_limited(caller.alias, "websockets")
        raise RateLimited(
            f"This key already holds {cap} open WebSocket connections, its limit "
            "(max_websockets); close one, or use POST /v1/responses.",
            code="websocket_connection_limit_reached",
            retry_after=1.0,
            should_retry=False,
        )


def _session(gateway: Gateway, scope: Scope) -> SocketSession:
    # The upgrade's `openai-beta: responses_websockets=...` names the socket protocol; it
    # is not a beta of the HTTP requests the session makes.
    headers = {
        k: v
        for k, v in forwardable(scope["headers"]).items()
        if not (k == "openai-beta" and "responses_websockets" in v)
    }
    settings = gateway.runtime.settings
    return SocketSession(
        gateway.responses,
        lambda: caller_of(scope, gateway),
        headers,
        gateway.metrics,
        cached=settings.responses.websocket_cached_responses,
        max_body=settings.server.max_body_bytes,
        new_request_id=new_request_id,
        sockets=UpstreamSockets(gateway.socket_dialer) if gateway.socket_dialer else None,
        max_wait=settings.token_scheduler.max_queue_wait_ms / 1000,
        session_header=next(
            (v.decode("latin-1") for k, v in scope["headers"] if k in SESSION_HEADERS), None
        ),
    )


async def _converse(ws: WebSocket, gateway: Gateway, session: SocketSession) -> None:
    inbox: asyncio.Queue[str] = asyncio.Queue(MAX_PENDING)
    idle = gateway.runtime.settings.server.websocket_idle_timeout_sec

    async def work() -> None:
        while True:
            text = await inbox.get()
            gateway.socket_turns += 1
            try:
                valid = await session.handle(text, ws.send_text)
            finally:
                gateway.socket_turns -= 1
            if not valid:
                await _close(ws, POLICY, "the key is no longer valid")
                return
            if gateway.draining:
                await _close(ws, GOING_AWAY, "the gateway is restarting; reconnect")
                return

    # A TaskGroup, not asyncio.create_task: the worker is the connection's child and can
    # never outlive it.
    async with asyncio.TaskGroup() as group:
        worker = group.create_task(work())
        while True:
            try:
                async with asyncio.timeout(idle):
                    message = await ws.receive()
            except TimeoutError:
                if session.busy or not inbox.empty():
                    continue  # quiet while its answer streams: not idle
                worker.cancel()
                await _close(ws, GOING_AWAY, f"idle timeout ({idle:g} s without a message)")
                return
            if message["type"] == "websocket.disconnect":
                worker.cancel()
                return
            text = message.get("text")
            if text is None:
                text = (message.get("bytes") or b"").decode("utf-8", "replace")
            try:
                inbox.put_nowait(text)
            except asyncio.QueueFull:
                worker.cancel()
                await _close(ws, POLICY, "too many requests waiting on this connection")
                return


async def _deny(ws: WebSocket, exc: GatewayError) -> None:
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(render(exc))
    else:  # a server without the denial extension: a close before accepting is a 403
        await ws.close(POLICY, exc.message[:120])


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    try:
        await ws.close(code, reason)
    except _GONE:
        pass
