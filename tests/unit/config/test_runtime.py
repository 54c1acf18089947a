"""Compiling settings into the runtime: the overlap rules and semantic errors."""

from __future__ import annotations

import pytest

from app.config.problems import ConfigError
from app.config.schema import Settings
from app.runtime import compile_runtime

DIGEST = "a" * 64


def settings(**data: object) -> Settings:
    return Settings.model_validate(data)


def test_api_endpoint_beats_token_scheduler_and_domain_beats_both() -> None:
    s = settings(
        api_endpoint="http://json.local/v1", token_scheduler={"api_base": "http://toml.local"}
    )
    rt = compile_runtime(s, {"TAOTOKEN_API_KEY": "k"}, no_auth=True)
    assert rt.domains[0].api_base == "http://json.local"
    s = settings(
        api_endpoint="http://json.local", scale_up=[{"domain": "d", "api_base": "http://own"}]
    )
    assert (
        compile_runtime(s, {"TAOTOKEN_API_KEY": "k"}, no_auth=True).domains[0].api_base
        == "http://own"
    )


def test_attempts_rule() -> None:
    env = {"TAOTOKEN_API_KEY": "k"}
    assert (
        compile_runtime(settings(retry_policy={"max_attempts": 2}), env, no_auth=True).attempts == 2
    )
    assert (
        compile_runtime(settings(token_scheduler={"max_retries": 4}), env, no_auth=True).attempts
        == 5
    )
    client = settings(retry_policy={"max_attempts": 3, "client_retries": "client"})
    assert compile_runtime(client, env, no_auth=True).attempts == 1


def test_missing_upstream_key_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError) as err:
        compile_runtime(
            settings(scale_up=[{"domain": "d", "api_key_env": "KEY_D"}]), {}, no_auth=True
        )
    assert "KEY_D" in err.value.render()


def test_no_keys_refuses_unless_no_auth() -> None:
    with pytest.raises(ConfigError, match="tokengate keys new"):
        compile_runtime(settings(), {"TAOTOKEN_API_KEY": "k"})
    assert not compile_runtime(settings(), {"TAOTOKEN_API_KEY": "k"}, no_auth=True).auth_enabled


def test_key_pinned_to_unknown_domain_and_duplicates_are_errors() -> None:
    keys = [
        {"alias": "a", "key_sha256": DIGEST, "domain": "nowhere"},
        {"alias": "a", "key_sha256": DIGEST},
    ]
    with pytest.raises(ConfigError) as err:
        compile_runtime(settings(keys=keys), {"TAOTOKEN_API_KEY": "k"})
    fields = {p.field for p in err.value.problems}
    assert {"keys[0].domain", "keys[1].alias", "keys[1].key_sha256"} <= fields


def test_key_defaults_come_from_rate_limit() -> None:
    s = settings(
        rate_limit={"requests_per_minute": 9},
        keys=[
            {"alias": "a", "key_sha256": DIGEST},
            {"alias": "b", "key_sha256": "b" * 64, "requests_per_minute": 3, "priority": "high"},
        ],
    )
    a, b = compile_runtime(s, {"TAOTOKEN_API_KEY": "k"}).keys
    assert (a.requests_per_minute, a.priority) == (9, "normal")
    assert (b.requests_per_minute, b.priority) == (3, "high")
