"""The once-a-second upkeep runs each step on its own; shutdown logs every close error."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.housekeeping import Housekeeping, Step
from app.metrics import Metrics, new_registry
from tests.support.inproc import MakeGateway


async def test_a_failing_step_is_logged_counted_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[str] = []
    failed: list[str] = []

    async def broken() -> None:
        ran.append("broken")
        raise RuntimeError("boom")

    async def fine() -> None:
        ran.append("fine")

    steps = [
        Step("broken", broken),
        Step("fine", fine),
        Step("sync", lambda: ran.append("sync")),
        Step("rare", lambda: ran.append("rare"), every=3, offset=1),
    ]
    upkeep = Housekeeping(steps, failed.append)
    with caplog.at_level(logging.ERROR, logger="tokengate.gateway"):
        for _ in range(4):
            await upkeep.tick()
    assert ran.count("fine") == ran.count("sync") == 4  # every tick, after the failure
    assert ran.count("rare") == 2  # ticks 1 and 4
    assert failed == ["broken"] * 4
    assert "housekeeping step broken failed (tried again next time): RuntimeError('boom')" in (
        caplog.messages
    )


async def test_the_gateway_counts_a_failing_step_by_name(
    make_local_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = make_local_gateway()
    await gateway.start()

    async def unavailable() -> None:
        raise ConnectionError("live limits unreachable")

    gateway.live.load_limits = unavailable  # type: ignore[method-assign]
    renewed: list[int] = []
    renew = gateway.spend.renew

    async def counting() -> None:
        renewed.append(1)
        await renew()

    gateway.spend.renew = counting  # type: ignore[method-assign]
    gateway.housekeeping = Housekeeping(
        gateway._upkeep(), gateway.metrics.record_housekeeping_failure
    )
    await gateway.housekeeping.tick()
    text = gateway.metrics.render().decode()
    assert 'tokengate_housekeeping_failures_total{step="live_limits"} 1.0' in text
    assert renewed == [1]  # a later step still ran
    assert any("housekeeping step live_limits failed" in m for m in caplog.messages)


async def test_every_close_error_at_shutdown_is_logged_and_the_rest_still_closes(
    make_local_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = make_local_gateway()
    await gateway.start()

    async def fails() -> None:
        raise OSError("gone")

    gateway.batch_runner.release = fails  # type: ignore[method-assign]
    store_close = gateway.store.close
    gateway.store.close = fails  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="tokengate.gateway"):
        await gateway.close()
    assert "batch leases release at shutdown failed: OSError('gone')" in caplog.messages
    assert "shared store at shutdown failed: OSError('gone')" in caplog.messages
    await store_close()


def test_the_failure_counter_starts_absent() -> None:
    metrics = Metrics(new_registry())
    assert "tokengate_housekeeping_failures_total{" not in metrics.render().decode()


async def test_shutdown_cancels_a_background_task_before_the_database_closes(
    make_local_gateway: MakeGateway,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A background task (a settle, an audit write) still running when the patience for
    # them runs out used to be left running: the database closed under it, and its
    # driver's thread answered into a closed event loop.
    monkeypatch.setattr("app.gateway.TASKS_WAIT_SEC", 0.0)
    gateway = make_local_gateway()
    await gateway.start()
    unwound: list[str] = []

    async def slow_write() -> None:
        try:
            async with gateway.db.engine.connect() as conn:
                await asyncio.Event().wait()  # holds the connection until cancelled
                await conn.close()
        finally:
            unwound.append("done")

    gateway.spawn(slow_write())
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="tokengate.gateway"):
        await gateway.close()
    assert unwound == ["done"]  # cancelled and unwound, its connection given back
    assert "1 background task(s) still running at shutdown: cancelled" in caplog.messages
