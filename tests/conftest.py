"""Shared fixtures: real processes for e2e tests (see tests/support/procs.py).

Starting a process costs a second or two on this machine, so the plain simulator is one
per session (reset before every test: faults off, records and counters cleared) and the
default gateway is one per module. Tests that need their own flags use `make_sim` /
`make_gateway`, which start fresh processes and stop them after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.config.schema import DatabaseConfig
from tests.support.postgres import Postgres, postgres_server
from tests.support.procs import (
    Gateway,
    GatewaySpec,
    Redis,
    Sim,
    redis_server,
    start_gateway,
    start_sim,
)
from tests.support.waiting import sqlite_threads


@pytest.fixture(autouse=True)
def _no_sqlite_connection_left_open() -> Iterator[None]:
    """A test ends with every SQLite connection it opened closed. One left open (a task
    still writing when its gateway or database closed) kept its driver's thread running
    past the test's event loop, and its late answer failed whichever test ran next."""
    before = sqlite_threads()
    yield
    left = sqlite_threads() - before
    for thread in left:
        thread.join(timeout=5)  # a connection being closed ends its thread by itself
    open_ = [t.name for t in left if t.is_alive()]
    assert not open_, f"SQLite connection(s) left open by this test: {open_}"


@pytest.fixture(scope="session")
def _shared_sim() -> Iterator[Sim]:
    s = start_sim()
    yield s
    s.stop()


@pytest.fixture
def sim(_shared_sim: Sim) -> Sim:
    _shared_sim.faults()
    _shared_sim.clear()
    return _shared_sim


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


@pytest.fixture(scope="module")
def _module_gateway(
    _shared_sim: Sim, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    gw = start_gateway(tmp_path_factory.mktemp("gateway"), GatewaySpec(), _shared_sim.url)
    yield gw
    gw.stop()


@pytest.fixture
def gateway(sim: Sim, _module_gateway: Gateway) -> Gateway:
    """The default gateway (seed config, one key `alice`) in front of `sim`; shared by the
    tests of a module, so a test must not change its state (use `make_gateway` for that)."""
    return _module_gateway


@pytest.fixture
def redis() -> Iterator[Redis]:
    with redis_server() as r:
        yield r


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """One PostgreSQL server for the session (Debian's package, a throwaway cluster);
    tests take a fresh database each (`Postgres.fresh_database`)."""
    with postgres_server() as pg:
        yield pg


@pytest.fixture(params=["sqlite", "postgresql"])
def database_cfg(request: pytest.FixtureRequest, tmp_path: Path) -> DatabaseConfig:
    """The same test on the embedded SQLite file and on a real PostgreSQL database."""
    if request.param == "sqlite":
        return DatabaseConfig(path=str(tmp_path / "tokengate.sqlite3"))
    pg: Postgres = request.getfixturevalue("postgres")
    return DatabaseConfig.model_validate({"url": pg.url(pg.fresh_database())})
