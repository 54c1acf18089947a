"""Keep-alive connection pools over `connection.Connection`: the default upstream client.

`NativeTransport` implements the `Transport` seam of `client.py` with one `Pool` per
origin (scheme, host, port). A pool lends its most recently used idle connection
(LIFO: the one least likely to have been closed by the upstream meanwhile), opens a
new one while under `limit`, and beyond that queues callers until one is returned.
Idle connections older than `keepalive` are closed instead of lent.

A request on a reused connection that dies before any byte of the answer arrived is
sent once more on a fresh connection: the upstream closed it while it idled (the
race every keep-alive client has), which says nothing about the upstream's health
and must not cost a retry from the domain's budget or feed its circuit breaker. Only
then, and only once: an answer's first byte, a fresh connection, or a second death means
the upstream may have seen the request, and a POST is never sent twice for it.

A caller finding the pool full waits at most `pool_timeout` for a connection (then a
`timeout` failure: connections stuck on answers that never come must not queue every
later request behind them). Connections are opened by `dial.open_socket` (happy
eyeballs), through a proxy when `proxyenv` names one for the origin: CONNECT
(`tunnel.py`) for https, absolute-form requests with Proxy-Authorization for http.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.upstream.attempt import AttemptFailed, Reason
from app.upstream.connection import Connection, Response
from app.upstream.dial import open_socket
from app.upstream.proxyenv import Proxies, ProxyRoute
from app.upstream.tunnel import open_tunnel

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


def absolute(target: Target) -> Target:
    """The same target in absolute form, as a request through a forward proxy names it."""
    scheme = target.origin[0]
    return Target(
        target.origin, target.host_header, f"{scheme}://{target.host_header}{target.path}"
    )


def request_head(
    method: str, target: Target, headers: dict[str, str], length: int | None, extra: str = ""
) -> bytes:
    """The request line and headers (`extra`: pre-rendered lines, a proxy's credential).
    CR or LF in any name or value is refused: the values come from configuration and
    allowlisted client headers, and a line break would let one of them add headers or
    requests of its own."""
    lines = [f"{method} {target.path} HTTP/1.1\r\nhost: {target.host_header}\r\n{extra}"]
    for name, value in headers.items():
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise AttemptFailed(Reason.BAD_REQUEST, retryable=False, detail=f"line break in {name}")
        lines.append(f"{name}: {value}\r\n")
    if length is not None:
        lines.append(f"content-length: {length}\r\n")
    lines.append("\r\n")
    try:
        return "".join(lines).encode("latin-1")
    except UnicodeEncodeError:
        raise AttemptFailed(
            Reason.BAD_REQUEST, retryable=False, detail="a header is not latin-1"
        ) from None


class Pool:
    """The connections to one origin."""

    def __init__(
        self,
        origin: tuple[str, str, int],
        limit: int,
        connect_timeout: float,
        ssl_context: ssl.SSLContext | None,
        *,
        pool_timeout: float,
        route: ProxyRoute | None = None,
    ) -> None:
        self.scheme, self.host, self.port = origin
        self.limit = max(1, limit)
        self.connect_timeout = connect_timeout
        self.pool_timeout = pool_timeout
        self.ssl = ssl_context if self.scheme == "https" else None
        self.route = route
        # through a proxy, an http:// request is sent to it in absolute form, with its
        # credential on every request; an https:// one goes through a CONNECT tunnel
        self.forward = route is not None and self.scheme == "http"
        self.extra = ""
        if self.forward and route is not None and route.authorization is not None:
            self.extra = f"proxy-authorization: {route.authorization}\r\n"
        self.idle: list[Connection] = []
        self._members: set[Connection] = set()
        self._connecting = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def exchange(
        self,
        head: bytes,
        body: bytes | None,
        read_timeout: float,
        total: float | None,
        *,
        head_only: bool = False,
    ) -> Response:
        data = head + body if body else head
        deadline = None if total is None else asyncio.get_running_loop().time() + total
        conn = await self._acquire()
        try:
            return await conn.send(data, read_timeout, deadline, head_only=head_only)
        except AttemptFailed as failure:
            # Reused, died before any byte of the answer: the idle-close race, sent once
            # more on a fresh connection (see the module docstring).
            if not (conn.exchanges > 1 and failure.reason is Reason.RESET and not conn.answered):
                raise
        conn = await self._acquire(fresh=True)
        return await conn.send(data, read_timeout, deadline, head_only=head_only)

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
                async with asyncio.timeout(self.pool_timeout):
                    await waiter
            except TimeoutError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()
                else:
                    self._waiters.remove(waiter)
                detail = f"no free connection in {self.pool_timeout:g} s (pool of {self.limit})"
                raise AttemptFailed(Reason.TIMEOUT, retryable=True, detail=detail) from None
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
                conn = await self._open(loop)
            connected = not conn.closed
        except TimeoutError:
            detail = self._via("connect timed out")
            raise AttemptFailed(Reason.CONNECT, retryable=True, detail=detail) from None
        except OSError as exc:  # ssl.SSLError included
            detail = self._via(exc.strerror or type(exc).__name__)
            raise AttemptFailed(Reason.CONNECT, retryable=True, detail=detail) from None
        finally:
            self._connecting -= 1
            if not connected:
                self._wake()  # the slot this connect held is free again
        if not connected:  # closed by the upstream before it was ever used
            raise AttemptFailed(Reason.CONNECT, retryable=True, detail="closed on connect")
        self._members.add(conn)
        return conn

    async def _open(self, loop: asyncio.AbstractEventLoop) -> Connection:
        route = self.route
        host, port = (route.host, route.port) if route else (self.host, self.port)
        sock = await open_socket(host, port)
        try:
            if route is not None and not self.forward:
                await open_tunnel(sock, route, self.host, self.port)
        except BaseException:
            sock.close()
            raise
        # From here the transport owns the socket (asyncio and uvloop close it on failure).
        _, conn = await loop.create_connection(
            lambda: Connection(loop, self._idle, self._lost),
            sock=sock,
            ssl=self.ssl,
            server_hostname=self.host if self.ssl else None,
        )
        return conn

    def _via(self, detail: str) -> str:
        return detail if self.route is None else f"{detail} (via proxy {self.route.shown})"

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
    """The `Transport` of `client.py` over `Pool`s; `total` bounds non-streamed answers,
    `pool_timeout` (default: `read`) the wait for a free connection."""

    def __init__(
        self,
        connect: float,
        read: float,
        total: float,
        pool_size: int,
        *,
        pool_timeout: float | None = None,
        ssl_context: ssl.SSLContext | None = None,
        proxies: Proxies | None = None,
    ) -> None:
        self._connect = connect
        self._read = read
        self._total = total
        self._pool_size = pool_size
        self._pool_timeout = read if pool_timeout is None else pool_timeout
        self._pools: dict[tuple[str, str, int], Pool] = {}
        self._targets: dict[str, tuple[Target, Pool]] = {}
        self._ssl = ssl_context
        self._proxies = proxies or Proxies()

    def route(self, url: str) -> ProxyRoute | None:
        """The proxy requests to `url` go through (None: direct)."""
        scheme, host, port = parse_target(url).origin
        return self._proxies.route(scheme, host, port)

    def _target(self, url: str) -> tuple[Target, Pool]:
        found = self._targets.get(url)
        if found is None:
            target = parse_target(url)
            pool = self._pool(target)
            found = (absolute(target) if pool.forward else target), pool
            if len(self._targets) < 256:  # a handful of base URLs x paths in practice
                self._targets[url] = found
        return found

    def _pool(self, target: Target) -> Pool:
        pool = self._pools.get(target.origin)
        if pool is None:
            scheme, host, port = target.origin
            if scheme == "https" and self._ssl is None:
                self._ssl = ssl.create_default_context()
            route = self._proxies.route(scheme, host, port)
            pool = Pool(
                target.origin,
                self._pool_size,
                self._connect,
                self._ssl,
                pool_timeout=self._pool_timeout,
                route=route,
            )
            self._pools[target.origin] = pool
        return pool

    async def request(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None, *, stream: bool
    ) -> Response:
        target, pool = self._target(url)
        length = None if body is None else len(body)
        head = request_head(method, target, headers, length, pool.extra)
        total = None if stream else self._total
        return await pool.exchange(head, body, self._read, total, head_only=method == "HEAD")

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
