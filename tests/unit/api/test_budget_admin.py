"""`/admin/usage` reports (groups, local periods, CSV, totals) and `/admin/budgets`."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from pathlib import Path
from typing import Any

from app.billing.ledger import UsageEntry
from tests.support.inproc import ADMIN_KEY, MakeClient, gateway_of

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
SETTINGS: dict[str, Any] = {
    "admin_key": ADMIN_KEY,
    "billing": {"currency": "CNY", "timezone": "Asia/Shanghai"},
    "keys": [
        {
            "alias": "alice",
            "key_sha256": "a" * 64,
            "team": "ml",
            "budgets": [{"period": "month", "max_cost": 100, "max_tokens": 1_000_000}],
        },
        {"alias": "bob", "key_sha256": "b" * 64, "team": "ml"},
    ],
    "teams": [{"name": "ml", "budgets": [{"period": "day", "max_cost": 5}]}],
}
CNY = 10**9


async def test_usage_groups_by_team_and_model_per_day_with_totals(
    make_client: MakeClient,
) -> None:
    client = await make_client(SETTINGS)
    ledger = gateway_of(client).ledger
    ledger.add(UsageEntry("alice", "m-1", 10, 5, team="ml", cost_nanos=CNY))
    ledger.add(UsageEntry("bob", "m-1", 20, 5, team="ml", cost_nanos=2 * CNY, estimated=True))
    ledger.add(UsageEntry("bob", "m-2", 1, 1, team="ml", cost_nanos=None))
    r = await client.get(
        "/admin/usage", headers=ADMIN, params={"group_by": "team,model", "granularity": "day"}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["currency"], body["timezone"], body["group_by"]) == (
        "CNY",
        "Asia/Shanghai",
        ["team", "model"],
    )
    rows = {(row["team"], row["model"]): row for row in body["data"]}
    assert rows["ml", "m-1"]["requests"] == 2 and rows["ml", "m-1"]["cost"] == 3.0
    assert rows["ml", "m-1"]["estimated_share"] == 0.5
    assert rows["ml", "m-2"]["cost"] is None  # unknown, not 0
    assert rows["ml", "m-1"]["period"].endswith("T00:00:00+08:00")
    assert body["totals"]["requests"] == 3 and body["totals"]["cost"] == 3.0
    assert body["totals"]["unpriced_requests"] == 1


async def test_usage_as_csv_and_a_bad_group_is_400(make_client: MakeClient) -> None:
    client = await make_client(SETTINGS)
    gateway_of(client).ledger.add(UsageEntry("alice", "m-1", 10, 5, team="ml", cost_nanos=7))
    r = await client.get(
        "/admin/usage", headers={**ADMIN, "accept": "text/csv"}, params={"group_by": "key"}
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    lines = list(csv.DictReader(io.StringIO(r.text)))
    assert [(ln["key"], ln["cost"], ln["currency"]) for ln in lines] == [
        ("alice", "0.000000007", "CNY"),
        ("total", "0.000000007", "CNY"),
    ]
    bad = await client.get("/admin/usage", headers=ADMIN, params={"group_by": "colour"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "group_by"


async def test_budgets_show_spend_limits_and_reset_times(make_client: MakeClient) -> None:
    client = await make_client(SETTINGS)
    gateway_of(client).ledger.add(
        UsageEntry("alice", "m-1", 300, 200, team="ml", cost_nanos=CNY // 4)
    )
    r = await client.get("/admin/budgets", headers=ADMIN)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["currency"], body["timezone"]) == ("CNY", "Asia/Shanghai")
    owners = {(o["scope"], o["name"]): o for o in body["data"]}
    assert set(owners) == {("key", "alice"), ("key", "bob"), ("team", "ml")}
    alice = owners["key", "alice"]
    assert alice["team"] == "ml" and alice["spend"]["month"]["tokens"] == 500
    cost, tokens = alice["budgets"]
    assert (cost["name"], cost["limit"], cost["spent"], cost["remaining"]) == (
        "month_cost",
        100.0,
        0.25,
        99.75,
    )
    assert cost["used_ratio"] == 0.0025 and cost["resets_at"].endswith("T00:00:00+08:00")
    assert (tokens["name"], tokens["spent"]) == ("month_tokens", 500)
    (day,) = owners["team", "ml"]["budgets"]
    assert day["spent"] == 0.25 and day["limit"] == 5.0
    assert owners["key", "bob"]["budgets"] == []


async def test_a_raised_budget_is_durable_and_seen_by_another_replica_within_a_second(
    make_client: MakeClient, tmp_path: Path
) -> None:
    shared = {**SETTINGS, "database": {"path": str(tmp_path / "shared.sqlite3")}}
    one, two = await make_client(shared), await make_client(shared)
    until = int(time.time()) + 3600
    r = await one.put(
        "/admin/budgets/team/ml",
        headers=ADMIN,
        json={"period": "day", "max_cost": "50", "until": until},
    )
    assert r.status_code == 200, r.text
    assert (r.json()["limit"], r.json()["configured_limit"]) == (50.0, 5.0)
    assert r.json()["override"]["limit"] == 50.0

    async def day_limit_on_two() -> float:
        body = (await two.get("/admin/budgets", headers=ADMIN)).json()
        (ml,) = [o for o in body["data"] if o["name"] == "ml"]
        return float(ml["budgets"][0]["limit"])

    deadline = time.monotonic() + 5
    while await day_limit_on_two() != 50.0:
        assert time.monotonic() < deadline, "the other replica never read the raised budget"
        await asyncio.sleep(0.1)
    ended = await two.delete("/admin/budgets/team/ml", headers=ADMIN, params={"period": "day"})
    assert ended.json() == {"scope": "team", "name": "ml", "ended": 1}
    assert await day_limit_on_two() == 5.0


async def test_raising_needs_a_known_owner_one_limit_and_a_future_end(
    make_client: MakeClient,
) -> None:
    client = await make_client(SETTINGS)
    future = int(time.time()) + 60
    unknown = await client.put(
        "/admin/budgets/key/zed",
        headers=ADMIN,
        json={"period": "day", "max_cost": 1, "until": future},
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "name"
    both = await client.put(
        "/admin/budgets/key/alice",
        headers=ADMIN,
        json={"period": "day", "max_cost": 1, "max_tokens": 5, "until": future},
    )
    assert both.status_code == 400
    past = await client.put(
        "/admin/budgets/key/alice",
        headers=ADMIN,
        json={"period": "day", "max_tokens": 5, "until": "2020-01-01T00:00:00Z"},
    )
    assert past.status_code == 400 and past.json()["error"]["param"] == "until"


async def test_the_status_page_shows_each_keys_fullest_budget_and_warns_near_it(
    make_client: MakeClient,
) -> None:
    client = await make_client(SETTINGS)
    gw = gateway_of(client)
    gw.ledger.add(UsageEntry("bob", "m-1", 10, 10, team="ml", cost_nanos=CNY * 9 // 2))
    await gw.ledger.flush()
    await gw.spend.refresh(gw.ledger, gw.spend_book)
    gw.keys.enabled = True  # the page lists the configured keys (make_client runs --no-auth)
    snap = (await client.get("/admin/ui/snapshot", headers=ADMIN)).json()
    keys = {k["alias"]: k for k in snap["keys"]}
    # alice's own month budget is barely used; her team's day budget is 90 % spent
    assert keys["alice"]["budget"]["period"] == "day, team ml cost"
    assert (keys["alice"]["budget"]["used"], keys["alice"]["budget"]["limit"]) == (4.5, 5.0)
    assert keys["bob"]["budget"]["used"] == 4.5
    assert {"level": "warning", "text": "team ml: 90% of its day cost budget spent"} in (
        snap["attention"]
    )


async def test_a_reload_applies_new_prices_budgets_and_time_zone(
    make_client: MakeClient, tmp_path: Path
) -> None:
    from app.runtime import compile_runtime
    from tests.support.inproc import local_settings

    client = await make_client(SETTINGS)
    gw = gateway_of(client)
    changed = {
        **SETTINGS,
        "billing": {
            "currency": "CNY",
            "timezone": "UTC",
            "prices": {"m-1": {"input": 1, "output": 1}},
        },
        "teams": [{"name": "ml", "budgets": [{"period": "week", "max_tokens": 10}]}],
        "database": {"path": str(tmp_path / "reloaded.sqlite3")},
    }
    runtime = compile_runtime(local_settings(tmp_path, changed), {"TAOTOKEN_API_KEY": "k"})
    notes = gw.reload(runtime)
    assert any("billing.timezone changed" in n for n in notes)
    assert gw.calendar.timezone == "UTC" and gw.ledger.calendar is gw.calendar
    assert gw.pipeline.prices.price("m-1") is not None
    alice = next(k for k in gw.runtime.keys if k.alias == "alice")
    assert [b.name for b in gw.spend.budgets_of(alice, time.time())] == [
        "month_cost",
        "month_tokens",
        "week_tokens",
    ]


async def test_a_budget_raise_sent_as_curl_sends_it_without_a_content_type_is_read(
    make_client: MakeClient,
) -> None:
    client = await make_client(SETTINGS)
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    body = f'{{"period": "day", "max_cost": 9, "until": "{until}"}}'.encode()
    r = await client.put("/admin/budgets/team/ml", headers=ADMIN, content=body)
    assert r.status_code == 200, r.text
    assert r.json()["limit"] == 9
    form = await client.put(
        "/admin/budgets/team/ml",
        headers=ADMIN | {"content-type": "application/x-www-form-urlencoded"},
        content=body,
    )
    assert form.status_code == 415 and form.json()["error"]["code"] == "unsupported_media_type"
