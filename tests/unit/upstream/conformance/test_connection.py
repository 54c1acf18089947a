"""Connections: early closes, keep-alive reuse, stale connections, slow upstreams.

The rule under test throughout: a request is never sent twice unless the upstream cannot
have acted on it. Every early close here happens after the upstream read the request, so
each is answered at once (502, or 504 for silence) with `x-should-retry: false`, and the
upstream saw the request exactly once although three attempts were allowed.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.loopback import Peer, Upstream, serve, within
from tests.unit.upstream.conformance.conftest import MakeThrough
from tests.unit.upstream.conformance.harness import (
    ANSWER,
    STREAM,
    answer,
    deltas,
    head,
    stream_error,
)

SSE_HEAD = head("200 OK", "content-type: text/event-stream", "transfer-encoding: chunked")


def sse(*events: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)


EARLY_CLOSES = {
    "before-the-head": b"",
    "in-the-head": b"HTTP/1.1 200 OK\r\ncontent-type: applic",
    "during-the-body": head("200 OK", f"content-length: {len(ANSWER)}") + ANSWER[:20],
}


@pytest.mark.parametrize("script", EARLY_CLOSES.values(), ids=EARLY_CLOSES.keys())
async def test_an_early_close_after_the_request_was_read_is_a_502_sent_once(
    through: MakeThrough, script: bytes
) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(script)
        peer.close()

    async with Upstream(handler) as up:
        gw = await through(up)
        r = await gw.chat()
        assert r.status_code == 502, r.text
        assert r.headers["x-should-retry"] == "false"
        assert "not sent again" in r.json()["error"]["message"]
        assert gw.sent(up) == 1
        assert await gw.metric("tokengate_upstream_resends_total") == 0


async def test_a_stream_closed_during_its_body_ends_with_an_error_event(
    through: MakeThrough,
) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(SSE_HEAD + sse(*STREAM[:2]))  # two content events, then gone
        peer.close()

    async with Upstream(handler) as up:
        gw = await through(up)
        r = await gw.chat(stream=True)
        assert r.status_code == 200
        assert deltas(r.text) == "pong"  # what was streamed reached the client
        assert stream_error(r.text) == "stream_interrupted"
        assert gw.sent(up) == 1


async def test_a_close_after_the_body_on_a_kept_alive_connection_loses_nothing(
    through: MakeThrough,
) -> None:
    # The answer says nothing of closing (keep-alive by default), then the upstream hangs
    # up: the next request must go out once, on a new connection.
    closed = asyncio.Semaphore(0)

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(answer())
        peer.close()
        await peer.writer.wait_closed()
        closed.release()

    async with Upstream(handler) as up:
        gw = await through(up)
        for n in range(1, 4):
            r = await gw.chat()
            assert r.status_code == 200, r.text
            assert gw.sent(up) == n
            await within(closed.acquire())
        assert len(up.peers) == 3


async def test_sequential_requests_reuse_one_connection(through: MakeThrough) -> None:
    async with Upstream(serve(answer())) as up:
        gw = await through(up)
        for _ in range(2):
            assert (await gw.chat()).status_code == 200
            assert (await gw.chat(stream=False)).status_code == 200
        assert gw.sent(up) == 4
        assert len(up.peers) == 1


async def test_a_stale_connection_the_upstream_closed_while_idle_is_not_used(
    through: MakeThrough,
) -> None:
    idle_close, closed = asyncio.Event(), asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(answer())
        if peer.index == 0:
            await idle_close.wait()  # the upstream's idle timeout, as the test decides
            peer.close()
            await peer.writer.wait_closed()
            closed.set()
        else:
            await serve(answer())(peer)

    async with Upstream(handler) as up:
        gw = await through(up)
        assert (await gw.chat()).status_code == 200
        idle_close.set()
        await within(closed.wait())
        r = await gw.chat()
        assert r.status_code == 200, r.text  # not lost ...
        assert gw.sent(up) == 2  # ... and not sent twice
        assert [len(p.requests) for p in up.peers] == [1, 1]
        assert await gw.metric("tokengate_upstream_resends_total") == 0


async def test_a_slow_trickle_within_the_read_timeout_succeeds(through: MakeThrough) -> None:
    pieces = [ANSWER[i : i + 40] for i in range(0, len(ANSWER), 40)]

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(
            head("200 OK", "content-type: application/json", f"content-length: {len(ANSWER)}")
        )
        await peer.trickle(pieces, 0.1)  # never silent for long

    async with Upstream(handler) as up:
        gw = await through(up, token_scheduler={"timeout_ms": 3000})
        r = await gw.chat()
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["total_tokens"] == 7
        assert len(pieces) >= 4 and gw.sent(up) == 1


async def test_a_stream_trickling_within_the_read_timeout_succeeds(through: MakeThrough) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(SSE_HEAD)
        await peer.trickle([sse(e) for e in STREAM] + [b"0\r\n\r\n"], 0.15)

    async with Upstream(handler) as up:
        gw = await through(up, token_scheduler={"timeout_ms": 1500})
        r = await gw.chat(stream=True)
        assert r.status_code == 200 and deltas(r.text) == "pong"
        assert stream_error(r.text) is None and r.text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize("where", ["before-the-head", "after-the-head"])
async def test_silence_beyond_the_read_timeout_is_a_504_sent_once(
    through: MakeThrough, where: str
) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        if where == "after-the-head":
            await peer.send(head("200 OK", f"content-length: {len(ANSWER)}") + ANSWER[:10])
        await peer.wait_eof()  # and nothing more: the gateway gives up and hangs up

    async with Upstream(handler) as up:
        gw = await through(up, token_scheduler={"timeout_ms": 300})
        r = await gw.chat()
        assert r.status_code == 504, r.text
        assert r.headers["x-should-retry"] == "false"
        assert gw.sent(up) == 1
        await within(up.peers[0].eof.wait())
