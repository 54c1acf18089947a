"""Deprecated settings still load and are each named once, from the config layer."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.config.deprecated import deprecations, warn_deprecated
from app.config.schema import Settings
from app.config.sources import ConfigFiles, load_settings

ROOT = Path(__file__).resolve().parents[3]


def test_each_deprecated_setting_is_named_with_what_replaced_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings.model_validate(
        {
            "server": {"upstream_client": "native"},
            "ledger": {"path": "var/ledger.sqlite3"},
            "batch": {"path": "var/batches.sqlite3"},
            "logging": {"log_prompts": True},
        }
    )
    with caplog.at_level(logging.WARNING, logger="tokengate.config"):
        warn_deprecated(settings)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "server.upstream_client = 'native' is deprecated and ignored: the upstream client is "
        "aiohttp",
        "ledger.path = 'var/ledger.sqlite3' is deprecated and ignored: the ledger, batches and "
        "files live in one database: database.path (var/tokengate.sqlite3)",
        "batch.path = 'var/batches.sqlite3' is deprecated and ignored: the ledger, batches and "
        "files live in one database: database.path (var/tokengate.sqlite3)",
        "logging.log_prompts = True is deprecated and ignored: prompt text is never written to "
        "the log",
    ]


def test_the_shipped_configuration_loads_without_a_deprecation() -> None:
    files = ConfigFiles(ROOT / "config" / "config.toml", ROOT / "config" / "settings.json")
    settings = load_settings(files, {"TAOTOKEN_API_KEY": "sk-x"})
    assert deprecations(settings) == []
