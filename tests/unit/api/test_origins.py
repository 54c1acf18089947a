"""The browser guard as a pure ASGI layer: which requests a web page could have sent
are refused (origin, DNS-rebound host, CORS-simple body), which pass untouched, and the
CORS answers a listed origin gets."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from app.api.browser import BrowserGuard

LISTED = "https://chat.example.com"


async def inner(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def scope(
    method: str = "POST",
    path: str = "/v1/chat/completions",
    server: tuple[str, int] = ("127.0.0.1", 8080),
    **headers: str,
) -> Scope:
    raw = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return {
        "type": "http",
        "method": method,
        "path": path,
        "headers": raw,
        "server": server,
        "state": {},
    }


async def call(guard: BrowserGuard, s: Scope) -> tuple[int, dict[bytes, bytes], dict[str, Any]]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await guard(s, receive, send)
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    parsed = json.loads(body) if body != b"ok" and body else {}
    return start["status"], dict(start["headers"]), parsed


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"host": "127.0.0.1:8080"}, 200, None),  # curl, SDKs
        ({"host": "localhost:8080", "content_type": "application/json"}, 200, None),
        ({"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"}, 200, None),  # /ui
        ({"host": "127.0.0.1:8080", "origin": "http://evil.example"}, 403, "origin_not_allowed"),
        ({"host": "127.0.0.1:8080", "origin": "null"}, 403, "origin_not_allowed"),
        (
            {"host": "evil.example:8080", "origin": "http://evil.example:8080"},
            403,
            "host_not_allowed",
        ),
        ({"host": "evil.example:8080", "sec_fetch_site": "same-origin"}, 403, "host_not_allowed"),
        ({"host": "evil.example:8080"}, 200, None),  # keys on: a rebound page has no key
        ({"host": "127.0.0.1:8080", "content_type": "text/plain"}, 415, "unsupported_media_type"),
        (
            {"host": "h", "content_type": "application/x-www-form-urlencoded"},
            415,
            "unsupported_media_type",
        ),
        (
            {"host": "h", "content_type": "Multipart/Form-Data; b=1"},
            415,
            "unsupported_media_type",
        ),
        ({"host": "chat.example.com", "origin": LISTED}, 200, None),
        ({"host": "gw.internal", "origin": LISTED, "content_type": "text/plain"}, 200, None),
    ],
)
async def test_what_a_web_page_could_send_is_refused(
    headers: dict[str, str], status: int, code: str | None
) -> None:
    got, _, body = await call(BrowserGuard(inner, [LISTED]), scope(**headers))  # type: ignore[arg-type]  # headers are header names only
    assert got == status
    if code is not None:
        assert body["error"]["code"] == code


async def test_with_no_auth_a_foreign_host_on_loopback_is_refused_without_browser_hints() -> None:
    guard = BrowserGuard(inner, [LISTED], open_gateway=True)
    assert (await call(guard, scope(host="evil.example:8080")))[0] == 403
    assert (await call(guard, scope(host="[::1]:8080")))[0] == 200
    assert (await call(guard, scope(host="app.localhost:8080")))[0] == 200
    assert (await call(guard, scope(host="chat.example.com")))[0] == 200  # a listed host
    # bound to every interface: the address the connection came in on is ours
    lan = scope(host="10.1.2.3:8080", server=("10.1.2.3", 8080), origin="http://10.1.2.3:8080")
    assert (await call(guard, lan))[0] == 200


async def test_uploads_and_bodiless_requests_keep_their_content_types() -> None:
    guard = BrowserGuard(inner)
    upload = scope(path="/v1/files", host="h", content_type="multipart/form-data; boundary=x")
    assert (await call(guard, upload))[0] == 200
    assert (await call(guard, scope("GET", "/v1/models", host="h", content_type="text/plain")))[
        0
    ] == 200


async def test_a_listed_origin_gets_its_preflight_and_readable_answers() -> None:
    guard = BrowserGuard(inner, [LISTED])
    pre = scope(
        "OPTIONS",
        host="gw",
        origin=LISTED,
        access_control_request_method="POST",
        access_control_request_headers="authorization, content-type",
    )
    status, headers, _ = await call(guard, pre)
    assert status == 204 and headers[b"access-control-allow-origin"] == LISTED.encode()
    assert headers[b"access-control-allow-headers"] == b"authorization, content-type"
    status, headers, _ = await call(guard, scope(host="gw", origin=LISTED))
    assert status == 200 and headers[b"access-control-allow-origin"] == LISTED.encode()
    _, plain, _ = await call(guard, scope(host="127.0.0.1"))
    assert b"access-control-allow-origin" not in plain  # nobody else gets CORS
