"""A scriptable loopback HTTP/1.1 upstream for the upstream-client tests.

`Upstream` runs `asyncio.start_server` on 127.0.0.1 (or ::1; TLS with a certificate made
by `tests.support.tls`) and a handler that speaks raw HTTP/1.1 bytes scripted by the
test, so the test controls exactly what the "upstream" answers and sees what it
received: how many connections were opened, each request's bytes, and whether the
client closed its end (EOF).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from app.upstream.attempt import AttemptFailed
from app.upstream.transport import Transport, UpstreamResponse

T = TypeVar("T")
# The most any condition in these tests may take to come true: a bound on what does
# happen, so generous (a loaded machine took more than the 1 s this once was), and never
# what a test waits out: a condition that holds returns at once.
WAIT = 30.0


# -- a scriptable loopback upstream ------------------------------------------------------------


@dataclass
class Peer:
    """The server's side of one accepted connection."""

    index: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    requests: list[bytes] = field(default_factory=list)
    eof: asyncio.Event = field(default_factory=asyncio.Event)

    async def request(self) -> bytes | None:
        """One whole request (head and content-length body), or None once the client
        closed its end."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            self.eof.set()
            return None
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await self.reader.readexactly(length) if length else b""
        self.requests.append(head + body)
        return head + body

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def trickle(self, pieces: list[bytes], interval: float) -> None:
        """Send `pieces` one by one, `interval` apart, until the client goes away."""
        for piece in pieces:
            if self.reader.at_eof() or self.writer.is_closing():
                # Gone: its FIN read, or a write after its close reset the connection and
                # closed our transport. Said either way: on a loaded machine the reset
                # often comes first, and the FIN is then never read (seen in a loaded run).
                self.eof.set()
                return
            await self.send(piece)
            await asyncio.sleep(interval)

    async def wait_eof(self) -> None:
        """Read (and drop) whatever the client sends until it closes its end."""
        try:
            while await self.reader.read(65536):
                pass
        except ConnectionError:
            pass
        self.eof.set()

    def close(self) -> None:
        self.writer.close()


Handler = Callable[[Peer], Awaitable[None]]


class Upstream:
    """A loopback HTTP/1.1 server running `handler` on every accepted connection. After
    the handler returns the connection stays open (unless the handler closed it) until
    the client closes it, so `peer.eof` tells whether the client hung up."""

    def __init__(
        self, handler: Handler, *, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None
    ) -> None:
        self.handler = handler
        self.host = host
        self.tls = tls
        self.peers: list[Peer] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Upstream:
        self._server = await asyncio.start_server(self._accept, self.host, 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        for _ in range(3):  # let the closed transports' callbacks run
            await asyncio.sleep(0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = Peer(len(self.peers), reader, writer)
        self.peers.append(peer)
        try:
            await self.handler(peer)
            if not writer.is_closing():
                await peer.wait_eof()
        except (ConnectionError, asyncio.IncompleteReadError):
            peer.eof.set()
        except asyncio.CancelledError:
            pass  # the test is over (asyncio 3.11 would log a cancelled callback task)
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def url(self, path: str = "/v1/chat/completions", *, host: str | None = None) -> str:
        name = host or self.host
        name = f"[{name}]" if ":" in name else name
        return f"{self.scheme}://{name}:{self.port}{path}"

    @property
    def requests(self) -> list[bytes]:
        return [r for peer in self.peers for r in peer.requests]


def ok(body: bytes = b"ok", *headers: str, version: str = "1.1") -> bytes:
    lines = "".join(f"{h}\r\n" for h in headers)
    head = f"HTTP/{version} 200 OK\r\n{lines}content-length: {len(body)}\r\n\r\n"
    return head.encode() + body


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def serve(*answers: bytes) -> Handler:
    """Answer the n-th request on a connection with answers[n] (the last one repeats)."""

    async def handler(peer: Peer) -> None:
        n = 0
        while await peer.request() is not None:
            await peer.send(answers[min(n, len(answers) - 1)])
            n += 1

    return handler


async def trickle_body(peer: Peer) -> None:
    """Answer 200 with a 1000-byte body sent a byte every 20 ms: never silent long enough
    for a read timeout, so only a total deadline can end it."""
    await peer.request()
    await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
    await peer.trickle([b"x"] * 1000, 0.02)


async def within(aw: Awaitable[T], seconds: float = WAIT) -> T:
    async with asyncio.timeout(seconds):
        return await aw


async def until(predicate: Callable[[], bool]) -> None:
    """Until `predicate()` holds: for state of the code under test, which has no event."""
    async with asyncio.timeout(WAIT):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.001)


async def post(
    t: Transport, url: str, body: bytes | None = b"{}", *, stream: bool = False
) -> UpstreamResponse:
    return await within(
        t.request("POST", url, {"content-type": "application/json"}, body, stream=stream)
    )


async def failure(aw: Awaitable[Any]) -> AttemptFailed:
    with pytest.raises(AttemptFailed) as err:
        await within(aw)
    return err.value


async def collect(resp: UpstreamResponse) -> list[bytes]:
    return [chunk async for chunk in resp.chunks()]


@contextmanager
def unanswered_port() -> Iterator[int]:
    """A port whose connects hang: a listener with a full accept queue (backlog 0, one
    connection already queued, never accepted) drops new SYNs."""
    with socket.socket() as listener, socket.socket() as queued:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        queued.settimeout(WAIT)
        queued.connect(("127.0.0.1", port))
        extra = [socket.socket() for _ in range(2)]  # in case the kernel queues one more
        try:
            for s in extra:
                s.setblocking(False)
                with suppress(BlockingIOError):
                    s.connect(("127.0.0.1", port))
            yield port
        finally:
            for s in extra:
                s.close()
