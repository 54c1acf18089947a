"""The library-backed transports of `client.py` (aiohttp, httpx) on a loopback server:
what they hand the pipeline must mean the same."""

from __future__ import annotations

import pytest

from app.upstream.aiohttp_transport import AiohttpTransport
from app.upstream.httpx_transport import HttpxTransport
from app.upstream.transport import Timeouts, Transport
from tests.support.loopback import Upstream, ok, serve, trickle_body, within


def aio() -> Transport:
    return AiohttpTransport(Timeouts(1.0, 1.0), 2.0, 4)


def hx(total: float = 2.0) -> Transport:
    return HttpxTransport(Timeouts(1.0, 1.0), total, 4)


@pytest.mark.parametrize("make", [aio, hx], ids=["aiohttp", "httpx"])
async def test_repeated_response_headers_are_all_kept(make: type[Transport]) -> None:
    answer = ok(b"{}", "Set-Cookie: a=1", "set-cookie: b=2", "X-Multi: one", "X-MULTI: two")
    async with Upstream(serve(answer)) as up:
        t = make()
        try:
            resp = await within(t.request("POST", up.url(), {}, b"{}", stream=False))
            await within(resp.read())
            assert resp.headers["set-cookie"] == "a=1, b=2"
            assert resp.headers["x-multi"] == "one, two"
            assert resp.headers.get("x-absent") is None and "x-absent" not in resp.headers
            assert dict(resp.headers)["set-cookie"] == "a=1, b=2"
            assert len(resp.headers) == len(dict(resp.headers))
        finally:
            await t.close()


async def test_aiohttp_refusing_a_header_is_a_bad_request_not_a_value_error() -> None:
    async with Upstream(serve(ok())) as up:
        t = aio()
        try:
            with pytest.raises(Exception) as err:
                await within(
                    t.request("POST", up.url(), {"x-id": "a\r\nb: c"}, b"{}", stream=False)
                )
            assert getattr(err.value, "reason", None) == "bad_request"
            assert not up.requests
        finally:
            await t.close()


async def test_httpx_total_deadline_bounds_the_body_too() -> None:
    async with Upstream(trickle_body) as up:
        t = hx(total=0.3)
        try:
            resp = await within(t.request("POST", up.url(), {}, b"{}", stream=False))
            with pytest.raises(Exception) as err:
                await within(resp.read())
            assert getattr(err.value, "reason", None) == "timeout"
        finally:
            await t.close()
