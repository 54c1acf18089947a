"""`Gateway.reload` (SIGHUP) applies every setting that can change live, the dispatchers'
included, names each change that needs a restart, lists the admin overrides that shadow
the files, and warns about keys already expired; `clear_key_limits` ends an override."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from app.limits.bucket import Limits
from app.reload import describe_reload
from app.runtime import Runtime, compile_runtime
from tests.support.inproc import MakeGateway, local_settings

ALICE = {"alias": "alice", "key_sha256": "a" * 64, "requests_per_minute": 100}


def runtime(tmp_path: Path, data: dict[str, Any]) -> Runtime:
    env = {"TAOTOKEN_API_KEY": "sk-upstream"}
    return compile_runtime(local_settings(tmp_path, data), env, no_auth=True)


async def test_a_reload_applies_the_dispatcher_settings_to_the_running_queues(
    make_local_gateway: MakeGateway, tmp_path: Path
) -> None:
    gateway = make_local_gateway({"keys": [ALICE]})
    await gateway.start()
    sched = {
        "batch_size": 4,
        "batch_window_ms": 7,
        "queue_capacity": 33,
        "max_queue_wait_ms": 1500,
        "max_inflight": 5,
    }
    batch = {"share": 0.25}
    notes = gateway.reload(
        runtime(tmp_path, {"keys": [ALICE], "token_scheduler": sched, "batch": batch})
    )
    (domain,) = gateway.domains
    assert domain.dispatcher.settings() == {
        "batch_size": 4,
        "batch_window_ms": 7.0,
        "queue_capacity": 33,
        "max_queue_wait_ms": 1500,
        "max_inflight": 5,
        "batch_share": 0.25,
    }
    assert "applied: token_scheduler.batch_size 16 -> 4" in notes
    assert "applied: token_scheduler.queue_capacity 1024 -> 33" in notes
    assert not any(n.startswith("restart needed") for n in notes), notes


async def test_a_change_that_needs_a_restart_is_named_and_left_out(
    make_local_gateway: MakeGateway, tmp_path: Path
) -> None:
    gateway = make_local_gateway({"keys": [ALICE]})
    data = {
        "keys": [ALICE],
        "logging": {"output": str(tmp_path / "other.log")},
        "token_scheduler": {"timeout_ms": 1234},
        "api_endpoint": "http://elsewhere.example:9000",
    }
    notes = gateway.reload(runtime(tmp_path, data))
    assert f"restart needed: logging.output 'stderr' -> '{tmp_path / 'other.log'}'" in notes
    assert "restart needed: token_scheduler.timeout_ms 30000 -> 1234" in notes
    assert "restart needed: domain 'default' api_base changed" in notes
    assert gateway.domains[0].spec.api_base == "https://taotoken.net/api"  # left as it was
    running = gateway.runtime.settings  # what needs a restart keeps its running value
    assert (running.logging.output, running.token_scheduler.timeout_ms) == ("stderr", 30000)


async def test_billing_teams_and_affinity_are_applied_and_reported_so(
    make_local_gateway: MakeGateway, tmp_path: Path
) -> None:
    gateway = make_local_gateway({"keys": [ALICE]})
    team_key = {**ALICE, "team": "research"}
    data = {
        "keys": [team_key],
        "teams": [{"name": "research", "budgets": [{"period": "day", "max_tokens": 1000}]}],
        "billing": {
            "timezone": "Asia/Shanghai",
            "prices": {"gpt-4o": {"input": 2.5, "output": 10}},
        },
        "affinity": {"enabled": False},
    }
    notes = gateway.reload(runtime(tmp_path, data))
    for path in ("teams", "billing.timezone", "billing.prices", "affinity.enabled"):
        assert any(n.startswith(f"applied: {path}") for n in notes), (path, notes)
    assert not any(n.startswith("restart needed") for n in notes), notes
    assert gateway.pipeline.prices.unpriced({"gpt-4o"}) == []
    assert gateway.calendar.timezone == "Asia/Shanghai"
    assert gateway.pipeline.failover.affinity is False
    assert [t.name for t in gateway.runtime.teams] == ["research"]


def test_a_deprecated_setting_is_reported_as_having_no_effect(tmp_path: Path) -> None:
    new = runtime(tmp_path, {"logging": {"log_prompts": True}})
    assert describe_reload(runtime(tmp_path, {}), new) == [
        "no effect: logging.log_prompts False -> True"
    ]


async def test_an_override_that_shadows_the_files_is_listed_until_cleared(
    make_local_gateway: MakeGateway, tmp_path: Path
) -> None:
    gateway = make_local_gateway({"keys": [ALICE]})
    await gateway.start()  # the database's schema: live limits are kept there
    key = gateway.keys.by_alias["alice"]
    await gateway.live.set_key_limits(key, 5, None)
    edited = {**ALICE, "requests_per_minute": 300}
    notes = gateway.reload(runtime(tmp_path, {"keys": [edited]}))
    shadow = [n for n in notes if "shadow" in n]
    assert shadow == [
        "key 'alice': the live limits set through the admin API (requests_per_minute=5, "
        "tokens_per_minute=120000) shadow the files' (300, 120000); "
        "DELETE /admin/keys/alice/limits returns to the files"
    ]
    key = gateway.keys.by_alias["alice"]
    assert gateway.admission.limits_for(key) == Limits(5, 120000)  # the override still wins
    assert await gateway.live.clear_key_limits(key) is True
    assert gateway.admission.limits_for(key) == Limits(300, 120000)
    assert await gateway.live.clear_key_limits(key) is False
    assert not [n for n in gateway.reload(runtime(tmp_path, {"keys": [edited]})) if "shadow" in n]


def test_a_reload_that_loads_an_expired_key_warns(tmp_path: Path) -> None:
    old = runtime(tmp_path, {"keys": [ALICE]})
    late = {"alias": "late", "key_sha256": "b" * 64, "expires_at": "2026-01-01T00:00:00Z"}
    new = runtime(tmp_path, {"keys": [ALICE, late]})
    notes = describe_reload(old, new, now=datetime(2026, 6, 1, tzinfo=UTC))
    assert notes == [
        "applied: keys (changed)",
        "key 'late' expired at 2026-01-01T00:00:00+00:00: it is refused with 401 expired_api_key",
    ]
    assert describe_reload(old, new, now=datetime(2025, 6, 1, tzinfo=UTC)) == [
        "applied: keys (changed)"
    ]


@pytest.mark.parametrize("path", ["redis.url", "server.drain_delay_sec", "database.path"])
def test_store_and_listener_settings_need_a_restart(tmp_path: Path, path: str) -> None:
    section, field = path.split(".")
    value = {"redis.url": "redis://r:6379/0", "server.drain_delay_sec": 3, "database.path": "x"}
    new = runtime(tmp_path, {section: {field: value[path]}})
    notes = describe_reload(runtime(tmp_path, {}), new)
    assert len(notes) == 1 and notes[0].startswith(f"restart needed: {path}")


def test_with_workers_replaced_every_change_applies(tmp_path: Path) -> None:
    new = runtime(tmp_path, {"logging": {"output": "stdout"}, "token_scheduler": {"batch_size": 2}})
    assert describe_reload(runtime(tmp_path, {}), new, replaced=True) == [
        "applied: token_scheduler.batch_size 16 -> 2",
        "applied: logging.output 'stderr' -> 'stdout'",
    ]
