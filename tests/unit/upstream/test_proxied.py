"""Upstreams reached through an HTTP proxy from the environment, on a real local proxy.

`tests.support.forward_proxy.ForwardProxy` runs on a loopback port, with and without
required credentials; the upstream is a loopback server (TLS for the CONNECT cases, so
the handshake runs through the tunnel), reached by the shipped transport (aiohttp) on
the route `proxyenv` resolved; NO_PROXY must send requests around the proxy. The
gateway-level cases are in `conformance/test_reach.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from app.upstream.aiohttp_transport import AiohttpTransport
from app.upstream.proxyenv import Proxies
from app.upstream.transport import Timeouts, Transport
from tests.support.forward_proxy import ForwardProxy
from tests.support.loopback import Upstream, ok, serve, within
from tests.support.tls import certificate

Make = Callable[..., Transport]


def aio(up: Upstream, env: dict[str, str]) -> Transport:
    context = certificate().client() if up.tls else None
    return AiohttpTransport(Timeouts(1.0, 1.0), 2.0, 4, ssl_context=context, proxies=Proxies(env))


CLIENTS = [pytest.param(aio, id="aiohttp")]
AUTH = [pytest.param(None, id="open"), pytest.param(("u s", "p@ss:w"), id="auth")]


async def exchange(make: Make, up: Upstream, env: dict[str, str], n: int = 2) -> list[bytes]:
    t = make(up, env)
    try:
        out = []
        for _ in range(n):
            resp = await within(t.request("POST", up.url("/v1/x?a=1"), {}, b"{}", stream=False))
            out.append(await within(resp.read()))
        return out
    finally:
        await t.close()


def userinfo(credentials: tuple[str, str] | None) -> str:
    if credentials is None:
        return ""
    from urllib.parse import quote

    return f"{quote(credentials[0], safe='')}:{quote(credentials[1], safe='')}"


@pytest.mark.parametrize("make", CLIENTS)
@pytest.mark.parametrize("credentials", AUTH)
async def test_https_upstream_goes_through_a_connect_tunnel(
    make: Make, credentials: tuple[str, str] | None
) -> None:
    tls = certificate().server()
    async with ForwardProxy(credentials) as proxy, Upstream(serve(ok(b"hi")), tls=tls) as up:
        env = {"HTTPS_PROXY": proxy.url(userinfo(credentials))}
        assert await exchange(make, up, env) == [b"hi", b"hi"]
        assert proxy.tunnels == [b"127.0.0.1:%d" % up.port]  # one tunnel, kept alive
        # the upstream saw origin-form requests and never the proxy's credential
        assert all(r.startswith(b"POST /v1/x?a=1 ") for r in up.requests)
        assert not any(b"proxy-authorization" in r.lower() for r in up.requests)


@pytest.mark.parametrize("make", CLIENTS)
@pytest.mark.parametrize("credentials", AUTH)
async def test_http_upstream_goes_through_the_proxy_in_absolute_form(
    make: Make, credentials: tuple[str, str] | None
) -> None:
    async with ForwardProxy(credentials) as proxy, Upstream(serve(ok(b"hi"))) as up:
        env = {"http_proxy": proxy.url(userinfo(credentials))}
        assert await exchange(make, up, env) == [b"hi", b"hi"]
        target = b"http://127.0.0.1:%d/v1/x?a=1" % up.port
        assert [h.split(b" ")[1] for h in proxy.heads] == [target, target]
        assert not any(b"proxy-authorization" in r.lower() for r in up.requests)


@pytest.mark.parametrize("make", CLIENTS)
async def test_wrong_proxy_credentials_are_a_connect_failure_without_the_secret(
    make: Make,
) -> None:
    tls = certificate().server()
    async with ForwardProxy(("user", "right")) as proxy, Upstream(serve(ok()), tls=tls) as up:
        env = {"HTTPS_PROXY": proxy.url("user:s3cr3t-wrong")}
        with pytest.raises(Exception) as err:
            await exchange(make, up, env)
        assert getattr(err.value, "reason", None) == "connect"
        assert "s3cr3t" not in str(err.value) and "s3cr3t" not in repr(err.value)
        assert not up.requests


@pytest.mark.parametrize("make", CLIENTS)
@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "localhost,.example.com,127.0.0.1", "*"])
async def test_no_proxy_sends_around_the_proxy(make: Make, no_proxy: str) -> None:
    async with ForwardProxy() as proxy, Upstream(serve(ok(b"direct"))) as up:
        env = {"HTTP_PROXY": proxy.url(), "HTTPS_PROXY": proxy.url(), "NO_PROXY": no_proxy}
        assert await exchange(make, up, env) == [b"direct", b"direct"]
        assert proxy.heads == []


async def test_no_proxy_with_a_port_applies_to_that_port_only() -> None:
    async with ForwardProxy() as proxy, Upstream(serve(ok(b"x"))) as up:
        other = {"HTTP_PROXY": proxy.url(), "NO_PROXY": f"127.0.0.1:{up.port + 1}"}
        assert await exchange(aio, up, other, n=1) == [b"x"]
        assert len(proxy.heads) == 1
        same = {"HTTP_PROXY": proxy.url(), "NO_PROXY": f"127.0.0.1:{up.port}"}
        assert await exchange(aio, up, same, n=1) == [b"x"]
        assert len(proxy.heads) == 1


async def test_unreachable_proxy_is_a_connect_failure_naming_it() -> None:
    async with Upstream(serve(ok())) as up:
        with pytest.raises(Exception) as err:
            await exchange(aio, up, {"HTTP_PROXY": "http://127.0.0.1:1"})
        assert getattr(err.value, "reason", None) == "connect"
        assert "via proxy http://127.0.0.1:1" in str(err.value)


def test_make_transport_logs_the_route_without_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from app.upstream.client import make_transport

    timeouts = Timeouts(1.0, 1.0)
    caplog.set_level("INFO", "tokengate.upstream")
    env: dict[str, Any] = {"HTTPS_PROXY": "http://bob:hunter2@proxy.internal:3128"}
    t = make_transport(timeouts, 2.0, 4, base="https://api.example/v1", env=env)
    assert isinstance(t, AiohttpTransport)
    assert "via proxy http://proxy.internal:3128 (from HTTPS_PROXY)" in caplog.text
    assert "hunter2" not in caplog.text and "bob" not in caplog.text
    caplog.clear()
    env = {"HTTPS_PROXY": "http://proxy.internal:3128", "NO_PROXY": "api.example"}
    make_transport(timeouts, 2.0, 4, base="https://api.example/v1", env=env)
    assert "direct" in caplog.text


async def test_the_upstream_websocket_reaches_an_ipv6_literal_proxy_with_credentials() -> None:
    """The Responses WebSocket dials the proxy the HTTP transport dials (one URL builder):
    a proxy at `[::1]` with credentials carries the upgrade and the frames both ways.
    (Before, the socket was dialed at `http://::1:port`, which no client can reach.)"""
    import json

    from aiohttp import web
    from pydantic import SecretStr

    from app.runtime import DomainSpec
    from app.upstream.websocket import SocketDialer, UpstreamSockets

    async def responses(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            create = json.loads(msg.data)
            done = {"id": "resp_1", "status": "completed", "model": create["model"]}
            await ws.send_str(json.dumps({"type": "response.completed", "response": done}))
        return ws

    app = web.Application()
    app.router.add_get("/v1/responses", responses)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    spec = DomainSpec(
        "up", f"http://127.0.0.1:{port}", SecretStr("sk"), "K", None, 4, responses_websocket=True
    )
    credentials = ("u s", "p@ss:w")
    try:
        async with ForwardProxy(credentials, host="::1") as proxy:
            env = {"HTTP_PROXY": proxy.url(userinfo(credentials))}
            assert proxy.url().startswith("http://[::1]:")
            dialer = SocketDialer(2.0, 2.0, env)
            sockets = UpstreamSockets(dialer)
            try:
                body = {"model": "m", "input": [{"role": "user", "content": "hi"}]}
                answer = await within(sockets.send(spec, json.dumps(body).encode()))
                assert answer is not None and answer.status == 200
                out = b"".join([c async for c in answer.chunks()])
                assert b'"response.completed"' in out and answer.complete
            finally:
                await sockets.close()
                await dialer.close()
            (head,) = proxy.heads
            assert head.startswith(b"GET ws://127.0.0.1:%d/v1/responses " % port)
            assert b"proxy-authorization: basic " in head.lower()
    finally:
        await runner.cleanup()
