"""An empty or blank secret enables nothing: every SecretStr in the settings, from any
source, stops the load naming where it was set (issue #31)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.config.problems import ConfigError
from app.config.sources import ConfigFiles, load_settings
from app.runtime import compile_runtime


def files(tmp_path: Path, settings: object) -> ConfigFiles:
    c, s = tmp_path / "config.toml", tmp_path / "settings.json"
    c.write_text("")
    s.write_text(json.dumps(settings))
    return ConfigFiles(c, s)


@pytest.mark.parametrize(
    ("variable", "field"),
    [
        ("TOKENGATE_ADMIN_KEY", "admin_key"),
        ("TOKENGATE_METRICS__TOKEN", "metrics.token"),
        ("TOKENGATE_DATABASE_URL", "database.url"),  # the documented shorthand, by its name
        ("TOKENGATE_REDIS__PASSWORD", "redis.password"),
        ("TOKENGATE_REDIS__SENTINEL_PASSWORD", "redis.sentinel_password"),
        ("TOKENGATE_TRACING__HEADERS", "tracing.headers"),
    ],
)
@pytest.mark.parametrize("blank", ["", " ", "\t\n"])
def test_a_blank_secret_in_the_environment_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, field: str, blank: str
) -> None:
    monkeypatch.setenv(variable, blank)
    with pytest.raises(ConfigError) as err:
        load_settings(files(tmp_path, {}))
    text = err.value.render()
    assert f"environment variable {variable}: {field}: is set but empty" in text


def test_a_blank_secret_in_a_file_or_a_blank_placeholder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(files(tmp_path, {"admin_key": "  "}))
    assert "settings.json: admin_key: is set but empty" in err.value.render()
    monkeypatch.setenv("ADMIN_FROM_VAULT", "   ")
    with pytest.raises(ConfigError) as err:
        load_settings(files(tmp_path, {"admin_key": "${ADMIN_FROM_VAULT}"}))
    assert "ADMIN_FROM_VAULT is not set or is empty" in err.value.render()


def test_a_blank_upstream_key_variable_leaves_the_domain_without_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UPSTREAM_KEY_A", "  ")
    settings = load_settings(
        files(tmp_path, {"scale_up": [{"domain": "a", "api_key_env": "UPSTREAM_KEY_A"}]})
    )
    with pytest.raises(ConfigError) as err:
        compile_runtime(settings, {"UPSTREAM_KEY_A": "  "}, no_auth=True)
    assert "UPSTREAM_KEY_A is not set or is empty" in err.value.render()


def test_set_secrets_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENGATE_ADMIN_KEY", "adm-0123456789")
    monkeypatch.setenv("TOKENGATE_METRICS__TOKEN", "scrape-0123")
    s = load_settings(files(tmp_path, {}))
    assert s.admin_key is not None and s.metrics.token is not None
