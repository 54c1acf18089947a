"""Keep-alive connection pools over `connection.Connection`: the default upstream client.

`NativeTransport` implements the `Transport` seam of `client.py` with one `Pool` per
origin (scheme, host, port). A pool lends its most recently used idle connection
(LIFO: the one least likely to have been closed by the upstream meanwhile), opens a
new one while under `limit`, and beyond that queues callers until one is returned.
Idle connections older than `keepalive` are closed instead of lent.

A request on a reused connection that dies before any byte of the answer arrived is
sent once more on a fresh connection: the upstream closed it while it idled (the
race every keep-alive client has), which says nothing about the upstream's health
and must not cost a retry from the domain's budget or feed its circuit breaker.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.upstream.attempt import AttemptFailed
from app.upstream.connection import Connection, Response

KEEPALIVE_SEC = 30.0


@dataclass(frozen=True)
class Target:
    """A request URL split once: which pool, and the request line's path."""

    origin: tuple[str, str, int]
    host_header: str
    path: str


def parse_target(url: str) -> Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    default = port == (443 if parts.scheme == "https" else 80)
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target((parts.scheme, parts.hostname, port), host if default else f"{host}:{port}", path)


def request_head(method: str, target: Target, headers: dict[str, str], length: int | None) -> bytes:
    """The request line and headers. CR or LF in any name or value is refused: the
    values come from configuration and allowlisted client headers, and a line break
    would let one of them add headers or requests of its own."""
    lines = [f"{method} {target.path} HTTP/1.1\r\nhost: {target.host_header}\r\n"]
    for name, value in headers.items():
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise AttemptFailed("bad_request", retryable=False, detail=f"line break in {name}")
        lines.append(f"{name}: {value}\r\n")
    if length is not None:
        lines.append(f"content-length: {length}\r\n")
    lines.append("\r\n")
    try:
        return "".join(lines).encode("latin-1")
    except UnicodeEncodeError:
        raise AttemptFailed(
            "bad_request", retryable=False, detail="a header is not latin-1"
        ) from None


class Pool:
    """The connections to one origin."""

    def __init__(
        self,
        origin: tuple[str, str, int],
        limit: int,
        connect_timeout: float,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.scheme, self.host, self.port = origin
        self.limit = max(1, limit)
        self.connect_timeout = connect_timeout
        self.ssl = ssl_context if self.scheme == "https" else None
        self.idle: list[Connection] = []
        self._members: set[Connection] = set()
        self._connecting = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def exchange(
        self, head: bytes, body: bytes | None, read_timeout: float, total: float | None
    ) -> Response:
        data = head + body if body else head
        conn = await self._acquire()
        loop = conn.loop
        deadline = None if total is None else loop.time() + total
        try:
            return await conn.send(data, read_timeout, deadline)
        except AttemptFailed as failure:
            if not (conn.exchanges > 1 and failure.reason == "reset" and not conn.answered):
                raise
        conn = await self._acquire(fresh=True)
        return await conn.send(data, read_timeout, deadline)

    async def _acquire(self, *, fresh: bool = False) -> Connection:
        while True:
            if not fresh:
                conn = self._take_idle()
                if conn is not None:
                    return conn
            if len(self._members) + self._connecting < self.limit:
                return await self._connect()
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, but leaving: the turn goes to the next caller
                else:
                    self._waiters.remove(waiter)
                raise

    def _take_idle(self) -> Connection | None:
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.loop.time() - conn.idle_since < KEEPALIVE_SEC:
                return conn
            conn.close()
        return None

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        self._connecting += 1
        connected = False
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(loop, self._idle, self._lost),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                )
            connected = not conn.closed
        except TimeoutError:
            raise AttemptFailed("connect", retryable=True, detail="connect timed out") from None
        except OSError as exc:
            detail = exc.strerror or type(exc).__name__
            raise AttemptFailed("connect", retryable=True, detail=detail) from None
        finally:
            self._connecting -= 1
            if not connected:
                self._wake()  # the slot this connect held is free again
        if not connected:  # closed by the upstream before it was ever used
            raise AttemptFailed("connect", retryable=True, detail="closed on connect")
        self._members.add(conn)
        return conn

    # -- connection callbacks -------------------------------------------------------------
    def _idle(self, conn: Connection) -> None:
        self.idle.append(conn)
        self._wake()

    def _lost(self, conn: Connection) -> None:
        # Only members count: a socket closed while its connect was being cancelled never
        # became one (its slot was returned by `_connect`).
        if conn in self._members:
            self._members.discard(conn)
            if conn in self.idle:
                self.idle.remove(conn)
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


class NativeTransport:
    """The `Transport` of `client.py` over `Pool`s; `total` bounds non-streamed answers."""

    def __init__(self, connect: float, read: float, total: float, pool_size: int) -> None:
        self._connect = connect
        self._read = read
        self._total = total
        self._pool_size = pool_size
        self._pools: dict[tuple[str, str, int], Pool] = {}
        self._targets: dict[str, Target] = {}
        self._ssl: ssl.SSLContext | None = None

    def _target(self, url: str) -> Target:
        target = self._targets.get(url)
        if target is None:
            target = parse_target(url)
            if len(self._targets) < 256:  # a handful of base URLs x paths in practice
                self._targets[url] = target
        return target

    def _pool(self, target: Target) -> Pool:
        pool = self._pools.get(target.origin)
        if pool is None:
            if target.origin[0] == "https" and self._ssl is None:
                self._ssl = ssl.create_default_context()
            pool = Pool(target.origin, self._pool_size, self._connect, self._ssl)
            self._pools[target.origin] = pool
        return pool

    async def request(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None, *, stream: bool
    ) -> Response:
        target = self._target(url)
        head = request_head(method, target, headers, None if body is None else len(body))
        total = None if stream else self._total
        return await self._pool(target).exchange(head, body, self._read, total)

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
