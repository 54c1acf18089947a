"""A real HTTP proxy on a loopback port (IPv4, or IPv6 with `host="::1"`), for the upstream
clients' proxy tests.

It speaks the two forms a client uses: `CONNECT host:port` (a tunnel, then bytes both
ways: how https:// is proxied) and absolute-form requests (`POST http://host:port/p`,
rewritten to origin-form and forwarded without the proxy's credential: how http:// is
proxied; after a WebSocket upgrade, bytes both ways). With `credentials` it answers 407
unless Proxy-Authorization is Basic with them. It records what it saw (`heads`: each
request head as received) so a test can assert which requests went through it, and with
which headers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from typing import Any
from urllib.parse import urlsplit


class ForwardProxy:
    def __init__(self, credentials: tuple[str, str] | None = None, host: str = "127.0.0.1") -> None:
        self.credentials = credentials
        self.host = host  # "::1": a proxy reached at an IPv6 literal
        self.heads: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def tunnels(self) -> list[bytes]:
        return [h.split(b" ")[1] for h in self.heads if h.startswith(b"CONNECT ")]

    def url(self, userinfo: str = "") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{userinfo + '@' if userinfo else ''}{host}:{self.port}"

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for _ in range(3):  # let the closed transports' callbacks run (and close sockets)
            await asyncio.sleep(0)

    def _track(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _authorized(self, head: bytes) -> bool:
        if self.credentials is None:
            return True
        token = base64.b64encode(":".join(self.credentials).encode()).decode()
        return f"proxy-authorization: basic {token}".lower().encode() in head.lower()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._track()
        upstream: asyncio.StreamWriter | None = None
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                self.heads.append(head)
                if not self._authorized(head):
                    writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n")
                    writer.write(b"proxy-authenticate: Basic\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    return
                method, target, _ = head.split(b"\r\n", 1)[0].split(b" ", 2)
                if method == b"CONNECT":
                    host, _, port = target.decode().rpartition(":")
                    up_r, upstream = await asyncio.open_connection(host.strip("[]"), int(port))
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await writer.drain()
                    await _pipe_both(reader, writer, up_r, upstream)
                    return
                upstream = await self._forward(head, target, reader, writer, upstream)
                if b"\r\nupgrade: websocket" in head.lower():  # after the 101: bytes both ways
                    await _pipe(reader, upstream)
                    return
        except asyncio.CancelledError:
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()

    async def _forward(
        self,
        head: bytes,
        target: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: asyncio.StreamWriter | None,
    ) -> asyncio.StreamWriter:
        url = urlsplit(target.decode())
        if upstream is None:  # one upstream per client connection is all the tests need
            up_r, upstream = await asyncio.open_connection(url.hostname, url.port)
            self._spawn(_pipe(up_r, writer))
        lines = head.split(b"\r\n")
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        lines[0] = lines[0].replace(target, path.encode())
        kept = [ln for ln in lines if not ln.lower().startswith(b"proxy-authorization:")]
        length = 0
        for line in kept:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await reader.readexactly(length) if length else b""
        upstream.write(b"\r\n".join(kept) + body)
        await upstream.drain()
        return upstream

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.CancelledError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def _pipe_both(
    a_r: asyncio.StreamReader,
    a_w: asyncio.StreamWriter,
    b_r: asyncio.StreamReader,
    b_w: asyncio.StreamWriter,
) -> None:
    await asyncio.gather(_pipe(a_r, b_w), _pipe(b_r, a_w))
