"""The request context: every answer carries its `x-request-id` (the client's when sane,
else a fresh one), a draining gateway adds `connection: close`, and the app's own
headers and messages reach the server unchanged (headers and each body chunk)."""

from __future__ import annotations

import re
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from app.api.middleware import RequestContext


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 201, "headers": [(b"x-own", b"1")]})
    await send({"type": "http.response.body", "body": b"a", "more_body": True})
    await send({"type": "http.response.body", "body": b"b"})


async def _call(headers: list[tuple[bytes, bytes]], draining: bool = False) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    scope: dict[str, Any] = {"type": "http", "path": "/v1/x", "method": "POST"}
    scope["headers"] = headers
    await RequestContext(_app, draining=lambda: draining)(scope, receive, send)
    return sent


async def test_the_clients_request_id_is_returned_with_the_apps_headers_and_body() -> None:
    sent = await _call([(b"x-request-id", b"abc-123")])
    assert sent[0]["status"] == 201
    assert sent[0]["headers"] == [(b"x-own", b"1"), (b"x-request-id", b"abc-123")]
    assert [(m["body"], m.get("more_body", False)) for m in sent[1:]] == [
        (b"a", True),
        (b"b", False),
    ]


async def test_an_unsafe_request_id_is_replaced_and_draining_closes_the_connection() -> None:
    sent = await _call([(b"x-request-id", b"bad id\r\n")], draining=True)
    headers = dict(sent[0]["headers"])
    assert headers[b"x-request-id"].startswith(b"req_")
    assert headers[b"connection"] == b"close"
    assert len(sent) == 3


async def test_fresh_request_ids_are_distinct_24_hex_digit_tokens() -> None:
    """Operators grep logs and the status page by these ids: each one fresh, and of the
    one shape (`req_` and 24 lowercase hex digits, leading zeros kept)."""
    ids = [dict((await _call([]))[0]["headers"])[b"x-request-id"] for _ in range(500)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(rb"req_[0-9a-f]{24}", rid) for rid in ids)
