"""The misbehaving-upstream probe set of issue #18, on the shipped transport (aiohttp).

Each probe is a loopback server (plain, and TLS with a certificate made for the test)
doing what real upstreams and proxies do: bodies of several times the client's read
buffer, a large error body on a stream request, a stream whose last bytes the caller
never takes, header floods, HEAD, a pool whose every connection is stuck. The last test
runs some probes again on uvloop, the production event loop. (The gateway-level cases
are in `conformance/`.)

Timeouts here are only bounds, so that a hang fails quickly instead of hanging the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import uvloop

from app.upstream.aiohttp_transport import AiohttpTransport
from app.upstream.transport import Timeouts, Transport, UpstreamResponse
from tests.support.loopback import CHUNKED_HEAD, WAIT, Peer, Upstream, chunked, ok, serve, within
from tests.support.tls import certificate

KIB = 1024
MIB = 1024 * KIB
SIZES = [300 * KIB, 1024 * KIB, 4096 * KIB]
Make = Callable[..., Transport]


def aio(up: Upstream, **kw: Any) -> Transport:
    timeouts = Timeouts(kw.get("connect", 1.0), kw.get("read", 1.0))
    return AiohttpTransport(
        timeouts,
        kw.get("total", 4.0),
        kw.get("pool_size", 4),
        ssl_context=certificate().client() if up.tls else None,
    )


CLIENTS = [pytest.param(aio, id="aiohttp")]
TLS = [pytest.param(False, id="plain"), pytest.param(True, id="tls")]


@asynccontextmanager
async def upstream(handler: Any, tls: bool) -> AsyncIterator[Upstream]:
    async with Upstream(handler, tls=certificate().server() if tls else None) as up:
        yield up


@asynccontextmanager
async def client(make: Make, up: Upstream, **kw: Any) -> AsyncIterator[Transport]:
    transport = make(up, **kw)
    try:
        yield transport
    finally:
        await transport.close()


async def call(
    t: Transport, up: Upstream, *, stream: bool = False, method: str = "POST", path: str = "/v1/x"
) -> UpstreamResponse:
    body = b"{}" if method == "POST" else None
    return await within(t.request(method, up.url(path), {}, body, stream=stream), 2 * WAIT)


def body_of(size: int) -> bytes:
    return bytes(range(256)) * (size // 256)


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


# -- 1: bodies past the read buffer ---------------------------------------------------------


@pytest.mark.parametrize("make", CLIENTS)
@pytest.mark.parametrize("tls", TLS)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s // KIB}KiB")
async def test_large_non_streamed_body_is_read_whole(make: Make, tls: bool, size: int) -> None:
    data = body_of(size)
    async with upstream(serve(ok(data)), tls) as up, client(make, up) as t:
        for _ in range(2):  # and the connection is fit for the next exchange
            resp = await call(t, up)
            assert await within(resp.read(), 3 * WAIT) == data
        assert len(up.peers) == 1


@pytest.mark.parametrize("make", CLIENTS)
async def test_large_body_in_16k_pieces_is_read_whole(make: Make) -> None:
    data = body_of(300 * KIB)

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD)
        for piece in pieces(data, 16 * KIB):
            await peer.send(chunked(piece))
        await peer.send(b"0\r\n\r\n")

    async with upstream(handler, False) as up, client(make, up) as t:
        assert await within((await call(t, up)).read(), 3 * WAIT) == data


@pytest.mark.parametrize("make", CLIENTS)
@pytest.mark.parametrize("tls", TLS)
async def test_large_error_body_on_a_stream_request_is_read(make: Make, tls: bool) -> None:
    # The pipeline reads a failing stream's answer with read(), and a stream has no
    # total deadline: a stall here hangs the caller forever.
    page = b"<html>" + body_of(1024 * KIB) + b"</html>"
    answer = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: %d\r\n\r\n%s" % (len(page), page)
    async with upstream(serve(answer), tls) as up, client(make, up) as t:
        resp = await call(t, up, stream=True)
        assert resp.status == 502
        assert await within(resp.read(), 3 * WAIT) == page


# -- 2: a connection whose reading paused goes back to the pool --------------------------------


@pytest.mark.parametrize("make", CLIENTS)
@pytest.mark.parametrize("tls", TLS)
async def test_stream_left_with_unread_bytes_leaves_a_working_connection(
    make: Make, tls: bool
) -> None:
    # The relay is behind: the rest of the stream, its end included, arrives while the
    # caller is not reading, and the client leaves at the end without taking it. The
    # next, unrelated request must not inherit a paused or half-read socket.
    events = chunked(*[b"data: %04d\n\n" % n + b"x" * 500 for n in range(8)]) + b"0\r\n\r\n"
    sent = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD + events)
        sent.set()
        await serve(ok(b"next"))(peer)

    async with upstream(handler, tls) as up, client(make, up, read=0.3) as t:
        resp = await call(t, up, stream=True)
        await within(sent.wait())
        await resp.close()
        assert await within((await call(t, up)).read()) == b"next"


# -- 4: heads without limits, HEAD, a full pool ------------------------------------------------


def flood(*, fields: int = 0, value: int = 0) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n"
    head += b"".join(b"x-flood-%d: v\r\n" % n for n in range(fields))
    if value:
        head += b"x-huge: " + b"v" * value + b"\r\n"
    return head + b"\r\nok"


@pytest.mark.parametrize("make", CLIENTS)
@pytest.mark.parametrize(
    "answer",
    [flood(fields=5000), flood(value=MIB)],
    ids=["many-fields", "huge-field"],
)
async def test_header_flood_is_refused_as_a_bad_response(make: Make, answer: bytes) -> None:
    async def handler(peer: Peer) -> None:
        await serve(answer if peer.index == 0 else ok(b"fine"))(peer)

    async with upstream(handler, False) as up, client(make, up) as t:
        with pytest.raises(Exception) as err:
            await call(t, up)
        assert getattr(err.value, "reason", None) == "bad_response"
        assert getattr(err.value, "ambiguous", None) is True  # the request went out
        # the gateway still works against a sane answer afterwards
        assert await within((await call(t, up)).read()) == b"fine"


async def test_endless_head_is_cut_at_the_limit_not_buffered() -> None:
    # An upstream that sends header bytes forever: the client stops reading at the limit.
    sent = 0

    async def handler(peer: Peer) -> None:
        nonlocal sent
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\n")
        line = b"x-f: " + b"v" * 1000 + b"\r\n"
        while sent < 64 * MIB:
            await peer.send(line)
            sent += len(line)

    async with upstream(handler, False) as up, client(aio, up) as t:
        with pytest.raises(Exception) as err:
            await call(t, up)
        assert getattr(err.value, "reason", None) == "bad_response"
        assert sent < 32 * MIB  # closed at the limit (plus socket buffers): sending stopped


@pytest.mark.parametrize("make", CLIENTS)
async def test_head_answer_ends_with_its_head_and_keeps_the_connection(make: Make) -> None:
    head_answer = b"HTTP/1.1 200 OK\r\ncontent-length: 12345\r\nx-n: 1\r\n\r\n"
    async with upstream(serve(head_answer, ok(b"after")), False) as up, client(make, up) as t:
        resp = await call(t, up, method="HEAD")
        assert resp.status == 200 and resp.headers["content-length"] == "12345"
        assert await within(resp.read()) == b""
        assert await within((await call(t, up)).read()) == b"after"
        assert len(up.peers) == 1


async def test_full_pool_wait_is_bounded_and_sends_nothing() -> None:
    async def handler(peer: Peer) -> None:
        # the only connection's answer never ends, and is never silent for long
        await peer.request()
        await peer.send(CHUNKED_HEAD)
        await peer.trickle([chunked(b": keep-alive\n\n")] * 1000, 0.02)

    async with upstream(handler, False) as up:
        # a pool of one; the wait for a slot is bounded by read + connect
        t = AiohttpTransport(Timeouts(connect=0.05, read=0.1), 60.0, 1)
        try:
            stuck = asyncio.ensure_future(t.request("POST", up.url(), {}, b"{}", stream=True))
            while not up.peers or not up.peers[0].requests:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
            with pytest.raises(Exception) as err:
                await within(t.request("POST", up.url(), {}, b"{}", stream=True))
            assert getattr(err.value, "reason", None) == "timeout"
            assert getattr(err.value, "ambiguous", None) is False  # never written: re-sendable
            assert "no connection in time" in str(err.value)
            assert len(up.requests) == 1
            await (await stuck).close()
        finally:
            await t.close()


# -- the probes on uvloop, the production event loop ------------------------------------------

UVLOOP = [
    pytest.param(partial(test_large_non_streamed_body_is_read_whole, aio, False, 4 * MIB)),
    pytest.param(partial(test_large_non_streamed_body_is_read_whole, aio, True, 4 * MIB)),
    pytest.param(partial(test_large_error_body_on_a_stream_request_is_read, aio, True)),
    pytest.param(partial(test_head_answer_ends_with_its_head_and_keeps_the_connection, aio)),
    pytest.param(test_endless_head_is_cut_at_the_limit_not_buffered),
]


@pytest.mark.parametrize("scenario", UVLOOP)
def test_under_uvloop(scenario: Callable[[], Any]) -> None:
    async def run() -> None:
        await scenario()

    uvloop.run(run())
