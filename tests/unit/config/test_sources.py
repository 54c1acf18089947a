"""Loading both seed files, precedence, `${VAR}`, and the errors operators see."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.config.problems import ConfigError
from app.config.sources import ConfigFiles, load_settings
from app.runtime import compile_runtime
from tests.support.procs import ROOT

SEED = ConfigFiles(ROOT / "config" / "config.toml", ROOT / "config" / "settings.json")


def files(tmp_path: Path, toml: str = "", settings: object | None = None) -> ConfigFiles:
    c, s = tmp_path / "config.toml", tmp_path / "settings.json"
    c.write_text(toml)
    s.write_text(json.dumps(settings if settings is not None else {}))
    return ConfigFiles(c, s)


def test_seed_files_are_the_shared_seed_files_unchanged() -> None:
    shared = ROOT.parent / "shared" / "seed-config"
    if not shared.exists():
        pytest.skip("shared seed folder not present on this machine")
    for name in ("config.toml", "settings.json"):
        assert (ROOT / "config" / name).read_text() == (shared / name).read_text()


def test_seed_files_load_with_their_values() -> None:
    s = load_settings(SEED)
    assert s.cluster.name == "supernode-prod-01" and s.cluster.total_gpus == 64
    assert s.token_scheduler.batch_size == 16 and s.token_scheduler.timeout_ms == 30000
    assert s.scale_up is not None and not isinstance(s.scale_up, list)
    assert s.scale_up.latency_target_us == 5 and s.scale_up.memory_pool == "unified"
    assert s.api_key is not None and s.api_key.get_secret_value() == "sk-unit-upstream"
    assert s.model_route.default == "claude-sonnet" and s.model_route.fallbacks() == ("gpt-4o",)
    assert s.rate_limit.tokens_per_minute == 120000 and s.retry_policy.max_attempts == 3
    assert s.health_check.interval_sec == 30 and s.logging.output.endswith("token_scheduler.log")


def test_precedence_env_over_json_over_toml_over_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = files(
        tmp_path,
        "[token_scheduler]\nbatch_size = 8\nmax_inflight = 5\nqueue_capacity = 7\n",
        {"token_scheduler": {"batch_size": 12, "max_inflight": 6}},
    )
    monkeypatch.setenv("TOKENGATE_TOKEN_SCHEDULER__BATCH_SIZE", "32")
    s = load_settings(f)
    assert s.token_scheduler.batch_size == 32  # env
    assert s.token_scheduler.max_inflight == 6  # settings.json over config.toml
    assert s.token_scheduler.queue_capacity == 7  # config.toml over default
    assert s.token_scheduler.max_queue_wait_ms == 30000  # default


def test_nested_env_override_of_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENGATE_RATE_LIMIT__TOKENS_PER_MINUTE", "60000")
    assert load_settings(SEED).rate_limit.tokens_per_minute == 60000


def test_dollar_var_expands_and_missing_var_names_file_field_and_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = files(tmp_path, settings={"api_endpoint": "http://${UP_HOST}:9", "api_key": "${NOPE_KEY}"})
    monkeypatch.setenv("UP_HOST", "upstream.local")
    with pytest.raises(ConfigError) as err:
        load_settings(f)
    text = err.value.render()
    assert str(f.settings) in text and "api_key" in text and "NOPE_KEY" in text
    assert "export NOPE_KEY" in text
    monkeypatch.setenv("NOPE_KEY", "sk-x")
    s = load_settings(f)
    assert s.api_endpoint == "http://upstream.local:9"


def test_unknown_section_names_the_file_and_suggests(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(files(tmp_path, "[token_schedular]\nbatch_size = 3\n"))
    (problem,) = err.value.problems
    assert problem.origin == str(tmp_path / "config.toml")
    assert problem.field == "token_schedular" and "token_scheduler" in problem.fix


def test_unknown_nested_field_and_bad_value_are_each_reported(tmp_path: Path) -> None:
    f = files(
        tmp_path, "[token_scheduler]\nbatch_sise = 3\n", {"rate_limit": {"requests_per_minute": -1}}
    )
    with pytest.raises(ConfigError) as err:
        load_settings(f)
    by_field = {p.field: p for p in err.value.problems}
    assert by_field["token_scheduler.batch_sise"].origin == str(f.config)
    assert "batch_size" in by_field["token_scheduler.batch_sise"].fix
    assert by_field["rate_limit.requests_per_minute"].origin == str(f.settings)


def test_bad_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENGATE_TOKEN_SCHEDULER__BATCH_SIZE", "lots")
    with pytest.raises(ConfigError) as err:
        load_settings(SEED)
    assert (
        err.value.problems[0].origin == "environment variable TOKENGATE_TOKEN_SCHEDULER__BATCH_SIZE"
    )


def test_syntax_errors_are_config_errors(tmp_path: Path) -> None:
    c, s = tmp_path / "config.toml", tmp_path / "settings.json"
    c.write_text("[cluster\n")
    s.write_text("{}")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(ConfigFiles(c, s))
    c.write_text("")
    s.write_text('{"a": ')
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_settings(ConfigFiles(c, s))


def test_tokengate_api_key_is_never_the_upstream_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENGATE_API_KEY", "tg-client-key")
    s = load_settings(SEED)
    assert s.api_key is not None and s.api_key.get_secret_value() == "sk-unit-upstream"


def test_redis_url_shorthand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENGATE_REDIS_URL", "redis://127.0.0.1:1/0")
    url = load_settings(SEED).redis.url
    assert url is not None and url.get_secret_value() == "redis://127.0.0.1:1/0"


def test_scale_up_array_gives_one_domain_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEY_B", "sk-b")
    f = files(
        tmp_path,
        """
[[scale_up]]
domain = "a"
models = ["m1"]
latency_target_us = 3
[[scale_up]]
domain = "b"
api_base = "http://b.local/v1"
api_key_env = "KEY_B"
max_inflight = 4
""",
        {"keys": [], "api_key": "sk-default"},
    )
    rt = compile_runtime(load_settings(f), {"KEY_B": "sk-b"}, no_auth=True)
    a, b = rt.domains
    assert (a.name, a.models, a.api_key.get_secret_value()) == (
        "a",
        frozenset({"m1"}),
        "sk-default",
    )
    assert (b.name, b.api_base, b.max_inflight) == ("b", "http://b.local", 4)
    assert b.api_key.get_secret_value() == "sk-b"


def test_cli_exits_2_with_one_message_and_no_traceback(tmp_path: Path) -> None:
    f = files(tmp_path, "[token_scheduler]\nbatch_size = 0\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.commands.cli",
            "serve",
            "--config",
            str(f.config),
            "--settings",
            str(f.settings),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "token_scheduler.batch_size" in proc.stderr and str(f.config) in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_the_configuration_reference_matches_the_schema() -> None:
    from app.config.reference import DOC, splice

    doc = (ROOT / DOC).read_text()
    assert splice(doc) == doc, f"{DOC}'s configuration reference drifted: run `make docs`"


def test_database_url_shorthand_and_deprecated_paths_still_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENGATE_DATABASE_URL", "postgresql://tg:pw@db:5432/tokengate")
    old = {"ledger": {"path": "var/ledger.sqlite3"}, "batch": {"path": "var/batches.sqlite3"}}
    s = load_settings(files(tmp_path, settings=old))
    assert s.database.url is not None
    assert s.database.url.get_secret_value() == "postgresql://tg:pw@db:5432/tokengate"
    assert (s.ledger.path, s.batch.path) == ("var/ledger.sqlite3", "var/batches.sqlite3")
    assert "pw" not in repr(s.database)
