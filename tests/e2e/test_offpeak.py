"""Billing windows over real sockets: a request priced at its window's price, the window
in the access line and in `/admin/usage?group_by=window`, and `tokengate check` naming
the window in force and the next change.

The windows are whole days in UTC: every day but one is `offpeak`, that one (three days
ahead) is `peak`, so the test never runs across a change whatever the hour."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx

from tests.support.procs import Gateway, GatewaySpec, Sim, free_port, run_cli

Make = Callable[..., Gateway]
ADMIN = "admin-test-key-0123456789"
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
PROMPT = [{"role": "user", "content": "Price this line by the hour, please."}]
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
BASE = {"input": "2.50", "output": "10.00"}
OFFPEAK = {"input": "1.25", "output": "5.00"}


def windowed_spec() -> tuple[GatewaySpec, datetime]:
    peak_day = datetime.now(UTC).date() + timedelta(days=3)
    peak = DAYS[peak_day.weekday()]
    windows = {
        "offpeak": {"days": [d for d in DAYS if d != peak], "start": "00:00", "end": "00:00"},
        "peak": {"days": [peak], "start": "00:00", "end": "00:00"},
    }
    prices = {"gpt-4o": {**BASE, "windows": {"offpeak": OFFPEAK, "peak": {"output": "20"}}}}
    settings: dict[str, Any] = {
        "admin_key": ADMIN,
        "billing": {"currency": "USD", "timezone": "UTC", "prices": prices, "windows": windows},
    }
    starts = datetime(peak_day.year, peak_day.month, peak_day.day, tzinfo=UTC)
    return GatewaySpec(keys={"alice": {}}, settings=settings), starts


def hand_cost(usage: dict[str, Any], price: dict[str, str]) -> Decimal:
    million: Decimal = usage["prompt_tokens"] * Decimal(price["input"]) + usage[
        "completion_tokens"
    ] * Decimal(price["output"])
    return million / Decimal(10**6)


def test_requests_are_priced_and_recorded_in_the_window_in_force(
    sim: Sim, make_gateway: Make
) -> None:
    spec, _ = windowed_spec()
    gw = make_gateway(spec, sim.url)
    client = gw.openai()
    expected = Decimal(0)
    for max_tokens in (6, 11):
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=PROMPT, max_tokens=max_tokens
        )
        cost = hand_cost(raw.parse().usage.model_dump(), OFFPEAK)
        assert raw.headers["x-tokengate-cost"] == f"{cost.normalize():f} USD"
        expected += cost
    line = gw.access()[-1]
    assert line["window"] == "offpeak"
    r = httpx.get(
        f"{gw.url}/admin/usage", headers=ADMIN_H, params={"group_by": "window,model"}, timeout=10
    )
    r.raise_for_status()
    (row,) = r.json()["data"]
    assert (row["window"], row["model"], row["requests"]) == ("offpeak", "gpt-4o", 2)
    assert Decimal(str(row["cost"])) == expected
    bad = httpx.get(
        f"{gw.url}/admin/usage", headers=ADMIN_H, params={"group_by": "weather"}, timeout=10
    )
    assert bad.status_code == 400 and "window" in bad.json()["error"]["message"]


def test_check_names_the_window_in_force_and_the_next_change(sim: Sim, make_gateway: Make) -> None:
    spec, peak_starts = windowed_spec()
    gw = make_gateway(spec, sim.url)
    env = {"PATH": "/usr/bin:/bin", "TAOTOKEN_API_KEY": sim.api_key}
    done = run_cli("check", *gw.args, "--port", str(free_port()), env=env)
    assert "billing window now: offpeak (UTC)" in done.stdout, done.stdout
    assert f"next window change: {peak_starts.isoformat()} -> peak" in done.stdout


def test_a_configuration_with_overlapping_windows_does_not_start(
    sim: Sim, make_gateway: Make
) -> None:
    spec, _ = windowed_spec()
    spec.settings["billing"]["windows"]["late"] = {"start": "23:00", "end": "01:00"}
    env = {"PATH": "/usr/bin:/bin", "TAOTOKEN_API_KEY": sim.api_key}
    gw = make_gateway(spec, sim.url, wait=False)
    assert gw.proc.wait(60) == 2
    done = run_cli("check", *gw.args, env=env)
    assert done.returncode == 2
    assert "overlap" in done.stdout + done.stderr
    assert json.loads((gw.workdir / "settings.json").read_text())["billing"]["windows"]
