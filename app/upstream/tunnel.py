"""A CONNECT tunnel through an HTTP proxy, on a socket connected to the proxy.

    CONNECT host:port HTTP/1.1 ──► proxy ──► "HTTP/1.1 200 ..." ──► the socket now
    (Proxy-Authorization: Basic …)                                   reaches host:port

Done on the raw socket (`sock_sendall` / `sock_recv`) before asyncio gets it, so the
TLS handshake that follows (`create_connection(sock=..., ssl=...)`) is the same code
path as a direct connection, on asyncio and uvloop alike. Nobody talks first on a
fresh tunnel, so a byte after the proxy's head means the socket can not be trusted.
Every failure is a `connect` failure naming the proxy as logged (`ProxyRoute.shown`),
never its credentials; 407 (credentials refused) is not retryable: only a
configuration change helps.
"""

from __future__ import annotations

import asyncio
import socket

from app.upstream.attempt import AttemptFailed, Reason
from app.upstream.proxyenv import ProxyRoute

HEAD_LIMIT = 16 * 1024


def connect_request(route: ProxyRoute, host: str, port: int) -> bytes:
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1\r\nhost: {authority}\r\n"]
    if route.authorization is not None:
        lines.append(f"proxy-authorization: {route.authorization}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


async def open_tunnel(sock: socket.socket, route: ProxyRoute, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, connect_request(route, host, port))
    head = b""
    while b"\r\n\r\n" not in head:
        if len(head) > HEAD_LIMIT:
            raise _failed(route, "answered CONNECT with an oversized head")
        data = await loop.sock_recv(sock, 4096)
        if not data:
            raise _failed(route, "closed the connection during CONNECT")
        head += data
    status = _status(head)
    if status == 407:
        raise _failed(route, "refused the proxy credentials (407)", retryable=False)
    if status is None or not 200 <= status < 300:
        raise _failed(route, f"answered CONNECT {host}:{port} with {status or 'garbage'}")
    if not head.endswith(b"\r\n\r\n"):
        raise _failed(route, "sent bytes after its CONNECT answer")


def _status(head: bytes) -> int | None:
    parts = head.split(b"\r\n", 1)[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        return None
    return int(parts[1])


def _failed(route: ProxyRoute, what: str, *, retryable: bool = True) -> AttemptFailed:
    return AttemptFailed(Reason.CONNECT, retryable=retryable, detail=f"proxy {route.shown} {what}")
