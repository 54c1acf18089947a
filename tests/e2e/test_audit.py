"""The audit trail over real sockets: admin API changes and a SIGHUP reload written with
who, what, before and after; a key's expiry once; read back by `GET /admin/audit`,
`tokengate audit` and the status; the route refused without the admin key."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.support.procs import Gateway, GatewaySpec, Sim, digest, run_cli

Make = Callable[..., Gateway]
ADMIN = "admin-test-key-0123456789"
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}


def audit(gw: Gateway, **params: Any) -> list[dict[str, Any]]:
    r = httpx.get(f"{gw.url}/admin/audit", headers=ADMIN_H, params=params, timeout=10)
    r.raise_for_status()
    return list(r.json()["data"])


def wait_for(check: Callable[[], Any], seconds: float = 30.0) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_admin_changes_and_a_reload_are_written_with_who_what_before_and_after(
    sim: Sim, make_gateway: Make
) -> None:
    spec = GatewaySpec(
        keys={"alice": {"requests_per_minute": 60}, "bob": {}},
        settings={
            "admin_key": ADMIN,
            "billing": {"prices": {"gpt-4o": {"input": "2.5", "output": "10"}}},
        },
    )
    gw = make_gateway(spec, sim.url)
    r = httpx.put(
        f"{gw.url}/admin/keys/alice/limits",
        headers=ADMIN_H,
        json={"requests_per_minute": 120},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    until = "2099-01-01T00:00:00Z"
    r = httpx.put(
        f"{gw.url}/admin/budgets/key/bob",
        headers=ADMIN_H,
        json={"period": "day", "max_tokens": 5000, "until": until},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    (limits,) = audit(gw, action="key_limits.set")
    assert (limits["actor"], limits["target"]) == ("admin", "key:alice")
    assert limits["before"]["requests_per_minute"] == 60
    assert limits["after"]["requests_per_minute"] == 120
    (budget,) = audit(gw, action="budget_override.")
    assert budget["target"] == "key:bob:day_tokens"
    assert budget["before"] is None and budget["after"]["limit"] == 5000

    # a reload: a key removed, one added with an expiry already past, a price changed
    path = gw.workdir / "settings.json"
    settings = json.loads(path.read_text())
    settings["keys"] = [k for k in settings["keys"] if k["alias"] != "bob"] + [
        {"alias": "carol", "key_sha256": digest("carol-secret"), "expires_at": "2020-01-01"}
    ]
    settings["billing"]["prices"]["gpt-4o"]["input"] = "1.25"
    path.write_text(json.dumps(settings))
    gw.proc.send_signal(signal.SIGHUP)
    reload = wait_for(lambda: audit(gw, actor="reload"))
    found = {(r["action"], r["target"]): r for r in reload}
    assert ("key.removed", "key:bob") in found
    assert found[("key.added", "key:carol")]["after"]["expires_at"].startswith("2020-01-01")
    price = found[("price.changed", "model:gpt-4o")]
    assert (price["before"]["input"], price["after"]["input"]) == ("2.5", "1.25")
    assert "carol-secret" not in json.dumps(reload) and digest("carol-secret") not in str(reload)
    expired = wait_for(lambda: audit(gw, actor="expiry"))
    assert [(r["action"], r["target"]) for r in expired] == [("key.expired", "key:carol")]

    # the CLI and the status page read the same trail
    env = {"TOKENGATE_ADMIN_KEY": ADMIN, "PATH": "/usr/bin:/bin"}
    done = run_cli("audit", "--target", gw.url, "--actor", "reload", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "price.changed" in done.stdout and "model:gpt-4o" in done.stdout
    assert "key_limits.set" not in done.stdout
    shown = run_cli("audit", "--target", gw.url, "--on", "key:alice", "--format", "json", env=env)
    assert [r["action"] for r in json.loads(shown.stdout)["data"]] == ["key_limits.set"]
    status = wait_for(
        lambda: httpx.get(f"{gw.url}/admin/status", headers=ADMIN_H, timeout=10).json()["audit"]
    )
    assert {"key.expired", "price.changed"} <= {r["action"] for r in status}


def test_the_audit_route_is_refused_without_the_admin_key(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(keys={"alice": {}}, settings={"admin_key": ADMIN}), sim.url)
    url = f"{gw.url}/admin/audit"
    tenant = gw.headers("alice")
    for headers in ({}, {"authorization": ""}, {"authorization": "Bearer"}, tenant):
        r = httpx.get(url, headers=headers, timeout=10)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["type"] == "authentication_error"
    bad = httpx.get(url, headers=ADMIN_H, params={"limit": 0}, timeout=10)
    assert bad.status_code in (400, 422)
    bad = httpx.get(url, headers=ADMIN_H, params={"since": "yesterday-ish"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"
    plain = make_gateway(GatewaySpec(keys={"alice": {}}), sim.url)
    off = httpx.get(f"{plain.url}/admin/audit", headers=ADMIN_H, timeout=10)
    assert off.status_code == 404  # no admin key configured: the admin API is not there
