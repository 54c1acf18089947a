"""Happy eyeballs: a name whose first address swallows connects still connects quickly.

The "black-holed" address is a real listener on ::1 whose accept queue is full (new
SYNs are dropped), the good one a server on 127.0.0.1; the resolver is replaced so the
name yields the bad address first, as a broken IPv6 route does.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest

from app.upstream import dial
from app.upstream.pool import NativeTransport
from tests.support.loopback import Upstream, ok, serve, within


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


def fake_resolver(monkeypatch: pytest.MonkeyPatch, infos: list[Any]) -> None:
    async def getaddrinfo(*args: Any, **kwargs: Any) -> list[Any]:
        return infos

    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)


def v6(port: int) -> Any:
    return (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0))


def v4(port: int) -> Any:
    return (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))


async def test_a_black_holed_first_address_does_not_cost_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with Upstream(serve(ok(b"v4"))) as up:
        with black_hole(socket.AF_INET6, "::1") as dead:
            fake_resolver(monkeypatch, [v6(dead), v4(up.port)])
            # Connect timeout 5 s, bound 1 s: only a second attempt started early passes.
            t = NativeTransport(5.0, 1.0, 2.0, 4)
            try:
                resp = await within(
                    t.request("POST", "http://upstream.test/v1", {}, b"{}", stream=False)
                )
                assert await within(resp.read()) == b"v4"
            finally:
                await t.close()


async def test_a_refused_address_moves_on_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET6) as bound:  # bound, not listening: refuses
        bound.bind(("::1", 0))
        refused = bound.getsockname()[1]
        async with Upstream(serve(ok(b"v4"))) as up:
            fake_resolver(monkeypatch, [v6(refused), v4(up.port)])
            sock = await within(dial.open_socket("upstream.test", 0, delay=30.0))
            assert sock.getpeername() == ("127.0.0.1", up.port)
            sock.close()


async def test_every_address_failing_is_an_oserror(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET6) as a, socket.socket() as b:
        a.bind(("::1", 0))
        b.bind(("127.0.0.1", 0))
        fake_resolver(monkeypatch, [v6(a.getsockname()[1]), v4(b.getsockname()[1])])
        with pytest.raises(OSError):
            await within(dial.open_socket("upstream.test", 0))


async def test_ipv6_loopback_upstream() -> None:
    async with Upstream(serve(ok(b"six")), host="::1") as up:
        t = NativeTransport(1.0, 1.0, 2.0, 4)
        try:
            resp = await within(t.request("POST", up.url(), {}, b"{}", stream=False))
            assert await within(resp.read()) == b"six"
        finally:
            await t.close()


def test_interleave_alternates_families_starting_with_the_first() -> None:
    infos = [v6(1), v6(2), v4(3), v4(4), v4(5)]
    assert [i[4][1] for i in dial.interleave(infos)] == [1, 3, 2, 4, 5]
