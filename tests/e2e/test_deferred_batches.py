"""Batches deferred to an off-peak window over real sockets: held (durably: a restart
keeps them held) while the window is not in force, shown in /admin/status and counted;
released early when waiting would miss the completion window; run at once in the window."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests.e2e.test_batches import FAST_KEYS, line, sent_items, start, wait_done
from tests.support.procs import Gateway, GatewaySpec, Sim
from tests.support.scrape import metric_sum

Make = Callable[..., Gateway]
ADMIN = "admin-test-key-0123456789"
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


def spec(window: dict[str, Any]) -> GatewaySpec:
    settings = {"admin_key": ADMIN, "billing": {"windows": {"offpeak": window}}}
    return GatewaySpec(keys=FAST_KEYS, settings=settings)


def raw_batch(gw: Gateway, batch_id: str) -> dict[str, Any]:
    r = httpx.get(f"{gw.url}/v1/batches/{batch_id}", headers=gw.headers("alice"), timeout=10)
    r.raise_for_status()
    return dict(r.json())


def deferred_count(gw: Gateway, outcome: str) -> float:
    return metric_sum(gw.metrics(), "tokengate_deferred_total", outcome=outcome)


def wait_for(check: Callable[[], Any], seconds: float = 30.0) -> Any:
    import time

    deadline = time.monotonic() + seconds
    while not (found := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def test_a_batch_waits_for_the_window_even_across_a_restart(sim: Sim, make_gateway: Make) -> None:
    opens = (datetime.now(UTC) + timedelta(hours=6)).replace(second=0, microsecond=0)
    closes = opens + timedelta(hours=1)
    window = {"start": opens.strftime("%H:%M"), "end": closes.strftime("%H:%M")}
    gw = make_gateway(spec(window), sim.url)
    client = gw.openai("alice")
    batch = start(client, [line(i) for i in range(3)])
    held = wait_for(lambda: raw_batch(gw, batch.id).get("tokengate_deferral"))
    assert held["window"] == "offpeak" and held["released_at"] is None
    assert held["release_at"] == opens.isoformat()
    assert raw_batch(gw, batch.id)["status"] == "in_progress"
    status = httpx.get(f"{gw.url}/admin/status", headers=ADMIN_H, timeout=10).json()
    (shown,) = status["deferred"]
    assert (shown["batch"], shown["pending"], shown["release_at"]) == (
        batch.id,
        3,
        opens.isoformat(),
    )
    assert deferred_count(gw, "held") == 1
    gw.restart()
    again = wait_for(
        lambda: httpx.get(f"{gw.url}/admin/status", headers=ADMIN_H, timeout=10).json()["deferred"]
    )
    assert [d["batch"] for d in again] == [batch.id]
    assert sum(sent_items(sim).values()) == 0  # nothing went upstream
    assert deferred_count(gw, "held") == 0  # already noted as held before the restart
    client.close()


def test_a_batch_that_would_miss_its_completion_window_is_released_early(
    sim: Sim, make_gateway: Make
) -> None:
    far = DAYS[(datetime.now(UTC).weekday() + 3) % 7]  # 2-3 days away: past 24 h
    gw = make_gateway(spec({"days": [far], "start": "00:00", "end": "01:00"}), sim.url)
    client = gw.openai("alice")
    batch = start(client, [line(i) for i in range(3)])
    done = wait_done(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 3
    info = raw_batch(gw, batch.id)["tokengate_deferral"]
    assert info["early"] is True and info["released_at"] is not None
    assert deferred_count(gw, "early_released") == 1
    client.close()


def test_in_the_window_a_batch_runs_at_once(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(spec({"start": "00:00", "end": "00:00"}), sim.url)
    client = gw.openai("alice")
    batch = start(client, [line(i) for i in range(3)])
    assert wait_done(client, batch.id).status == "completed"
    assert "tokengate_deferral" not in raw_batch(gw, batch.id)
    client.close()
