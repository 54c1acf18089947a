"""Unit-test fixtures: a clean environment, a migrated database, a fake clock, in-process
gateways.

`make_local_gateway(settings, handler=...)` builds a `Gateway` on the given settings
(see `tests.support.inproc.local_settings` for what is filled in), with the upstream an
`httpx.MockTransport` when `handler` is given and the real client otherwise; every
gateway it built is closed after the test.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.config.schema import DatabaseConfig
from app.db import migrate
from app.db.engine import Database
from app.gateway import Gateway
from app.limits.limit_store import MemoryStore
from app.metrics import Metrics, new_registry
from app.runtime import compile_runtime
from tests.support.clock import FakeClock
from tests.support.inproc import Handler, MakeGateway, local_settings, mock_transport


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests see no TOKENGATE_* variables but the ones they set."""
    for name in list(os.environ):
        if name.startswith(("TOKENGATE_", "PROMETHEUS_MULTIPROC")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-unit-upstream")


@pytest.fixture
async def db(database_cfg: DatabaseConfig) -> AsyncIterator[Database]:
    """A migrated database, on SQLite and on PostgreSQL (`database_cfg`)."""
    database = Database(database_cfg)
    await migrate.prepare(database)
    yield database
    await database.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def make_local_gateway(tmp_path: Path) -> AsyncIterator[MakeGateway]:
    built: list[Gateway] = []

    def build(
        settings: dict[str, Any] | None = None,
        *,
        handler: Handler | None = None,
        upstream_key: str = "sk-upstream",
        clock: FakeClock | None = None,
    ) -> Gateway:
        runtime = compile_runtime(
            local_settings(tmp_path, settings), {"TAOTOKEN_API_KEY": upstream_key}, no_auth=True
        )
        gateway = Gateway(
            runtime,
            Metrics(new_registry()),
            transport_factory=mock_transport(handler) if handler is not None else None,
            # the limit buckets on the test's clock: no refill while a slow machine runs it
            store=MemoryStore(clock) if clock is not None else None,
        )
        built.append(gateway)
        return gateway

    yield build
    for gateway in built:
        await gateway.close()
