"""Every refusal leaves as an OpenAI error body from the one renderer (`app.api.error_handlers`),
byte for byte what clients have always received."""

from __future__ import annotations

import logging

import httpx
import pytest

from app.api import views
from app.gateway import Gateway
from tests.support.inproc import MakeClient


def error(message: str, kind: str, code: str | None, param: str | None = None) -> bytes:
    code_json = "null" if code is None else f'"{code}"'
    param_json = "null" if param is None else f'"{param}"'
    return (
        f'{{"error":{{"message":"{message}","type":"{kind}","param":{param_json},'
        f'"code":{code_json}}}}}'
    ).encode()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/embeddings"])
async def test_a_proxy_route_asked_without_post_is_405_naming_the_method(
    client: httpx.AsyncClient, path: str
) -> None:
    r = await client.get(path)
    assert r.status_code == 405
    # OpenAI's body on /v1/messages too: the method is refused before the dialect matters
    assert r.content == error(
        f"GET is not allowed on {path}: use POST", "invalid_request_error", "method_not_allowed"
    )
    assert r.headers["allow"] == "POST" and r.headers["x-should-retry"] == "false"
    assert r.headers["x-request-id"].startswith("req_")


async def test_a_wrong_method_on_a_fastapi_route_keeps_the_framework_status(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/health")
    assert r.status_code == 405
    assert r.content == error("Method Not Allowed", "invalid_request_error", None)
    assert "x-should-retry" not in r.headers


async def test_an_unknown_route_is_404_naming_it(client: httpx.AsyncClient) -> None:
    r = await client.get("/nope")
    assert r.status_code == 404
    assert r.content == error(
        "Unknown request URL: GET /nope", "invalid_request_error", "not_found"
    )
    assert r.headers["x-should-retry"] == "false"


async def test_a_body_past_the_limit_is_413_before_it_is_read(make_client: MakeClient) -> None:
    client = await make_client({"server": {"max_body_bytes": 100}})
    r = await client.post("/v1/chat/completions", content=b"x" * 200)
    assert r.status_code == 413
    assert r.content == error(
        "request body exceeds the gateway's limit of 100 bytes (server.max_body_bytes)",
        "invalid_request_error",
        "request_too_large",
    )
    assert r.headers["x-should-retry"] == "false"
    anthropic = await client.post("/v1/messages", content=b"x" * 200)
    assert anthropic.status_code == 413
    assert anthropic.json() == {
        "type": "error",
        "error": {
            "type": "request_too_large",
            "message": "request body exceeds the gateway's limit of 100 bytes "
            "(server.max_body_bytes)",
        },
    }


@pytest.mark.parametrize(
    ("headers", "why"),
    [({f"x-h{i}": "v" for i in range(130)}, "count"), ({"x-big": "v" * 70_000}, "size")],
)
async def test_headers_past_the_limits_are_431_and_close_the_connection(
    client: httpx.AsyncClient, headers: dict[str, str], why: str
) -> None:
    r = await client.post("/v1/chat/completions", headers=headers, content=b"{}")
    assert r.status_code == 431, why
    assert r.content == error(
        "request headers exceed the gateway's limit (65536 bytes, 128 headers)",
        "invalid_request_error",
        "headers_too_large",
    )
    assert r.headers["connection"] == "close" and r.headers["content-type"] == "application/json"
    assert r.headers["x-request-id"].startswith("req_")  # a fresh id: the headers went unread
    assert "x-should-retry" not in r.headers


async def test_a_body_that_fails_validation_is_400_naming_the_field(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/v1/batches", json={"input_file_id": 1})
    assert r.status_code == 400
    body = r.json()["error"]
    assert body["type"] == "invalid_request_error" and body["code"] == "invalid_request"
    assert r.headers["x-should-retry"] == "false"


async def test_a_bug_is_a_generic_500_with_no_detail(
    make_client: MakeClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    client = await make_client(raise_app_exceptions=False)

    def broken(self: Gateway) -> tuple[bool, dict[str, object]]:
        raise RuntimeError("secret detail sk-do-not-show-0123456789")

    monkeypatch.setattr(views, "readiness", broken)
    with caplog.at_level(logging.ERROR, "tokengate.errors"):
        r = await client.get("/health/ready")
    assert r.status_code == 500
    assert r.content == error(
        "internal error; see the gateway log", "server_error", "internal_error"
    )
    assert "unhandled error on /health/ready" in caplog.text
