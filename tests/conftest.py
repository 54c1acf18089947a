"""Shared fixtures: real processes for e2e tests (see tests/support/procs.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.procs import (
    Gateway,
    GatewaySpec,
    Redis,
    Sim,
    redis_server,
    start_gateway,
    start_sim,
)


@pytest.fixture
def sim() -> Iterator[Sim]:
    s = start_sim()
    yield s
    s.stop()


@pytest.fixture
def make_sim() -> Iterator[Callable[..., Sim]]:
    started: list[Sim] = []

    def make(*args: str, **kwargs: object) -> Sim:
        s = start_sim(*args, **kwargs)  # type: ignore[arg-type]
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


@pytest.fixture
def make_gateway(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    started: list[Gateway] = []

    def make(spec: GatewaySpec | None = None, upstream: str | None = None, **kw: object) -> Gateway:
        gw = start_gateway(tmp_path / f"gw{len(started)}", spec or GatewaySpec(), upstream, **kw)  # type: ignore[arg-type]
        started.append(gw)
        return gw

    yield make
    for gw in started:
        gw.stop()


@pytest.fixture
def gateway(sim: Sim, make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway(GatewaySpec(), sim.url)


@pytest.fixture
def redis() -> Iterator[Redis]:
    with redis_server() as r:
        yield r
