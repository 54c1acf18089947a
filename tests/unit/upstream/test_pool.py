"""The native upstream client (`pool.py` + `connection.py`) against a real loopback server.

Every test starts an `asyncio.start_server` on 127.0.0.1 that speaks raw HTTP/1.1 bytes
scripted by the test (`tests.support.loopback`), so the test controls exactly what the
"upstream" answers and sees what it received: how many connections were opened, each
request's bytes, and whether the client closed its end (EOF). Waits are for conditions
(an event, a predicate), never for a fixed time, except where a test plays a slow
consumer or a trickling upstream.

Production runs the gateway under uvloop; the last test runs every plain scenario here
again on a uvloop event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import struct
from collections.abc import Awaitable, Callable
from contextlib import aclosing

import pytest
import uvloop

from app.upstream import pool as pool_module
from app.upstream.attempt import AttemptFailed
from app.upstream.connection import BUFFER_LIMIT
from app.upstream.pool import NativeTransport, parse_target, request_head
from tests.support.loopback import (
    CHUNKED_HEAD,
    WAIT,
    Handler,
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
    until,
    within,
)

# -- requests and keep-alive -------------------------------------------------------------------


async def test_sequential_requests_share_one_keep_alive_connection() -> None:
    async with Upstream(serve(ok(b"one"), ok(b"two"), ok(b"three"))) as up:
        t = up.client()
        bodies = []
        for n in range(3):
            resp = await post(t, up.url(), b'{"n": %d}' % n)
            assert resp.status == 200
            bodies.append(await within(resp.read()))
        assert bodies == [b"one", b"two", b"three"]
        assert len(up.peers) == 1
        assert [r.endswith(b'{"n": %d}' % n) for n, r in enumerate(up.requests)] == [True] * 3


async def test_request_bytes_carry_method_path_host_headers_length_and_body() -> None:
    async with Upstream(serve(ok())) as up:
        t = up.client()
        headers = {"content-type": "application/json", "x-request-id": "r-1"}
        url = up.url("/v1/chat/completions?debug=1")
        resp = await within(t.request("POST", url, headers, b'{"a": 1}', stream=False))
        await within(resp.read())
        resp = await within(
            t.request("GET", up.url("/v1/models"), {"accept": "*/*"}, None, stream=False)
        )
        await within(resp.read())
        assert up.requests == [
            b"POST /v1/chat/completions?debug=1 HTTP/1.1\r\n"
            b"host: 127.0.0.1:%d\r\n"
            b"content-type: application/json\r\n"
            b"x-request-id: r-1\r\n"
            b"content-length: 8\r\n"
            b'\r\n{"a": 1}' % up.port,
            # no body: no content-length at all
            b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1:%d\r\naccept: */*\r\n\r\n" % up.port,
        ]


@pytest.mark.parametrize(
    "answer",
    [
        ok(b"bye", "connection: close"),
        ok(b"bye", version="1.0"),  # HTTP/1.0 without keep-alive
    ],
    ids=["connection-close", "http-1.0"],
)
async def test_an_answer_that_ends_the_connection_makes_the_next_request_use_a_new_one(
    answer: bytes,
) -> None:
    # The server never closes on its own: the client must honour the answer and hang up.
    async with Upstream(serve(answer)) as up:
        t = up.client()
        assert await within((await post(t, up.url())).read()) == b"bye"
        await within(up.peers[0].eof.wait())
        assert await within((await post(t, up.url())).read()) == b"bye"
        assert len(up.peers) == 2


async def test_http_1_0_keep_alive_answer_keeps_the_connection() -> None:
    async with Upstream(serve(ok(b"x", "connection: keep-alive", version="1.0"))) as up:
        t = up.client()
        for _ in range(2):
            assert await within((await post(t, up.url())).read()) == b"x"
        assert len(up.peers) == 1


async def test_most_recently_used_idle_connection_is_lent_first() -> None:
    async with Upstream(serve(ok())) as up:
        t = up.client()
        held = await post(t, up.url())  # answered, but not yet given back
        other = await post(t, up.url())  # so this one needs a second connection
        await within(held.read())
        await within(other.read())  # returned last: lent next
        await within((await post(t, up.url())).read())
        assert [len(p.requests) for p in up.peers] == [1, 2]


async def test_closing_the_transport_closes_idle_connections() -> None:
    async with Upstream(serve(ok())) as up:
        t = up.client()
        await within((await post(t, up.url())).read())
        await t.close()
        await within(up.peers[0].eof.wait())


async def test_each_origin_has_its_own_pool() -> None:
    async with Upstream(serve(ok(b"a"))) as a, Upstream(serve(ok(b"b"))) as b:
        t = a.client(pool_size=1)
        b.transports.append(t)
        held = await post(t, a.url())  # a's only slot is taken; b's pool is not affected
        assert await within((await post(t, b.url())).read()) == b"b"
        assert await within(held.read()) == b"a"
        assert (len(a.peers), len(b.peers)) == (1, 1)


async def test_idle_connection_older_than_keepalive_is_closed_not_lent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with Upstream(serve(ok())) as up:
        t = up.client()
        await within((await post(t, up.url())).read())
        monkeypatch.setattr(pool_module, "KEEPALIVE_SEC", 0.0)
        await within((await post(t, up.url())).read())
        await within(up.peers[0].eof.wait())
        assert len(up.peers) == 2


# -- body framing ----------------------------------------------------------------------------------


async def test_chunked_body_is_decoded_and_the_connection_reused() -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nx-trailer: t\r\n\r\n"
    )
    async with Upstream(serve(answer)) as up:
        t = up.client()
        for _ in range(2):
            resp = await post(t, up.url())
            assert resp.headers["transfer-encoding"] == "chunked"
            assert await within(resp.read()) == b"Wikipedia"
        assert len(up.peers) == 1


async def test_body_delimited_by_connection_close_is_read_whole() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nwhole ")
        await peer.send(b"body")
        peer.close()

    async with Upstream(handler) as up:
        t = up.client()
        resp = await post(t, up.url())
        assert await within(resp.read()) == b"whole body"
        # such a connection can not carry another exchange
        resp = await post(t, up.url())
        assert await within(resp.read()) == b"whole body"
        assert len(up.peers) == 2


async def test_interim_100_continue_is_skipped() -> None:
    async def handler(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.send(b"HTTP/1.1 100 Continue\r\nx-interim: yes\r\n\r\n")
            await peer.send(ok(b"final", "x-final: yes"))

    async with Upstream(handler) as up:
        t = up.client()
        for _ in range(2):
            resp = await post(t, up.url())
            assert resp.status == 200
            assert resp.headers["x-final"] == "yes" and "x-interim" not in resp.headers
            assert await within(resp.read()) == b"final"
        assert len(up.peers) == 1


async def test_204_has_no_body_and_keeps_the_connection() -> None:
    async with Upstream(serve(b"HTTP/1.1 204 No Content\r\n\r\n")) as up:
        t = up.client()
        for _ in range(2):
            resp = await post(t, up.url())
            assert resp.status == 204
            assert await within(resp.read()) == b""
        assert len(up.peers) == 1


async def test_head_split_across_many_writes_is_assembled() -> None:
    answer = ok(b"split body", "X-Long-Header-Name: some value", "Content-Type: text/plain")

    async def handler(peer: Peer) -> None:
        await peer.request()
        for i in range(0, len(answer), 7):
            await peer.send(answer[i : i + 7])
            await asyncio.sleep(0.001)

    async with Upstream(handler) as up:
        resp = await post(up.client(), up.url())
        assert resp.headers["x-long-header-name"] == "some value"
        assert resp.headers["content-type"] == "text/plain"
        assert await within(resp.read()) == b"split body"


async def test_response_headers_are_lower_cased_and_repeats_joined() -> None:
    answer = ok(
        b"{}",
        "Content-Type: application/JSON",
        "X-RateLimit-Remaining: 7",
        "Set-Cookie: a=1",
        "set-cookie: b=2",
        "X-Multi: one",
        "X-MULTI: two",
    )
    async with Upstream(serve(answer)) as up:
        resp = await post(up.client(), up.url())
        await within(resp.read())
        assert resp.headers == {
            "content-type": "application/JSON",  # values keep their case
            "x-ratelimit-remaining": "7",
            "set-cookie": "a=1, b=2",
            "x-multi": "one, two",
            "content-length": "2",
        }


# -- streaming ---------------------------------------------------------------------------------


async def test_stream_chunks_arrive_as_the_upstream_sends_them() -> None:
    got_first = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD + chunked(b"data: 1\n\n"))
        await got_first.wait()  # part 2 only once the client has part 1 in hand
        await peer.send(chunked(b"data: 2\n\n") + b"0\r\n\r\n")

    async with Upstream(handler) as up:
        resp = await post(up.client(), up.url(), stream=True)
        assert resp.status == 200
        received = []
        async with asyncio.timeout(WAIT):  # a client that buffers to the end would hang here
            async for chunk in resp.chunks():
                received.append(chunk)
                got_first.set()
        await resp.close()
        assert received == [b"data: 1\n\n", b"data: 2\n\n"]


async def test_finished_stream_returns_its_connection_to_the_pool() -> None:
    async with Upstream(serve(CHUNKED_HEAD + chunked(b"a", b"b") + b"0\r\n\r\n")) as up:
        t = up.client()
        for _ in range(2):
            resp = await post(t, up.url(), stream=True)
            assert b"".join(await within(collect(resp))) == b"ab"
            await resp.close()
        assert len(up.peers) == 1


async def test_closing_an_unfinished_stream_closes_the_socket() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            await peer.send(CHUNKED_HEAD + chunked(b"data: 1\n\n"))  # and more would follow
        else:
            await serve(ok())(peer)

    async with Upstream(handler) as up:
        t = up.client(pool_size=1)
        resp = await post(t, up.url(), stream=True)
        async with aclosing(resp.chunks()) as chunks:  # type: ignore[type-var]
            assert await within(anext(chunks)) == b"data: 1\n\n"
        await resp.close()
        await within(up.peers[0].eof.wait())  # how the upstream learns to stop generating
        assert await within((await post(t, up.url())).read()) == b"ok"
        assert len(up.peers) == 2


async def test_slow_consumer_pauses_reading_without_a_read_timeout() -> None:
    body = bytes(range(256)) * (8 * 1024)  # 2 MiB, 8x the buffer limit

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(body))

    async with Upstream(handler) as up:
        resp = await post(up.client(read=0.05), up.url(), stream=True)
        # The consumer is busy for several read timeouts: the upstream is not silent, the
        # gateway is, so no timeout; and reading paused instead of buffering everything.
        await asyncio.sleep(0.2)
        assert resp._buffered < 4 * BUFFER_LIMIT < len(body)
        assert b"".join(await within(collect(resp))) == body
        await resp.close()


# -- timeouts ------------------------------------------------------------------------------------


async def test_no_answer_times_out_after_the_read_timeout() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()  # and never answer

    async with Upstream(handler) as up:
        t = up.client(read=0.2, total=5.0)
        loop = asyncio.get_running_loop()
        start = loop.time()
        err = await failure(post(t, up.url()))
        elapsed = loop.time() - start
        assert err.reason == "timeout" and err.retryable
        assert 0.19 <= elapsed < WAIT
        await within(up.peers[0].eof.wait())  # the connection is given up, not reused


async def test_stream_silent_after_its_head_times_out() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD + chunked(b"data: 1\n\n"))

    async with Upstream(handler) as up:
        resp = await post(up.client(read=0.1), up.url(), stream=True)
        received: list[bytes] = []
        with pytest.raises(AttemptFailed) as err:
            async with asyncio.timeout(WAIT):
                async for chunk in resp.chunks():
                    received.append(chunk)
        assert err.value.reason == "timeout"
        assert received == [b"data: 1\n\n"]
        await resp.close()
        await within(up.peers[0].eof.wait())


async def test_total_deadline_bounds_a_trickling_non_streamed_answer() -> None:
    async with Upstream(trickle_body) as up:
        t = up.client(read=0.2, total=0.3)
        loop = asyncio.get_running_loop()
        start = loop.time()
        resp = await post(t, up.url())
        err = await failure(resp.read())
        elapsed = loop.time() - start
        assert err.reason == "timeout"
        assert 0.29 <= elapsed < WAIT
        await within(up.peers[0].eof.wait())


async def test_total_deadline_does_not_cut_a_stream() -> None:
    pieces = [chunked(b"%d" % i) for i in range(5)] + [b"0\r\n\r\n"]

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD)
        await peer.trickle(pieces, 0.04)  # 0.2 s in all, twice the total deadline

    async with Upstream(handler) as up:
        resp = await post(up.client(read=0.3, total=0.1), up.url(), stream=True)
        assert b"".join(await within(collect(resp))) == b"01234"
        await resp.close()


# -- failures --------------------------------------------------------------------------------------


async def test_nothing_listening_is_a_connect_failure() -> None:
    with socket.socket() as bound:  # bound, never listening: the port refuses connections
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        t = NativeTransport(0.5, 0.5, 1.0, 4)
        err = await failure(t.request("GET", f"http://127.0.0.1:{port}/", {}, None, stream=False))
        await t.close()
    assert err.reason == "connect" and err.retryable


async def test_connect_timeout_is_a_connect_failure() -> None:
    with unanswered_port() as port:
        t = NativeTransport(0.1, 5.0, 5.0, 4)
        loop = asyncio.get_running_loop()
        start = loop.time()
        err = await failure(t.request("GET", f"http://127.0.0.1:{port}/", {}, None, stream=False))
        elapsed = loop.time() - start
        await t.close()
    assert err.reason == "connect" and err.retryable
    assert 0.09 <= elapsed < WAIT


async def test_failed_connect_hands_its_slot_to_the_next_caller() -> None:
    with unanswered_port() as port:
        t = NativeTransport(0.1, 5.0, 5.0, 1)
        url = f"http://127.0.0.1:{port}/"
        first = asyncio.create_task(t.request("GET", url, {}, None, stream=False))
        await until(lambda: bool(t._pools))
        pool = next(iter(t._pools.values()))
        second = asyncio.create_task(t.request("GET", url, {}, None, stream=False))
        await until(lambda: len(pool._waiters) == 1)
        assert (await failure(first)).reason == "connect"
        # without the slot handed on, the second caller would wait forever
        assert (await failure(second)).reason == "connect"
        await t.close()


async def test_caller_cancelled_while_connecting_frees_its_slot() -> None:
    with unanswered_port() as port:
        t = NativeTransport(5.0, 5.0, 5.0, 1)
        url = f"http://127.0.0.1:{port}/"
        first = asyncio.create_task(t.request("GET", url, {}, None, stream=False))
        await until(lambda: bool(t._pools) and next(iter(t._pools.values()))._connecting == 1)
        pool = next(iter(t._pools.values()))
        second = asyncio.create_task(t.request("GET", url, {}, None, stream=False))
        await until(lambda: len(pool._waiters) == 1)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await until(lambda: pool._connecting == 1 and not pool._waiters)  # second connects
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        assert pool._connecting == 0 and not pool._members
        await t.close()


async def test_malformed_answer_is_a_reset_and_the_connection_is_not_reused() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        if peer.index == 0:
            await peer.send(b"HTTP/1.1 2OO FINE\r\n\r\n")
        else:
            await peer.send(ok())

    async with Upstream(handler) as up:
        t = up.client()
        err = await failure(post(t, up.url()))
        assert err.reason == "reset" and err.retryable
        await within(up.peers[0].eof.wait())
        assert await within((await post(t, up.url())).read()) == b"ok"
        assert len(up.peers) == 2


async def test_upstream_closing_mid_body_fails_read() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabcd")
        peer.close()

    async with Upstream(handler) as up:
        resp = await post(up.client(), up.url())
        err = await failure(resp.read())
        assert err.reason == "reset"


async def test_upstream_closing_mid_chunked_stream_fails_chunks() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD + chunked(b"data: 1\n\n") + b"20\r\npart")
        peer.close()

    async with Upstream(handler) as up:
        resp = await post(up.client(), up.url(), stream=True)
        received: list[bytes] = []
        with pytest.raises(AttemptFailed) as err:
            async with asyncio.timeout(WAIT):
                async for chunk in resp.chunks():
                    received.append(chunk)
        assert err.value.reason == "reset"
        assert b"".join(received) == b"data: 1\n\npart"  # what arrived, then the error
        await resp.close()


async def test_close_delimited_body_ended_by_a_connection_reset_is_a_failure() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\npart")
        sock = peer.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.writer.transport.abort()  # an RST, not an orderly end: the body is cut

    async with Upstream(handler) as up:
        resp = await post(up.client(), up.url())
        err = await failure(resp.read())
        assert err.reason == "reset"


async def test_fresh_connection_closed_before_an_answer_is_a_reset_without_retry() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.close()

    async with Upstream(handler) as up:
        err = await failure(post(up.client(), up.url()))
        assert err.reason == "reset"
        assert len(up.peers) == 1  # a new connection's failure says something: not hidden


async def test_stale_keep_alive_connection_closed_while_idle_is_replaced_transparently() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b"%d" % peer.index))
        peer.close()  # without saying so in the answer

    async with Upstream(handler) as up:
        t = up.client()
        assert await within((await post(t, up.url())).read()) == b"0"
        assert await within((await post(t, up.url())).read()) == b"1"
        assert len(up.peers) == 2


async def test_stale_connection_dying_under_a_request_is_retried_on_a_fresh_one() -> None:
    # The race every keep-alive client has: the request went out on a connection the
    # upstream was closing. No byte of an answer came back, so it is sent once more.
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b"%d" % peer.index))
        if peer.index == 0:
            await peer.request()
            peer.close()  # read the second request, closed without answering

    async with Upstream(handler) as up:
        t = up.client(pool_size=1)
        assert await within((await post(t, up.url(), b"1")).read()) == b"0"
        assert await within((await post(t, up.url(), b"2")).read()) == b"1"
        assert len(up.peers) == 2
        assert [r[-1:] for r in up.requests] == [b"1", b"2", b"2"]


async def test_no_retry_once_an_answer_has_started() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok())
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-le")
        peer.close()

    async with Upstream(handler) as up:
        t = up.client()
        await within((await post(t, up.url())).read())
        err = await failure(post(t, up.url()))
        assert err.reason == "reset"
        assert len(up.peers) == 1  # the upstream may have done the work: not sent twice


async def test_bytes_arriving_on_an_idle_connection_retire_it() -> None:
    answered, extra_sent = asyncio.Event(), asyncio.Event()

    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            await peer.send(ok(b"0"))
            await answered.wait()  # the client has read the answer: the connection idles
            await peer.send(ok(b"nobody asked"))
            extra_sent.set()
        else:
            await serve(ok(b"1"))(peer)

    async with Upstream(handler) as up:
        t = up.client()
        assert await within((await post(t, up.url())).read()) == b"0"
        answered.set()
        await within(extra_sent.wait())
        await within(up.peers[0].eof.wait())  # this socket can no longer be trusted
        assert await within((await post(t, up.url())).read()) == b"1"
        assert len(up.peers) == 2


async def test_bytes_beyond_the_declared_length_retire_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b"%d" % peer.index) + b"trailing garbage\r\n")  # one write
        if peer.index > 0:
            await serve(ok(b"%d" % peer.index))(peer)

    async with Upstream(handler) as up:
        t = up.client()
        assert await within((await post(t, up.url())).read()) == b"0"
        await within(up.peers[0].eof.wait())
        assert await within((await post(t, up.url())).read()) == b"1"
        assert len(up.peers) == 2


@pytest.mark.parametrize(
    "headers",
    [
        {"x-request-id": "r1\r\nx-api-key: stolen"},
        {"x-request-id": "r1\nGET / HTTP/1.1"},
        {"x-request-id": "r1\r"},
        {"x-evil\r\nx-api-key": "stolen"},
        {"x-name": "caf\u00e9 \u2603"},  # not latin-1
    ],
    ids=["crlf-value", "lf-value", "cr-value", "crlf-name", "not-latin-1"],
)
async def test_bad_header_is_refused_before_anything_is_sent(headers: dict[str, str]) -> None:
    async with Upstream(serve(ok())) as up:
        t = up.client()
        err = await failure(t.request("POST", up.url(), headers, b"{}", stream=False))
        assert err.reason == "bad_request" and not err.retryable
        # a valid request still works, and it is the only thing the upstream ever saw
        await within((await post(t, up.url())).read())
        assert len(up.requests) == 1 and b"stolen" not in up.requests[0]


# -- the connection limit and cancellation ---------------------------------------------------------


def gated(gate: asyncio.Event) -> Handler:
    """Serve requests, holding the answer to the very first one until `gate` is set."""

    async def handler(peer: Peer) -> None:
        while (req := await peer.request()) is not None:
            if peer.index == 0 and len(peer.requests) == 1:
                await gate.wait()
            await peer.send(ok(req[-1:]))

    return handler


async def test_pool_limit_queues_a_second_request_on_the_same_connection() -> None:
    gate = asyncio.Event()
    async with Upstream(gated(gate)) as up:
        t = up.client(pool_size=1)
        first = asyncio.create_task(post(t, up.url(), b"1"))
        await until(lambda: len(up.requests) == 1)
        second = asyncio.create_task(post(t, up.url(), b"2"))
        await until(lambda: len(up.pool(t)._waiters) == 1)
        assert not second.done() and len(up.peers) == 1 and len(up.requests) == 1
        gate.set()
        assert await within((await first).read()) == b"1"
        assert await within((await second).read()) == b"2"
        assert len(up.peers) == 1


async def test_cancelled_waiter_leaves_the_pool_working() -> None:
    gate = asyncio.Event()
    async with Upstream(gated(gate)) as up:
        t = up.client(pool_size=1)
        first = asyncio.create_task(post(t, up.url(), b"1"))
        await until(lambda: len(up.requests) == 1)
        waiting = asyncio.create_task(post(t, up.url(), b"W"))
        await until(lambda: len(up.pool(t)._waiters) == 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not up.pool(t)._waiters
        gate.set()
        assert await within((await first).read()) == b"1"
        assert await within((await post(t, up.url(), b"3")).read()) == b"3"
        assert len(up.peers) == 1 and b"W" not in b"".join(up.requests)


async def test_woken_waiter_that_is_cancelled_passes_its_turn_on() -> None:
    gate = asyncio.Event()
    async with Upstream(gated(gate)) as up:
        t = up.client(pool_size=1)
        first = asyncio.create_task(post(t, up.url(), b"1"))
        await until(lambda: len(up.requests) == 1)
        woken = asyncio.create_task(post(t, up.url(), b"W"))
        await until(lambda: len(up.pool(t)._waiters) == 1)
        last = asyncio.create_task(post(t, up.url(), b"3"))
        await until(lambda: len(up.pool(t)._waiters) == 2)
        gate.set()
        resp = await within(first)
        assert await within(resp.read()) == b"1"  # the connection is idle: `woken` is woken
        woken.cancel()  # ... and cancelled before it got to run
        with pytest.raises(asyncio.CancelledError):
            await woken
        assert await within((await within(last)).read()) == b"3"
        assert len(up.peers) == 1


async def test_cancelling_the_caller_waiting_for_the_head_closes_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()  # and never answer: the caller gives up first
        else:
            await serve(ok())(peer)

    async with Upstream(handler) as up:
        t = up.client(pool_size=1, read=5.0)
        task = asyncio.create_task(post(t, up.url()))
        await until(lambda: len(up.requests) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await within(up.peers[0].eof.wait())  # the upstream learns it can stop
        # the one slot of the pool is free again
        assert await within((await post(t, up.url())).read()) == b"ok"
        assert len(up.peers) == 2


# -- answers the connection must not trust ---------------------------------------------------


async def test_close_delimited_stream_cut_by_the_read_timeout_is_an_error() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: 1\n\n")
        # ... then silence

    async with Upstream(handler) as up:
        resp = await post(up.client(read=0.1), up.url(), stream=True)
        received: list[bytes] = []
        with pytest.raises(AttemptFailed) as err:
            async with asyncio.timeout(WAIT):
                async for chunk in resp.chunks():
                    received.append(chunk)
                    # The relay is busy writing this event to a slow client while the
                    # upstream stays silent past the read timeout and is given up on.
                    await up.peers[0].eof.wait()
        await resp.close()
        assert received == [b"data: 1\n\n"]
        assert err.value.reason == "timeout"


async def test_unsolicited_answer_in_the_same_read_does_not_leak_into_the_body() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b"0") + ok(b"nobody asked"))  # one write: one read on the client

    async with Upstream(handler) as up:
        resp = await post(up.client(), up.url())
        assert await within(resp.read()) == b"0"


# -- request line and target -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "origin", "host", "path"),
    [
        ("http://up.example/v1/x", ("http", "up.example", 80), "up.example", "/v1/x"),
        ("https://up.example", ("https", "up.example", 443), "up.example", "/"),
        ("http://up.example:8000/a?b=1", ("http", "up.example", 8000), "up.example:8000", "/a?b=1"),
        ("https://[::1]:8443/v1", ("https", "::1", 8443), "[::1]:8443", "/v1"),
        ("http://[::1]/v1", ("http", "::1", 80), "[::1]", "/v1"),
    ],
)
def test_parse_target(url: str, origin: tuple[str, str, int], host: str, path: str) -> None:
    target = parse_target(url)
    assert (target.origin, target.host_header, target.path) == (origin, host, path)


@pytest.mark.parametrize("url", ["ftp://up.example/", "up.example/v1", "http:///v1"])
def test_parse_target_refuses_non_http_urls(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        parse_target(url)


def test_request_head_without_body_has_no_content_length() -> None:
    head = request_head("GET", parse_target("http://h:81/m"), {"a": "b"}, None)
    assert head == b"GET /m HTTP/1.1\r\nhost: h:81\r\na: b\r\n\r\n"
    assert b"content-length: 0\r\n" in request_head("POST", parse_target("http://h/"), {}, 0)


# -- the same scenarios on uvloop, the production event loop ---------------------------------------

SCENARIOS = [
    pytest.param(fn, marks=getattr(fn, "pytestmark", []), id=name)
    for name, fn in list(globals().items())
    if name.startswith("test_")
    and inspect.iscoroutinefunction(fn)
    and not inspect.signature(fn).parameters
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_under_uvloop(scenario: Callable[[], Awaitable[None]]) -> None:
    async def run() -> None:
        await scenario()

    uvloop.run(run())
