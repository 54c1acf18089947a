"""Operations: admin API, live limits, SIGHUP reload, multi-worker metrics, request logs."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.procs import Gateway, GatewaySpec, Sim, digest, run_cli
from tests.support.scrape import metric_sum
from tests.support.waiting import wait_until

Make = Callable[..., Gateway]
ADMIN = "admin-ops-key-0123456789"
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 3}


def admin_gateway(make_gateway: Make, sim: Sim, **kw: object) -> Gateway:
    kw.setdefault("settings", {"admin_key": ADMIN})
    spec = GatewaySpec(**kw)  # type: ignore[arg-type]
    return make_gateway(spec, sim.url)


def chat(gw: Gateway, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/v1/chat/completions", json=BODY, headers=headers or gw.headers(), timeout=30
    )


def test_admin_routes_need_the_admin_key(sim: Sim, make_gateway: Make) -> None:
    gw = admin_gateway(make_gateway, sim)
    assert httpx.get(f"{gw.url}/admin/status").status_code == 401
    assert httpx.get(f"{gw.url}/admin/status", headers=gw.headers()).status_code == 401
    status = httpx.get(f"{gw.url}/admin/status", headers=ADMIN_H).json()
    domain = status["domains"]["domain-a"]
    assert domain["state"] == "healthy" and domain["breaker"] == "closed"
    assert {"queue_depth", "inflight", "max_inflight", "retry_budget"} <= set(domain)
    (key,) = status["limits"]["keys"]
    assert key["alias"] == "alice" and key["limits"]["requests_per_minute"] == 600


def test_admin_is_disabled_without_an_admin_key(gateway: Gateway) -> None:
    r = httpx.get(f"{gateway.url}/admin/status", headers={"authorization": "Bearer x"})
    assert r.status_code == 404 and "TOKENGATE_ADMIN_KEY" in r.json()["error"]["message"]


def test_put_limits_applies_live(sim: Sim, make_gateway: Make) -> None:
    gw = admin_gateway(make_gateway, sim)
    r = httpx.put(
        f"{gw.url}/admin/keys/alice/limits", headers=ADMIN_H, json={"requests_per_minute": 2}
    )
    assert r.status_code == 200 and r.json()["requests_per_minute"] == 2
    statuses = [chat(gw).status_code for _ in range(4)]
    assert statuses.count(429) >= 2
    bad = httpx.put(
        f"{gw.url}/admin/keys/alice/limits", headers=ADMIN_H, json={"requests_per_minute": 0}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "requests_per_minute"
    missing = httpx.put(f"{gw.url}/admin/keys/nobody/limits", headers=ADMIN_H, json={})
    assert missing.status_code == 404


def _key_limits(gw: Gateway, alias: str = "alice") -> dict[str, Any]:
    status = httpx.get(f"{gw.url}/admin/status", headers=ADMIN_H).json()
    return next(k for k in status["limits"]["keys"] if k["alias"] == alias)


def test_sighup_names_each_change_and_the_override_that_shadows_the_files(
    sim: Sim, make_gateway: Make
) -> None:
    gw = admin_gateway(make_gateway, sim)
    put = httpx.put(
        f"{gw.url}/admin/keys/alice/limits", headers=ADMIN_H, json={"requests_per_minute": 5}
    )
    assert put.status_code == 200
    config = (gw.workdir / "config.toml").read_text()
    config = config.replace("batch_size = 16", "batch_size = 8")
    config = config.replace("timeout_ms = 30000", "timeout_ms = 20000")
    (gw.workdir / "config.toml").write_text(config)
    settings = json.loads((gw.workdir / "settings.json").read_text())
    settings["keys"][0]["requests_per_minute"] = 50
    late = {"alias": "late", "key_sha256": "c" * 64, "expires_at": "2020-01-01T00:00:00Z"}
    settings["keys"].append(late)
    (gw.workdir / "settings.json").write_text(json.dumps(settings))
    gw.proc.send_signal(signal.SIGHUP)
    _wait_for(lambda: any("configuration reloaded" in x.get("msg", "") for x in gw.log_lines()))
    notes = [x["msg"] for x in gw.log_lines() if x.get("msg", "").startswith("reload: ")]
    assert "reload: applied: token_scheduler.batch_size 16 -> 8" in notes
    assert "reload: restart needed: token_scheduler.timeout_ms 30000 -> 20000" in notes
    assert any("key 'late' expired at 2020-01-01" in n for n in notes)
    assert any(
        "key 'alice': the live limits set through the admin API (requests_per_minute=5" in n
        and "DELETE /admin/keys/alice/limits" in n
        for n in notes
    )
    status = httpx.get(f"{gw.url}/admin/status", headers=ADMIN_H).json()
    assert status["domains"]["domain-a"]["dispatch"]["batch_size"] == 8  # the running queue
    assert _key_limits(gw)["limits"]["requests_per_minute"] == 5  # the override still wins
    cleared = httpx.delete(f"{gw.url}/admin/keys/alice/limits", headers=ADMIN_H)
    assert cleared.status_code == 200 and cleared.json()["cleared"] is True
    assert _key_limits(gw)["limits"]["requests_per_minute"] == 50  # the files' value


def test_a_cleared_override_leaves_every_replica_sharing_the_database(
    sim: Sim, make_gateway: Make, tmp_path: Path
) -> None:
    shared = {"database": {"path": str(tmp_path / "shared.sqlite3")}}
    one, two = (
        admin_gateway(make_gateway, sim, settings={"admin_key": ADMIN, **shared}) for _ in range(2)
    )
    r = httpx.put(
        f"{one.url}/admin/keys/alice/limits", headers=ADMIN_H, json={"requests_per_minute": 7}
    )
    assert r.status_code == 200
    _wait_for(lambda: _key_limits(two)["live_override"] is True)
    assert _key_limits(two)["limits"]["requests_per_minute"] == 7
    assert httpx.delete(f"{one.url}/admin/keys/alice/limits", headers=ADMIN_H).is_success
    _wait_for(lambda: _key_limits(two)["live_override"] is False)
    assert _key_limits(two)["limits"]["requests_per_minute"] == 600


async def _hammer(gw: Gateway, stop: asyncio.Event) -> list[str]:
    """Back-to-back calls through the official SDK (its default retries on connection errors
    absorb a keep-alive connection closed by a retiring worker)."""
    outcomes: list[str] = []
    client = gw.async_openai(max_retries=2)
    while not stop.is_set() or len(outcomes) < 20:
        try:
            await client.chat.completions.create(**BODY)
            outcomes.append("ok")
        except Exception as exc:
            outcomes.append(repr(exc))
    await client.close()
    return outcomes


def _add_key(gw: Gateway, alias: str) -> str:
    path = gw.workdir / "settings.json"
    settings = json.loads(path.read_text())
    secret = f"tg-reloaded-{alias}-0123456789"
    settings["keys"].append({"alias": alias, "key_sha256": digest(secret)})
    path.write_text(json.dumps(settings))
    return secret


def _wait_for(check: Callable[[], bool]) -> None:
    wait_until(check, "the reload to be seen everywhere")


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
async def test_sighup_reload_picks_up_keys_without_dropping_requests(
    sim: Sim, make_gateway: Make, workers: int
) -> None:
    gw = make_gateway(
        GatewaySpec(
            args=["--workers", str(workers)], keys={"alice": {"requests_per_minute": 1_000_000}}
        ),
        sim.url,
    )
    stop = asyncio.Event()
    load = asyncio.ensure_future(_hammer(gw, stop))
    await asyncio.sleep(0.5)
    new_key = _add_key(gw, "bob")
    gw.proc.send_signal(signal.SIGHUP)
    new = {"authorization": f"Bearer {new_key}", "connection": "close"}

    def accepted() -> bool:
        # A fresh connection that a retiring worker accepted and closed unread is a
        # client's retry (the SDK load below counts those); here it is just "not yet".
        try:
            return chat(gw, new).status_code == 200
        except httpx.TransportError:
            return False

    # every worker has the new key once 10 fresh connections in a row accept it
    await asyncio.to_thread(_wait_for, lambda: all(accepted() for _ in range(10)))
    stop.set()
    outcomes = await load
    assert len(outcomes) > 10 and set(outcomes) == {"ok"}  # no request failed meanwhile
    assert chat(gw).status_code == 200  # the old key still works


def test_invalid_reload_is_refused_and_the_old_config_stays(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(), sim.url)
    (gw.workdir / "settings.json").write_text('{"rate_limit": {"requests_per_minute": -1}}')
    gw.proc.send_signal(signal.SIGHUP)
    _wait_for(lambda: any("reload refused" in line.get("msg", "") for line in gw.log_lines()))
    assert chat(gw).status_code == 200
    refused = next(x for x in gw.log_lines() if "reload refused" in x.get("msg", ""))
    assert "rate_limit.requests_per_minute" in refused["msg"]


def _requests_total(metrics: str) -> float:
    return metric_sum(metrics, "tokengate_requests_total")


@pytest.mark.slow
async def test_two_workers_metrics_sum_both(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(args=["--workers", "2"]), sim.url)

    def started() -> set[object]:
        return {x.get("pid") for x in gw.log_lines() if "per-key limits" in x.get("msg", "")}

    await asyncio.to_thread(_wait_for, lambda: len(started()) == 2)  # both workers serve

    def served_by() -> set[object]:
        return {x.get("pid") for x in gw.log_lines() if x.get("logger") == "tokengate.access"}

    limits = httpx.Limits(max_keepalive_connections=0)  # a new connection per request
    sent = 0
    async with httpx.AsyncClient(timeout=30, limits=limits) as c:
        # Concurrent connections spread over both workers' accept loops; on a loaded
        # machine one worker may take a whole round, so rounds go on until both served.
        for _ in range(40):
            await asyncio.gather(
                *(
                    c.post(f"{gw.url}/v1/chat/completions", json=BODY, headers=gw.headers())
                    for _ in range(8)
                )
            )
            sent += 8
            if sent >= 40 and len(served_by()) == 2:
                break
    assert len(served_by()) == 2, "both workers should have served requests"
    scrapes = [
        _requests_total(httpx.get(f"{gw.url}/metrics", headers={"connection": "close"}).text)
        for _ in range(6)
    ]
    assert scrapes == [float(sent)] * 6, scrapes  # whichever worker answers sums both
    starts = [x["msg"] for x in gw.log_lines() if "per-key limits" in x.get("msg", "")]
    assert starts and all("split per worker" in m for m in starts)


def test_one_json_log_line_per_request_with_its_story(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(), sim.url)
    r = chat(gw)
    (line,) = gw.access()
    assert line["request_id"] == r.headers["x-request-id"]
    assert (line["key"], line["domain"], line["model"], line["status"]) == (
        "alice",
        "domain-a",
        "gpt-4o",
        200,
    )
    assert line["prompt_tokens"] == 4 and line["completion_tokens"] == 3
    assert line["queue_ms"] >= 0 and line["upstream_ms"] > 0
    assert [a["outcome"] for a in line["attempts"]] == ["ok"]
    text = gw.log_path.read_text()
    assert "ping" not in text  # no prompt text in logs by default
    assert gw.key not in text


def test_unwritable_log_directory_is_a_startup_error(tmp_path: Path) -> None:
    proc = run_cli(
        "serve",
        env={
            "PATH": "/usr/bin:/bin",
            "TAOTOKEN_API_KEY": "sk-x",
            "TOKENGATE_KEYS": json.dumps([{"alias": "a", "key_sha256": "a" * 64}]),
            "TOKENGATE_LOGGING__OUTPUT": str(tmp_path / "missing" / "gw.log"),
        },
    )
    assert proc.returncode == 2
    assert "logging.output" in proc.stderr and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
