"""The start-up banner says where the gateway listens, what each domain serves through
which route, how many keys, where state and logs are, and never a secret."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.commands.banner import render
from app.config.schema import Settings
from app.runtime import Runtime, compile_runtime

UPSTREAM_KEY = "sk-upstream-banner-0123456789"


def runtime(tmp_path: Path, data: dict[str, object], **kw: Any) -> Runtime:
    settings = Settings.model_validate(
        {
            "database": {"path": str(tmp_path / "tokengate.sqlite3")},
            **data,
        }
    )
    env = {"TAOTOKEN_API_KEY": UPSTREAM_KEY, "KEY_B": "sk-b-0123456789"}
    return compile_runtime(settings, env, **kw)


KEYS = [
    {"alias": "team-a", "key_sha256": "a" * 64},
    {"alias": "old", "key_sha256": "b" * 64, "expires_at": "2026-01-01T00:00:00Z"},
]


def test_the_banner_names_address_domains_routes_keys_state_and_logs(tmp_path: Path) -> None:
    rt = runtime(
        tmp_path,
        {
            "keys": KEYS,
            "scale_up": [
                {"domain": "domain-a", "models": ["m-2", "m-1"], "requests_per_minute": 600},
                {
                    "domain": "domain-b",
                    "api_base": "https://b.example/v1",
                    "api_key_env": "KEY_B",
                    "api_style": "both",
                },
            ],
            "model_route": {"default": "m-1", "fallback": "m-2"},
            "logging": {"output": str(tmp_path / "gw.log")},
            "redis": {"url": "redis://:hunter2-secret@redis.internal:6379/0"},
            "database": {"url": "postgresql://gw:pg-secret-pw@db.internal:5432/tokengate"},
        },
    )
    text = render(
        rt,
        "http://0.0.0.0:8080",
        workers=2,
        environ={"HTTPS_PROXY": "http://proxyuser:proxypass@proxy.internal:3128"},
        now=datetime(2026, 6, 1, tzinfo=UTC),
    )
    lines = text.splitlines()
    assert lines[0].endswith("listening on http://0.0.0.0:8080 (2 workers)")
    assert "domain    domain-a: models m-1, m-2" in text
    assert "upstream https://taotoken.net/api (via proxy http://proxy.internal:3128" in text
    assert "600 requests/min" in text
    assert "domain    domain-b: models discovered from the upstream's /v1/models" in text
    assert "key from $KEY_B; OpenAI and Anthropic APIs" in text
    assert "default model m-1; fallback m-2" in text
    assert "2 gateway keys (1 expired: old)" in text
    assert "shared through Redis redis.internal:6379 (db 0) (fail open)" in text
    assert "live limits in postgresql://gw:***@db.internal:5432/tokengate" in text
    assert f"JSON lines to {tmp_path / 'gw.log'}, level info" in text
    for secret in (
        UPSTREAM_KEY,
        "sk-b-0123456789",
        "hunter2",
        "proxypass",
        "proxyuser",
        "pg-secret",
    ):
        assert secret not in text


def test_without_redis_or_auth_the_banner_says_so(tmp_path: Path) -> None:
    rt = runtime(tmp_path, {}, no_auth=True, workers=3)
    text = render(rt, "http://127.0.0.1:8080", workers=3, environ={})
    assert "AUTHENTICATION IS OFF" in text
    assert "limits and quotas in-process, split 1/3 per worker" in text
    assert "(direct)" in text and "JSON lines to stderr" in text
    assert f"live limits in sqlite:{tmp_path / 'tokengate.sqlite3'}" in text
