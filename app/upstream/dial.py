"""Opening a TCP socket to a host name, with happy eyeballs (RFC 8305).

Why not `loop.create_connection(host, port)`: it tries a name's addresses one after
another, so an address that swallows SYNs (IPv6 routed but black-holed, a dead A
record) costs the whole connect timeout before the next is tried; uvloop, which serves
production, has no `happy_eyeballs_delay` at all. Here the addresses are interleaved by
family (the resolver's first, then the other, alternating) and the next attempt starts
when every running one failed or `DELAY` has passed, whichever comes first; the first
connected socket wins and the others are cancelled and closed. A name with a single
address (an IP literal, most upstreams) is one plain connect.

The caller bounds the whole dial with its connect timeout and hands the socket to
`loop.create_connection(sock=...)`, optionally after a CONNECT tunnel (`tunnel.py`).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from typing import Any

DELAY = 0.25  # RFC 8305's recommended connection attempt delay

AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, Any]


async def open_socket(host: str, port: int, *, delay: float = DELAY) -> socket.socket:
    """A connected non-blocking TCP socket to `host:port`; OSError when none connects."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"{host} has no address")
    addrs = interleave(infos)
    if len(addrs) == 1:
        return await _connect(loop, addrs[0])
    return await _race(loop, addrs, delay)


def interleave(infos: Sequence[AddrInfo]) -> list[AddrInfo]:
    """First family first (the resolver's preference), then alternating families."""
    first = infos[0][0]
    preferred = [i for i in infos if i[0] == first]
    others = [i for i in infos if i[0] != first]
    out: list[AddrInfo] = []
    for n in range(max(len(preferred), len(others))):
        out.extend(group[n] for group in (preferred, others) if n < len(group))
    return out


async def _connect(loop: asyncio.AbstractEventLoop, info: AddrInfo) -> socket.socket:
    family, kind, proto, _, address = info
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return sock


async def _race(
    loop: asyncio.AbstractEventLoop, addrs: list[AddrInfo], delay: float
) -> socket.socket:
    won: list[socket.socket] = []
    errors: list[OSError] = []
    ended = asyncio.Event()  # some attempt ended, either way

    async def attempt(info: AddrInfo) -> None:
        try:
            won.append(await _connect(loop, info))
        except OSError as exc:
            errors.append(exc)
        ended.set()

    tasks: list[asyncio.Task[None]] = []
    try:
        async with asyncio.TaskGroup() as group:  # no attempt outlives the dial
            for info in addrs:
                tasks.append(group.create_task(attempt(info)))
                # The next address when every running attempt failed, or after `delay`.
                started_at = loop.time()
                while not won and len(errors) < len(tasks):
                    ended.clear()
                    try:
                        async with asyncio.timeout_at(started_at + delay):
                            await ended.wait()
                    except TimeoutError:
                        break
                if won:
                    break
            while not won and len(errors) < len(tasks):
                ended.clear()
                await ended.wait()
            for task in tasks:
                task.cancel()
    except BaseException:
        for sock in won:
            sock.close()
        raise
    for extra in won[1:]:  # two connected in the same loop turn
        extra.close()
    if not won:
        raise errors[0]
    return won[0]
