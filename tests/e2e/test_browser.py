"""A browser is a hostile client (issue #31): a page on another origin, a CORS-simple
POST, a DNS-rebound Host, over real sockets against a `--no-auth` gateway (the worst
case: no key to steal, so only the edge stands between a web page and the upstream)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import InvalidStatus
from websockets.typing import Origin

from tests.support.procs import Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
BODY: Any = {"model": "gpt-4o", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 4}
LISTED = "http://app.example.test:3000"


@pytest.fixture
def open_gateway(sim: Sim, make_gateway: Make) -> Gateway:
    spec = GatewaySpec(
        keys={}, args=["--no-auth"], settings={"server": {"allowed_origins": [LISTED]}}
    )
    return make_gateway(spec, sim.url)


def chat(gw: Gateway, **headers: str) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/chat/completions", json=BODY, headers=headers, timeout=30)


def refused(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    kind = "permission_error" if status == 403 else "invalid_request_error"
    assert error["code"] == code and error["type"] == kind
    assert "allowed_origins" in error["message"] or code == "unsupported_media_type"


def test_a_page_on_another_origin_is_refused_and_sdks_are_not(
    open_gateway: Gateway, sim: Sim
) -> None:
    gw = open_gateway
    sim.clear()
    refused(chat(gw, origin="http://evil.example"), 403, "origin_not_allowed")
    refused(chat(gw, origin="null"), 403, "origin_not_allowed")
    models = httpx.get(f"{gw.url}/v1/models", headers={"origin": "http://evil.example"})
    refused(models, 403, "origin_not_allowed")
    assert sim.records("/v1/chat/completions") == []  # nothing reached the upstream
    assert chat(gw).status_code == 200  # an SDK or curl: no Origin
    assert chat(gw, origin=LISTED).status_code == 200  # listed by the operator
    assert chat(gw, origin=gw.url).status_code == 200  # the gateway's own pages
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0) as client:
        assert client.chat.completions.create(**BODY).choices  # the SDK is untouched


def test_a_cors_simple_post_is_refused_on_a_json_route(open_gateway: Gateway, sim: Sim) -> None:
    gw = open_gateway
    sim.clear()
    raw = '{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
    for kind in (
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ):
        for path in ("/v1/chat/completions", "/v1/responses", "/v1/batches"):
            r = httpx.post(f"{gw.url}{path}", content=raw, headers={"content-type": kind})
            refused(r, 415, "unsupported_media_type")
    assert sim.records() == [] or all(r["path"] == "/v1/models" for r in sim.records())
    ok = httpx.post(
        f"{gw.url}/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert ok.status_code == 200


def test_a_dns_rebound_host_is_refused(open_gateway: Gateway) -> None:
    gw = open_gateway
    rebound = f"evil.example:{gw.port}"
    refused(chat(gw, host=rebound, origin=f"http://{rebound}"), 403, "host_not_allowed")
    r = httpx.get(f"{gw.url}/v1/models", headers={"host": rebound, "sec-fetch-site": "same-origin"})
    refused(r, 403, "host_not_allowed")
    # on the loopback interface any foreign name is a rebinding: refused without browser hints
    refused(chat(gw, host=rebound), 403, "host_not_allowed")
    for name in ("localhost", "127.0.0.1", "app.example.test"):
        assert chat(gw, host=f"{name}:{gw.port}").status_code == 200, name


def ws_url(gw: Gateway) -> str:
    return gw.url.replace("http", "ws") + "/v1/responses"


def test_the_websocket_handshake_checks_the_origin(open_gateway: Gateway) -> None:
    gw = open_gateway
    with pytest.raises(InvalidStatus) as denied:
        ws_client.connect(ws_url(gw), origin=Origin("http://evil.example"))
    assert denied.value.response.status_code == 403
    assert b"origin_not_allowed" in denied.value.response.body
    rebound = f"evil.example:{gw.port}"
    with pytest.raises(InvalidStatus) as rebind:
        ws_client.connect(
            ws_url(gw),
            origin=Origin(f"http://{rebound}"),
            additional_headers={"host": rebound},
        )
    assert rebind.value.response.status_code == 403
    for origin in (None, LISTED):
        # max_queue=None: the client reads on while it closes mid-turn; with its default
        # queue of 16 frames the rest of the turn filled it, it stopped reading and saw the
        # gateway's close frame only after its own 10 s close timeout
        with ws_client.connect(ws_url(gw), origin=origin, max_queue=None) as conn:  # type: ignore[arg-type]
            conn.send('{"type": "response.create", "model": "gpt-4o", "input": "hi"}')
            assert "response.created" in str(conn.recv(timeout=30))
