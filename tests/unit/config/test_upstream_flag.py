"""`serve --upstream`: the variables it adds, never over the user's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config.sources import ConfigFiles
from app.config.upstream_flag import endpoint, variables

ROOT = Path(__file__).resolve().parents[3]
SEED = ConfigFiles(ROOT / "config" / "config.toml", ROOT / "config" / "settings.json")


def test_sim_on_the_seed_files_needs_nothing_else() -> None:
    assert variables("sim", SEED, {}) == {
        "TOKENGATE_API_ENDPOINT": "http://127.0.0.1:9090",
        "TOKENGATE_SCALE_UP__API_STYLE": "both",
        "TAOTOKEN_API_KEY": "sk-sim-any-key",
        "TOKENGATE_LOGGING__OUTPUT": "stderr",
    }


def test_what_the_user_set_wins_but_the_flag_names_the_endpoint() -> None:
    env = {
        "TAOTOKEN_API_KEY": "mine",
        "TOKENGATE_LOGGING__OUTPUT": "/tmp/x.log",
        "TOKENGATE_API_ENDPOINT": "http://elsewhere",
        "TOKENGATE_SIM_API_KEY": "sk-sim-own",
    }
    assert variables("sim:9191", SEED, env) == {
        "TOKENGATE_API_ENDPOINT": "http://127.0.0.1:9191",
        "TOKENGATE_SCALE_UP__API_STYLE": "both",
    }
    assert variables("sim", SEED, {"TOKENGATE_SIM_API_KEY": "sk-own"})["TAOTOKEN_API_KEY"] == (
        "sk-own"
    )


def test_a_url_only_points_the_endpoint() -> None:
    assert variables("https://up.example/api", SEED, {}) == {
        "TOKENGATE_API_ENDPOINT": "https://up.example/api"
    }


def test_an_array_of_domains_keeps_its_dialects_and_each_key_variable_is_filled(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        '[[scale_up]]\ndomain = "a"\napi_key_env = "KEY_A"\n'
        '[[scale_up]]\ndomain = "b"\napi_key_env = "KEY_B"\n'
    )
    settings = tmp_path / "settings.json"
    settings.write_text("{}")
    added = variables("sim", ConfigFiles(config, settings), {})
    assert "TOKENGATE_SCALE_UP__API_STYLE" not in added
    assert added["KEY_A"] == added["KEY_B"] == "sk-sim-any-key"


@pytest.mark.parametrize("bad", ["sim:x", "localhost:9090", "ftp://x"])
def test_anything_else_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="expected sim, sim:PORT or"):
        endpoint(bad)
