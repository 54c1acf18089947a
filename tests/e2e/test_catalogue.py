"""Model catalogue and client reach: aliases, route validation, Anthropic Messages,
key expiry and rotation (gateway keys and upstream keys)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.procs import (
    UPSTREAM_KEY,
    Gateway,
    GatewaySpec,
    Sim,
    digest,
    free_port,
    run_cli,
)
from tests.support.waiting import eventually, wait_until

Make = Callable[..., Gateway]
PING: Any = [{"role": "user", "content": "ping"}]  # for the OpenAI and Anthropic SDKs
VERSIONED = ("--models", "claude-sonnet-4-6,gpt-4o-2024-08-06")
ALIASES = {"model_aliases": {"claude-sonnet": "claude-sonnet-4-6", "gpt-4o": "gpt-4o-2024-08-06"}}


def _wait(check: Callable[[], bool]) -> None:
    wait_until(check, "the reload to take effect")


def test_aliases_resolve_to_versioned_ids(make_sim: Callable[..., Sim], make_gateway: Make) -> None:
    sim = make_sim(*VERSIONED)
    gw = make_gateway(GatewaySpec(settings=ALIASES), sim.url)
    answer = gw.openai().chat.completions.create(model="claude-sonnet", messages=PING, max_tokens=2)
    assert answer.model == "claude-sonnet-4-6"  # what the upstream returned
    assert sim.records("/v1/chat/completions")[0]["body"]["model"] == "claude-sonnet-4-6"
    ids = {m.id for m in gw.openai().models.list()}
    assert {"claude-sonnet", "gpt-4o", "claude-sonnet-4-6", "gpt-4o-2024-08-06"} <= ids
    assert httpx.get(f"{gw.url}/health/ready").json()["routes"]["unresolved"] == []


def test_a_route_the_upstream_does_not_list_is_flagged(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim(*VERSIONED)
    gw = make_gateway(GatewaySpec(), sim.url)  # the seed routes claude-sonnet / gpt-4o
    ready = httpx.get(f"{gw.url}/health/ready").json()
    assert ready["routes"]["unresolved"] == ["claude-sonnet", "gpt-4o"]
    assert 'tokengate_route_unresolved{model="claude-sonnet"} 1.0' in gw.metrics()
    assert any("listed by no domain" in x.get("msg", "") for x in gw.log_lines())


def test_check_fails_with_the_fix_when_a_route_target_is_missing(
    make_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = make_sim(*VERSIONED)
    env = {
        "PATH": "/usr/bin:/bin",
        "TAOTOKEN_API_KEY": UPSTREAM_KEY,
        "TOKENGATE_API_ENDPOINT": sim.url,
        # what `serve` needs on this host (check verifies it too): a log, a key, state files
        "TOKENGATE_LOGGING__OUTPUT": "stderr",
        "TOKENGATE_KEYS": json.dumps([{"alias": "a", "key_sha256": digest("tg-catalogue")}]),
        "TOKENGATE_DATABASE__PATH": str(tmp_path / "tokengate.sqlite3"),
    }
    port = str(free_port())
    proc = run_cli("check", "--port", port, env=env)
    assert proc.returncode == 1
    assert "does not list: claude-sonnet, gpt-4o" in proc.stdout
    assert "model_aliases" in proc.stdout
    env["TOKENGATE_MODEL_ALIASES"] = json.dumps(ALIASES["model_aliases"])
    ok = run_cli("check", "--port", port, env=env)
    assert ok.returncode == 0, ok.stdout
    assert "16/16 ok" in ok.stdout


def test_allowed_models_are_checked_on_the_alias_and_the_target(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim(*VERSIONED)
    gw = make_gateway(
        GatewaySpec(
            settings=ALIASES,
            keys={
                "by-alias": {"models": ["claude-sonnet"]},
                "by-id": {"models": ["claude-sonnet-4-6"]},
                "other": {"models": ["gpt-4o"]},
            },
        ),
        sim.url,
    )
    for alias in ("by-alias", "by-id"):
        gw.openai(alias).chat.completions.create(model="claude-sonnet", messages=PING)
    import openai

    with pytest.raises(openai.PermissionDeniedError):
        gw.openai("other").chat.completions.create(model="claude-sonnet", messages=PING)


def _anthropic_gateway(make_sim: Callable[..., Sim], make_gateway: Make) -> tuple[Gateway, Sim]:
    sim = make_sim("--models", "claude-sonnet-4-6")
    gw = make_gateway(
        GatewaySpec(
            toml={
                "scale_up": [
                    {
                        "domain": "claude",
                        "api_base": sim.url,
                        "api_key_env": "TAOTOKEN_API_KEY",
                        "api_style": "anthropic",
                    }
                ]
            },
            settings={"model_route": {"default": "claude-sonnet-4-6", "fallback": None}},
        )
    )
    return gw, sim


def test_anthropic_sdk_through_the_gateway(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    gw, sim = _anthropic_gateway(make_sim, make_gateway)
    client = gw.keep(anthropic.Anthropic(base_url=gw.url, api_key=gw.key, max_retries=0))
    message = client.messages.create(model="claude-sonnet-4-6", max_tokens=5, messages=PING)
    assert isinstance(message.content[0], anthropic.types.TextBlock)
    assert message.content[0].text and message.usage.output_tokens == 5
    streamed: list[str] = []
    with client.messages.stream(model="claude-sonnet-4-6", max_tokens=4, messages=PING) as s:
        streamed.extend(s.text_stream)
        final = s.get_final_message()
    assert isinstance(final.content[0], anthropic.types.TextBlock)
    assert "".join(streamed) == final.content[0].text and final.usage.output_tokens == 4
    first, _ = sim.records("/v1/messages")
    assert first["headers"]["x-api-key"] == UPSTREAM_KEY and "authorization" not in first["headers"]
    assert gw.key not in json.dumps(first)
    metrics = gw.metrics()
    assert (
        'tokengate_tokens_total{key="alice",kind="completion",model="claude-sonnet-4-6"} 9.0'
        in metrics
    )
    with pytest.raises(anthropic.AuthenticationError):
        gw.keep(
            anthropic.Anthropic(base_url=gw.url, api_key="tg-wrong", max_retries=0)
        ).messages.create(model="claude-sonnet-4-6", max_tokens=5, messages=PING)


def test_expired_key_gets_401_saying_so(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(
        GatewaySpec(
            keys={
                "old": {"expires_at": "2020-01-01T00:00:00Z"},
                "current": {"expires_at": "2999-01-01T00:00:00"},
            }
        ),
        sim.url,
    )
    r = httpx.get(f"{gw.url}/v1/models", headers=gw.headers("old"))
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "expired_api_key"
    assert httpx.get(f"{gw.url}/v1/models", headers=gw.headers("current")).status_code == 200


def test_gateway_key_rotation_old_and_new_then_only_new(sim: Sim, make_gateway: Make) -> None:
    old, new = "tg-rotate-old-0123456789", "tg-rotate-new-0123456789"
    gw = make_gateway(
        GatewaySpec(
            settings={"keys": [{"alias": "team", "key_sha256": [digest(old), digest(new)]}]}
        ),
        sim.url,
    )
    models = f"{gw.url}/v1/models"
    for key in (old, new):
        assert httpx.get(models, headers={"authorization": f"Bearer {key}"}).status_code == 200
    path = gw.workdir / "settings.json"
    settings = json.loads(path.read_text())
    settings["keys"] = [{"alias": "team", "key_sha256": digest(new)}]
    path.write_text(json.dumps(settings))
    gw.proc.send_signal(signal.SIGHUP)
    _wait(lambda: httpx.get(models, headers={"authorization": f"Bearer {old}"}).status_code == 401)
    assert httpx.get(models, headers={"authorization": f"Bearer {new}"}).status_code == 200


async def test_upstream_key_rotation_by_secret_file_and_sighup(
    make_sim: Callable[..., Sim], make_gateway: Make, tmp_path: Path
) -> None:
    sim = make_sim(api_key="")  # accepts any key: the records show which one arrived
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "TAOTOKEN_API_KEY").write_text("sk-before-rotation\n")
    gw = make_gateway(GatewaySpec(env={"TOKENGATE_SECRETS_DIR": str(secrets)}), sim.url)
    client = gw.async_openai(max_retries=0)
    done = asyncio.Event()
    outcomes: list[str] = []

    async def load() -> None:
        while not done.is_set():
            try:
                await client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=1)
                outcomes.append("ok")
            except Exception as exc:
                outcomes.append(repr(exc))

    task = asyncio.ensure_future(load())
    await eventually(lambda: bool(sim.records("/v1/chat/completions")), "a request on the old key")
    (secrets / "TAOTOKEN_API_KEY").write_text("sk-after-rotation\n")
    gw.proc.send_signal(signal.SIGHUP)

    def seen() -> str:
        return str(sim.records("/v1/chat/completions")[-1]["headers"]["authorization"])

    await asyncio.to_thread(_wait, lambda: seen() == "Bearer sk-after-rotation")
    done.set()
    await task
    await client.close()
    assert outcomes and set(outcomes) == {"ok"}
    keys = {r["headers"]["authorization"] for r in sim.records("/v1/chat/completions")}
    assert keys == {"Bearer sk-before-rotation", "Bearer sk-after-rotation"}
