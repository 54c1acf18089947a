"""The shipped transport (`aiohttp_transport.AiohttpTransport`) against scripted loopback servers.

What the pipeline relies on, at the transport's seam: the bytes a request puts on the
wire, keep-alive and when a connection is given up, timeouts, reading paused for a slow
consumer, happy eyeballs, and above all which failures are `ambiguous` (the request
was written: the upstream may have acted on it) and which are not (nothing was sent:
a re-send is safe). The same cases through the whole gateway are in `conformance/`.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

import pytest
import uvloop
from aiohttp.abc import AbstractResolver, ResolveResult

from app.upstream.aiohttp_transport import AiohttpTransport
from app.upstream.proxyenv import Proxies
from app.upstream.transport import Timeouts
from tests.support.forward_proxy import ForwardProxy
from tests.support.loopback import (
    CHUNKED_HEAD,
    WAIT,
    Peer,
    Upstream,
    chunked,
    collect,
    failure,
    ok,
    post,
    serve,
    trickle_body,
    unanswered_port,
    within,
)
from tests.support.tls import certificate


@asynccontextmanager
async def transport(
    *, connect: float = 0.5, read: float = 0.5, total: float = 1.0, pool: int = 4, **kw: Any
) -> AsyncIterator[AiohttpTransport]:
    t = AiohttpTransport(Timeouts(connect, read), total, pool, **kw)
    try:
        yield t
    finally:
        await t.close()


# -- the request on the wire, keep-alive --------------------------------------------------------


async def test_request_bytes_carry_method_path_host_headers_length_and_body() -> None:
    async with Upstream(serve(ok())) as up, transport() as t:
        headers = {"content-type": "application/json", "x-request-id": "r-1"}
        url = up.url("/v1/chat/completions?debug=1")
        await within(
            (await within(t.request("POST", url, headers, b'{"a": 1}', stream=False))).read()
        )
        resp = await within(t.request("GET", up.url("/v1/models"), {}, None, stream=False))
        await within(resp.read())
    post_head, get_head = (r.split(b"\r\n\r\n")[0].split(b"\r\n") for r in up.requests)
    assert post_head[0] == b"POST /v1/chat/completions?debug=1 HTTP/1.1"
    fields = {line.split(b":")[0].lower(): line.split(b": ", 1)[1] for line in post_head[1:]}
    assert fields[b"host"] == b"127.0.0.1:%d" % up.port
    assert fields[b"x-request-id"] == b"r-1"
    assert fields[b"content-length"] == b"8"
    assert b"cookie" not in fields and b"user-agent" not in fields  # nothing of our own
    assert up.requests[0].endswith(b'\r\n\r\n{"a": 1}')
    assert get_head[0] == b"GET /v1/models HTTP/1.1"
    assert not any(line.lower().startswith(b"content-length") for line in get_head)
    assert len(up.peers) == 1  # both on one kept-alive connection


@pytest.mark.parametrize(
    "answer",
    [ok(b"bye", "connection: close"), ok(b"bye", version="1.0")],
    ids=["connection-close", "http-1.0"],
)
async def test_an_answer_that_ends_the_connection_makes_the_next_request_use_a_new_one(
    answer: bytes,
) -> None:
    # The server never closes on its own: the client must honour the answer and hang up.
    async with Upstream(serve(answer)) as up, transport() as t:
        assert await within((await post(t, up.url())).read()) == b"bye"
        await within(up.peers[0].eof.wait())
        assert await within((await post(t, up.url())).read()) == b"bye"
    assert len(up.peers) == 2 and len(up.requests) == 2


async def test_closing_an_unfinished_stream_closes_the_socket() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            await peer.send(CHUNKED_HEAD + chunked(b"data: 1\n\n"))  # and more would follow
        else:
            await serve(ok())(peer)

    async with Upstream(handler) as up, transport(pool=1) as t:
        resp = await post(t, up.url(), stream=True)
        assert await within(anext(resp.chunks())) == b"data: 1\n\n"
        await resp.close()
        await within(up.peers[0].eof.wait())  # how the upstream learns to stop generating
        assert await within((await post(t, up.url())).read()) == b"ok"
    assert len(up.peers) == 2


async def test_slow_consumer_pauses_reading_without_a_read_timeout() -> None:
    body = bytes(range(256)) * (128 * 1024)  # 32 MiB: more than every socket buffer between
    sent = 0

    async def handler(peer: Peer) -> None:
        nonlocal sent
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body))
        for at in range(0, len(body), 65536):
            await peer.send(body[at : at + 65536])
            sent = at + 65536

    async with Upstream(handler) as up, transport(read=0.05) as t:
        resp = await post(t, up.url(), stream=True)
        # The consumer is busy for several read timeouts: the upstream is not silent, the
        # gateway is, so no timeout; and the upstream was made to wait (reading paused)
        # instead of the gateway buffering the body.
        await asyncio.sleep(0.3)
        assert sent < len(body)
        assert b"".join(await within(collect(resp), 10 * WAIT)) == body
        await resp.close()


# -- timeouts -------------------------------------------------------------------------------------


async def test_no_answer_is_an_ambiguous_timeout_and_the_connection_is_given_up() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()  # and never answer

    async with Upstream(handler) as up, transport(read=0.2, total=5.0) as t:
        err = await failure(post(t, up.url()))
        assert (err.reason, err.ambiguous) == ("timeout", True)
        await within(up.peers[0].eof.wait())


async def test_stream_silent_after_its_head_times_out() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD + chunked(b"data: 1\n\n"))

    async with Upstream(handler) as up, transport(read=0.1) as t:
        resp = await post(t, up.url(), stream=True)
        received: list[bytes] = []

        async def read_all() -> None:
            async for chunk in resp.chunks():
                received.append(chunk)

        err = await failure(read_all())
        assert (err.reason, err.ambiguous) == ("timeout", True)
        assert received == [b"data: 1\n\n"]
        await resp.close()
        await within(up.peers[0].eof.wait())


async def test_stream_silent_after_some_events_times_out_and_a_busy_reader_does_not() -> None:
    """Once the body is handed over, its silence is bounded by the transport's watch (not
    aiohttp's timer per read): events keep it alive, then silence while the reader waits
    fails it with the same ambiguous timeout, and never before the read timeout."""

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD)
        await peer.trickle([chunked(b"data: %d\n\n" % i) for i in range(4)], 0.05)
        await peer.wait_eof()  # then nothing more

    async with Upstream(handler) as up, transport(read=0.3) as t:
        resp = await post(t, up.url(), stream=True)
        received: list[bytes] = []
        last = 0.0

        async def read_all() -> None:
            nonlocal last
            async for chunk in resp.chunks():
                received.append(chunk)
                last = asyncio.get_running_loop().time()

        err = await failure(read_all())
        silent = asyncio.get_running_loop().time() - last
        assert (err.reason, err.ambiguous) == ("timeout", True)
        assert b"".join(received) == b"".join(b"data: %d\n\n" % i for i in range(4))
        assert silent >= 0.3  # the read timeout, never less (lateness depends on the load)
        await resp.close()
        await within(up.peers[0].eof.wait())


async def test_total_deadline_bounds_a_trickling_non_streamed_answer() -> None:
    async with Upstream(trickle_body) as up, transport(read=0.2, total=0.3) as t:
        resp = await post(t, up.url())
        err = await failure(resp.read())
        assert (err.reason, err.ambiguous) == ("timeout", True)
        await within(up.peers[0].eof.wait())


async def test_total_deadline_does_not_cut_a_stream() -> None:
    pieces = [chunked(b"%d" % i) for i in range(5)] + [b"0\r\n\r\n"]

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD)
        await peer.trickle(pieces, 0.04)  # 0.2 s in all, twice the total deadline

    async with Upstream(handler) as up, transport(read=0.3, total=0.1) as t:
        resp = await post(t, up.url(), stream=True)
        assert b"".join(await within(collect(resp))) == b"01234"
        await resp.close()


# -- failures before anything was written: unambiguous -------------------------------------------


async def test_nothing_listening_is_a_connect_failure_nothing_sent() -> None:
    with socket.socket() as bound:  # bound, never listening: the port refuses connections
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        async with transport() as t:
            err = await failure(post(t, f"http://127.0.0.1:{port}/"))
    assert (err.reason, err.retryable, err.ambiguous) == ("connect", True, False)
    assert err.cause == "connection_refused"  # what the status page and a 503 say


async def test_connect_timeout_is_a_timeout_with_nothing_sent() -> None:
    with unanswered_port() as port:
        async with transport(connect=0.1, read=5.0, total=5.0) as t:
            err = await failure(post(t, f"http://127.0.0.1:{port}/"))
    assert (err.reason, err.retryable, err.ambiguous) == ("timeout", True, False)
    assert err.cause == "timeout"


async def test_a_tls_handshake_the_client_refuses_is_a_connect_failure_nothing_sent() -> None:
    # The server's certificate is not one the client trusts (the system store).
    async with Upstream(serve(ok()), tls=certificate().server()) as up, transport() as t:
        err = await failure(post(t, up.url()))
    assert (err.reason, err.ambiguous) == ("connect", False)
    assert err.cause == "tls"
    assert not up.requests


async def test_a_proxy_refusing_the_tunnel_is_a_connect_failure_nothing_sent() -> None:
    async with (
        ForwardProxy(("u", "right")) as proxy,
        Upstream(serve(ok()), tls=certificate().server()) as up,
    ):
        proxies = Proxies({"HTTPS_PROXY": proxy.url("u:wrong")})
        async with transport(ssl_context=certificate().client(), proxies=proxies) as t:
            err = await failure(post(t, up.url()))
    assert (err.reason, err.retryable, err.ambiguous) == ("connect", False, False)  # 407
    assert not up.requests


async def test_a_header_with_a_line_break_is_a_bad_request_nothing_sent() -> None:
    # A line break would let a value add headers (or requests) of its own.
    async with Upstream(serve(ok())) as up, transport() as t:
        with pytest.raises(Exception) as err:
            await within(t.request("POST", up.url(), {"x-id": "a\r\nb: c"}, b"{}", stream=False))
    assert getattr(err.value, "reason", None) == "bad_request"
    assert not up.requests


# -- failures after the request was written: ambiguous -------------------------------------------


@pytest.mark.parametrize(
    "script",
    [
        b"",  # closed before the head
        b"HTTP/1.1 200 OK\r\ncontent-le",  # closed in the head
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",  # closed in the body
    ],
    ids=["before-head", "in-head", "in-body"],
)
async def test_a_connection_closed_after_the_request_is_ambiguous(script: bytes) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(script)
        peer.close()

    async with Upstream(handler) as up, transport() as t:
        err = await failure(_read(t, up))
    assert err.ambiguous and err.retryable
    assert err.reason in ("reset", "bad_response")
    assert len(up.requests) == 1  # and aiohttp did not send the POST again on its own


async def _read(t: AiohttpTransport, up: Upstream) -> bytes:
    return await (await post(t, up.url())).read()


# -- happy eyeballs --------------------------------------------------------------------------------


@contextmanager
def black_hole(family: socket.AddressFamily, host: str) -> Iterator[int]:
    """A port on `host` whose connects hang (a full accept queue drops SYNs)."""
    with socket.socket(family) as listener:
        listener.bind((host, 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        queued = [socket.socket(family) for _ in range(3)]
        try:
            for s in queued:
                s.setblocking(False)
                with suppress(BlockingIOError):
                    s.connect((host, port))
            yield port
        finally:
            for s in queued:
                s.close()


class Resolver(AbstractResolver):
    """A name with a black-holed IPv6 address first, as a broken IPv6 route gives."""

    def __init__(self, answers: list[tuple[socket.AddressFamily, str, int]]) -> None:
        self.answers = answers

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            ResolveResult(hostname=host, host=h, port=p, family=f, proto=0, flags=0)
            for f, h, p in self.answers
        ]

    async def close(self) -> None:
        pass


async def test_a_black_holed_first_address_does_not_cost_the_connect_timeout() -> None:
    async with Upstream(serve(ok(b"v4"))) as up:
        with black_hole(socket.AF_INET6, "::1") as dead:
            answers = [(socket.AF_INET6, "::1", dead), (socket.AF_INET, "127.0.0.1", up.port)]
            # Connect timeout 5 s, bound 1 s: only a second attempt started early passes.
            async with transport(connect=5.0, read=1.0, resolver=Resolver(answers)) as t:
                resp = await post(t, "http://upstream.test/v1")
                assert await within(resp.read()) == b"v4"


async def test_ipv6_loopback_upstream() -> None:
    async with Upstream(serve(ok(b"six")), host="::1") as up, transport() as t:
        assert await within((await post(t, up.url())).read()) == b"six"


def test_happy_eyeballs_works_on_uvloop_too() -> None:
    # uvloop has no happy_eyeballs_delay of its own; aiohttp dials with its own sockets
    # (aiohappyeyeballs) and hands the winner to the loop, so production gets it too.
    uvloop.run(test_a_black_holed_first_address_does_not_cost_the_connect_timeout())
