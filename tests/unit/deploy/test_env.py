"""The environment each deployment sets is one the gateway actually reads.

A misspelt `TOKENGATE_SECTION__FIELD` at the top level would be ignored silently,
so every name is checked against the declared settings, then the repo's config
files are loaded with exactly that environment (secrets replaced by test values)
and the values that matter are read back.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import PurePosixPath
from typing import Any

import pytest
from pydantic import BaseModel

from app.config.schema import Settings
from app.config.sources import ConfigFiles, load_settings
from app.runtime import Runtime, compile_runtime
from tests.unit.deploy.files import ROOT, compose, dockerfile_stages, env_of, k8s_object

# Read by the CLI or the config loader itself, not settings fields.
NOT_FIELDS = {
    "TOKENGATE_HOST",
    "TOKENGATE_PORT",
    "TOKENGATE_WORKERS",
    "TOKENGATE_CONFIG",
    "TOKENGATE_SETTINGS",
    "TOKENGATE_REDIS_URL",
    "TOKENGATE_DATABASE_URL",
}
TEST_KEY = "tg-test-deploy-env-key"
SECRETS = {
    "TAOTOKEN_API_KEY": "sk-test-upstream-0123456789",
    "TOKENGATE_KEYS": json.dumps(
        [{"alias": "team-a", "key_sha256": hashlib.sha256(TEST_KEY.encode()).hexdigest()}]
    ),
    "TOKENGATE_ADMIN_KEY": "admin-test-0123456789",
    "TOKENGATE_METRICS__TOKEN": "scrape-test-0123456789",
    "TOKENGATE_REDIS_URL": "redis://redis.test:6379/0",
    "TOKENGATE_REDIS__PASSWORD": "redis-test-password",
    "TOKENGATE_REDIS__SENTINEL_PASSWORD": "sentinel-test-password",
    "TOKENGATE_DATABASE_URL": "postgresql://tokengate:pw@postgres.test:5432/tokengate",
}


def _field_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _field_model(arg)
        if found is not None:
            return found
    return None


def _is_field(name: str) -> bool:
    model: type[BaseModel] | None = Settings
    for part in name.removeprefix("TOKENGATE_").lower().split("__"):
        if model is None or part not in model.model_fields:
            return False
        model = _field_model(model.model_fields[part].annotation)
    return True


def _dockerfile_env() -> dict[str, str]:
    return env_of(dockerfile_stages()[-1])


def _k8s_env() -> dict[str, str]:
    (container,) = k8s_object("deployment.yaml", "Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    env = _dockerfile_env()  # the pod's environment is laid over the image's
    for entry in container["env"]:
        name = entry["name"]
        env[name] = entry["value"] if "value" in entry else SECRETS[name]
    return env


def _compose_env() -> dict[str, str]:
    own = compose()["services"]["gateway-1"]["environment"]
    return _dockerfile_env() | {k: str(v) for k, v in own.items()}


SOURCES = {"dockerfile": _dockerfile_env, "k8s": _k8s_env, "compose": _compose_env}


def _load(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Runtime:
    for name in list(os.environ):
        if name.startswith(("TOKENGATE_", "TAOTOKEN_", "PROMETHEUS_")):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # The image's /app/config holds the repo's config/ files.
    files = ConfigFiles(
        config=ROOT / "config" / PurePosixPath(env["TOKENGATE_CONFIG"]).name,
        settings=ROOT / "config" / PurePosixPath(env["TOKENGATE_SETTINGS"]).name,
    )
    return compile_runtime(load_settings(files), os.environ)


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_every_variable_is_read(source: str) -> None:
    names = [n for n in SOURCES[source]() if n.startswith("TOKENGATE_")]
    assert names
    unknown = [n for n in names if n not in NOT_FIELDS and not _is_field(n)]
    assert not unknown, f"{source} sets variables the gateway ignores: {unknown}"


def test_field_check_rejects_a_typo() -> None:
    assert _is_field("TOKENGATE_SERVER__DRAIN_TIMEOUT_SEC")
    assert not _is_field("TOKENGATE_SERVER__DRAIN_TIMEOUT")
    assert not _is_field("TOKENGATE_LOGGING_OUTPUT")


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_the_seed_files_load_with_it(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env = dict(SOURCES[source]())
    if source == "dockerfile":
        # `docker run -e`: what the image deliberately leaves out.
        env |= {k: SECRETS[k] for k in ("TAOTOKEN_API_KEY", "TOKENGATE_KEYS")}
    runtime = _load(monkeypatch, env)
    s = runtime.settings
    assert s.logging.output == "stdout", "containers log to stdout, not the seed's file"
    if source == "dockerfile":
        assert s.database.path == "/app/var/tokengate.sqlite3" and s.database.url is None
    else:
        assert s.database.url is not None, "replicas must share one database (ledger, batches)"
    assert runtime.auth_enabled and len(runtime.keys) == 1
    if "TOKENGATE_SERVER__DRAIN_TIMEOUT_SEC" in env:
        assert s.server.drain_timeout_sec == float(env["TOKENGATE_SERVER__DRAIN_TIMEOUT_SEC"])
    if source != "dockerfile":
        assert s.redis.url is not None, "replicas must share limits through Redis"
    if source == "k8s":
        assert s.redis.password is not None and s.redis.assumed_replicas == 2
    (domain,) = runtime.domains
    assert domain.api_key.get_secret_value() == env["TAOTOKEN_API_KEY"]


def test_compose_points_the_gateway_at_the_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = _load(monkeypatch, _compose_env())
    (domain,) = runtime.domains
    assert domain.api_base == "http://sim:9090"
    assert runtime.settings.redis.url is not None
    assert runtime.settings.redis.url.get_secret_value() == "redis://redis:6379/0"
    assert runtime.settings.database.url is not None
    assert "@postgres:5432/tokengate" in runtime.settings.database.url.get_secret_value()
    assert [k.alias for k in runtime.keys] == ["demo"]
