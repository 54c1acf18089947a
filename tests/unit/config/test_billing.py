"""The billing section, teams and budgets: environment overrides and the errors operators
see for a bad time zone, an unknown team or two budgets of one kind."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from app.config.problems import ConfigError
from app.config.sources import load_settings
from app.runtime import compile_runtime
from tests.unit.config.test_sources import files

KEY = {"alias": "alice", "key_sha256": "a" * 64}


def test_every_billing_knob_has_its_environment_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = files(
        tmp_path,
        settings={"billing": {"prices": {"gpt-4o": {"input": 2.5, "output": 10}}}},
    )
    monkeypatch.setenv("TOKENGATE_BILLING__CURRENCY", "CNY")
    monkeypatch.setenv("TOKENGATE_BILLING__TIMEZONE", "Asia/Shanghai")
    monkeypatch.setenv(
        "TOKENGATE_BILLING__PRICES", json.dumps({"qwen-max": {"input": "2.4", "output": 9.6}})
    )
    teams = [{"name": "ml", "budgets": [{"period": "month", "max_cost": "8000.50"}]}]
    monkeypatch.setenv("TOKENGATE_TEAMS", json.dumps(teams))
    s = load_settings(f)
    assert (s.billing.currency, s.billing.timezone) == ("CNY", "Asia/Shanghai")
    assert sorted(s.billing.prices) == ["gpt-4o", "qwen-max"]  # merged per model
    assert s.billing.prices["qwen-max"].input == Decimal("2.4")
    assert s.teams[0].budgets[0].max_cost == Decimal("8000.50")  # exact, never a float


def test_a_bad_time_zone_names_the_variable_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENGATE_BILLING__TIMEZONE", "Asia/Atlantis")
    with pytest.raises(ConfigError) as err:
        load_settings(files(tmp_path))
    text = err.value.render()
    assert "TOKENGATE_BILLING__TIMEZONE" in text and "IANA name" in text


def test_a_key_in_an_unknown_team_and_a_duplicate_budget_are_refused(tmp_path: Path) -> None:
    settings = {
        "keys": [
            {
                **KEY,
                "team": "ml",
                "budgets": [
                    {"period": "day", "max_cost": 5},
                    {"period": "day", "max_cost": 6, "max_tokens": 1000},
                ],
            }
        ],
        "teams": [{"name": "search"}],
    }
    with pytest.raises(ConfigError) as err:
        compile_runtime(
            load_settings(files(tmp_path, settings=settings)), {"TAOTOKEN_API_KEY": "k"}
        )
    text = err.value.render()
    assert "keys[0].team" in text and "unknown team 'ml'" in text and "search" in text
    assert "a second day cost budget for key 'alice'" in text


def test_a_budget_needs_a_limit(tmp_path: Path) -> None:
    settings = {"keys": [{**KEY, "budgets": [{"period": "week"}]}]}
    with pytest.raises(ConfigError, match="needs `max_cost` or `max_tokens`"):
        load_settings(files(tmp_path, settings=settings))
