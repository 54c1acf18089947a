"""SIGHUP on a running `tokengate serve`: every setting changed at once.

The report names every change by the verdict `app.config.effects` declares (applied,
restart needed, no effect), and the live ones are seen working over the sockets: the
new key, admin key and metrics token are accepted, the limits, routes, aliases, body
limit, dispatcher settings and log level are the new ones, and a rotated upstream key
reaches the upstream.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import Any

import httpx

from app.config.effects import EFFECTS, Effect
from tests.support.changed_settings import METRICS_TOKEN, NEW, NEW_ADMIN, SEPARATE, nest
from tests.support.procs import Gateway, GatewaySpec, Sim, digest
from tests.support.waiting import wait_until

Make = Callable[..., Gateway]
ADMIN = "admin-reload-key-0123456789"
BOB = "tg-reload-bob-0123456789abcdef"
SECRET_ENV = {"TOKENGATE_ALERTS_SECRET": "s" * 32, "RELOAD_ALERTS_SECRET": "t" * 32}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _reload(
    gw: Gateway, edit: dict[str, Any], *, toml: str | None = None, quiet: bool = False
) -> list[str]:
    """Edit, SIGHUP, and the notes logged (`quiet`: the new level hides the `applied`
    ones, so only the first line is waited for)."""
    path = gw.workdir / "settings.json"
    path.write_text(json.dumps(_merge(json.loads(path.read_text()), edit)))
    if toml is not None:
        (gw.workdir / "config.toml").write_text(toml)
    seen = len(gw.log_lines())
    gw.proc.send_signal(signal.SIGHUP)

    def done() -> bool:  # "configuration reloaded: N change(s)", then the N notes
        msgs = [x.get("msg", "") for x in gw.log_lines()[seen:]]
        assert not [m for m in msgs if "reload refused" in m], msgs
        head = [m for m in msgs if m.startswith("configuration reloaded: ")]
        return bool(head) and (quiet or len(notes(msgs)) >= int(head[0].split()[2]))

    def notes(msgs: list[str]) -> list[str]:
        return [m.removeprefix("reload: ") for m in msgs if m.startswith("reload: ")]

    wait_until(done, "the reload to be logged")
    return notes([x.get("msg", "") for x in gw.log_lines()[seen:]])


def _chat(gw: Gateway, key: str, **body: Any) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 3, **body}
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_every_setting_changed_by_sighup_is_applied_or_named(sim: Sim, make_gateway: Make) -> None:
    assert set(NEW) | SEPARATE == set(EFFECTS), "a setting this test does not change"
    gw = make_gateway(GatewaySpec(settings={"admin_key": ADMIN}, env=SECRET_ENV), sim.url)
    alice = gw.keys["alice"]
    assert _chat(gw, alice, model="gpt-4o").status_code == 200
    edit = nest({k: v for k, v in NEW.items() if v is not None})
    edit["keys"] = [
        {"alias": "alice", "key_sha256": digest(alice)},
        {
            "alias": "bob",
            "key_sha256": digest(BOB),
            "requests_per_minute": 1000,
            "team": "research",
        },
    ]
    edit["database"]["path"] = str(gw.workdir / "elsewhere.sqlite3")
    toml = (gw.workdir / "config.toml").read_text()
    notes = _reload(gw, edit, toml=toml.replace("[scale_up]", "[scale_up]\nmax_inflight = 9"))

    # The report: each setting by its declared verdict, each exactly once.
    verdicts = {Effect.LIVE: "applied", Effect.RESTART: "restart needed", Effect.INERT: "no effect"}

    def said(path: str) -> int:
        return len([n for n in notes if n.startswith(f"{verdicts[EFFECTS[path]]}: {path} ")])

    assert [p for p in NEW if said(p) != 1] == [], notes
    assert "applied: scale_up.max_inflight None -> 9" in notes

    # Live: seen working.
    bob = {"authorization": f"Bearer {BOB}"}
    assert _chat(gw, BOB, model="gpt-4o").status_code == 200  # keys
    status = httpx.get(f"{gw.url}/admin/status", headers={"authorization": f"Bearer {ADMIN}"})
    assert status.status_code == 401  # admin_key: the old one is refused ...
    admin = {"authorization": f"Bearer {NEW_ADMIN}"}
    body = httpx.get(f"{gw.url}/admin/status", headers=admin).json()  # ... the new one works
    assert body["cluster"] == "supernode-reloaded"  # cluster.name
    assert body["routes"]["default"] == "gpt-4o"  # model_route
    assert body["routes"]["fallback"] == ["claude-sonnet"]
    assert body["routes"]["aliases"] == {"tiny": "gpt-4o"}
    assert body["domains"]["domain-a"]["dispatch"] == {
        "batch_size": 8,
        "batch_window_ms": 3.0,
        "queue_capacity": 77,
        "max_queue_wait_ms": 12000,
        "max_inflight": 9,  # the domain's own, from [scale_up]
        "batch_share": 0.25,
    }
    limits = {k["alias"]: k["limits"] for k in body["limits"]["keys"]}
    assert limits["alice"]["tokens_per_minute"] == 90000  # rate_limit applies to alice
    assert httpx.get(f"{gw.url}/metrics").status_code == 401  # metrics.token
    scrape = httpx.get(f"{gw.url}/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"})
    assert scrape.status_code == 200
    aliased = _chat(gw, BOB, model="tiny")  # model_aliases
    assert aliased.status_code == 200 and aliased.json()["model"] == "gpt-4o"
    big = _chat(gw, BOB, model="gpt-4o", messages=[{"role": "user", "content": "x" * 5000}])
    assert big.status_code == 413  # server.max_body_bytes
    statuses = [_chat(gw, alice, model="gpt-4o").status_code for _ in range(4)]
    assert 429 in statuses  # rate_limit.requests_per_minute = 2
    assert httpx.get(f"{gw.url}/v1/models", headers=bob).status_code == 200

    # Restart-only: the running process keeps its value (the database it writes, no Redis).
    assert not (gw.workdir / "elsewhere.sqlite3").exists()

    # logging.level: the access lines of requests stop at `warning`.
    tls = dict.fromkeys(("tls_ca_file", "tls_cert_file", "tls_key_file"))  # rediss:// only
    redis = {"url": None, "cluster": False, "sentinels": ["127.0.0.1:2"], **tls}
    _reload(gw, {"logging": {"level": "warning"}, "redis": redis}, quiet=True)
    wait_until(
        lambda: any("restart needed: redis.sentinels" in x.get("msg", "") for x in gw.log_lines()),
        "the warning naming redis.sentinels",
    )
    before = len(gw.log_lines())
    assert _chat(gw, BOB, model="gpt-4o").status_code == 200
    _reload(gw, {}, quiet=True)  # a warning line: the request's would be before it
    levels = {x["level"] for x in gw.log_lines()[before:]}
    assert levels == {"warning"}  # the reload's lines, and no access line

    # api_key: the rotated upstream key is what the upstream now receives (and refuses).
    _reload(gw, {"api_key": "sk-rotated-not-the-sims-key"}, quiet=True)
    assert _chat(gw, BOB, model="gpt-4o").status_code >= 400


def test_a_re_pointed_domain_is_named_and_keeps_its_upstream(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(), sim.url)
    notes = _reload(gw, {"api_endpoint": "http://127.0.0.1:1", "logging": {"output": "stdout"}})
    assert "restart needed: domain 'domain-a' api_base changed" in notes
    assert any(n.startswith("restart needed: logging.output ") for n in notes)
    assert _chat(gw, gw.key, model="gpt-4o").status_code == 200  # still the sim
