"""Streams: relayed event by event as they arrive, and at the pace of the slowest side
(a client that stops reading stops the upstream, instead of the gateway buffering)."""

from __future__ import annotations

import asyncio
import socket

from tests.support.loopback import Peer, Upstream, within
from tests.unit.upstream.conformance.conftest import MakeThrough
from tests.unit.upstream.conformance.harness import PING, STREAM, deltas, event, head

SSE_HEAD = head("200 OK", "content-type: text/event-stream", "transfer-encoding: chunked")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def test_each_event_reaches_the_client_before_the_next_is_sent(
    through: MakeThrough,
) -> None:
    # The upstream sends the next event only once the client has the previous one: a
    # gateway that held events back would deadlock here.
    seen = [asyncio.Event() for _ in STREAM]

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(SSE_HEAD)
        for n, data in enumerate(STREAM):
            await peer.send(chunk(data))
            if n < 2:
                await within(seen[n].wait())
        await peer.send(b"0\r\n\r\n")

    async with Upstream(handler) as up:
        gw = await through(up)
        got = []
        async with gw.client.stream(
            "POST", "/v1/chat/completions", json={**PING, "stream": True}
        ) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    got.append(line)
                    if len(got) <= 2:
                        seen[len(got) - 1].set()
        assert deltas("\n".join(got)) == "pong"
        assert got[-1] == "data: [DONE]"
        assert gw.sent(up) == 1


async def test_a_client_that_stops_reading_stops_the_upstream(through: MakeThrough) -> None:
    piece = event("x" * 16_000)
    total = 4096  # events: ~64 MiB, more than every buffer between the two ends
    sent = 0
    finished = asyncio.Event()

    async def handler(peer: Peer) -> None:
        nonlocal sent
        await peer.request()
        sock = peer.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        await peer.send(SSE_HEAD)
        for _ in range(total):
            await peer.send(chunk(piece))
            sent += 1
        await peer.send(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        finished.set()

    async with Upstream(handler) as up:
        gw = await through(up)
        # A raw client with a small receive buffer, which reads the head and then nothing.
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.served.port, limit=1 << 20)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        body = b'{"model":"m-1","stream":true,"messages":[{"role":"user","content":"ping"}]}'
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            b"content-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert (await within(reader.readuntil(b"\r\n\r\n"))).startswith(b"HTTP/1.1 200")
        # Stalled: the upstream keeps up only as far as the buffers between allow.
        while True:
            before = sent
            await asyncio.sleep(0.3)
            if sent == before:
                break
        assert sent < total // 2, f"the upstream sent {sent} of {total} events to a stalled client"
        assert not finished.is_set()
        # Reading again, the client gets the whole stream, to its last (zero-size) chunk.
        received = bytearray()
        async with asyncio.timeout(60):
            while not received.endswith(b"\r\n0\r\n\r\n"):
                data = await reader.read(1 << 20)
                assert data, "the stream ended early"
                received += data
        writer.close()
        assert received.count(b'"content":"x') == total
        assert b"data: [DONE]" in received[-64:] and gw.sent(up) == 1
