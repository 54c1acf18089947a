"""Fixtures of the conformance suite: `through(upstream, ...)` starts the gateway in
front of scripted upstreams; every case runs on asyncio's loop and on uvloop (the loop
production serves on)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import uvloop

from tests.support.loopback import Upstream
from tests.unit.upstream.conformance.harness import Through, start

MakeThrough = Callable[..., Awaitable[Through]]


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture
async def through(tmp_path: Path) -> AsyncIterator[MakeThrough]:
    """`await through(up, *more, base=None, **settings)`: the gateway with one domain per
    upstream (`base` overrides the first one's URL, e.g. to reach it by name)."""
    async with AsyncExitStack() as stack:
        count = 0

        async def build(*upstreams: Upstream, bases: list[str] | None = None, **kw: Any) -> Through:
            nonlocal count
            count += 1
            home = tmp_path / f"gw{count}"
            home.mkdir()
            urls = bases or [up.url("") for up in upstreams]
            return await start(stack, home, list(upstreams), urls, **kw)

        yield build
