"""What `make demo` prints is what the README shows (the e2e test runs the printed
snippets themselves, agents included)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.commands import demo_text
from app.commands.demo import _environment, user_variables

ROOT = Path(__file__).resolve().parents[2]
BASE, KEY = "http://127.0.0.1:8080", "tg-..."


def readme_demo() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quick start") : readme.index("## Running it for real")]
    return section[
        section.index("```text\n") + 8 : section.index("```\n\n", section.index("```text"))
    ]


def test_the_readme_shows_the_snippets_as_the_demo_prints_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)  # `make demo` runs from the repository's root
    printed = dict(demo_text.snippets(BASE, KEY))
    shown = re.findall(r"^# (.+)\n((?:.+\n)+?)(?:\n|$)", readme_demo(), re.M)
    assert len(shown) >= 3
    for title, body in shown:
        assert title in printed, title
        assert body.rstrip("\n") == printed[title], title
    assert demo_text.page(BASE, "tg-admin-...") in readme_demo()
    assert demo_text.honoured({}) in readme_demo()


def test_the_users_variables_win_over_the_demos_and_secrets_are_not_shown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in list(user_variables()):
        monkeypatch.delenv(name)
    monkeypatch.setenv("TOKENGATE_MODEL_ALIASES", '{"x": "y"}')
    monkeypatch.setenv("TOKENGATE_KEYS", json.dumps([{"alias": "mine", "key_sha256": "a" * 64}]))
    monkeypatch.setenv("TOKENGATE_REDIS__PASSWORD", "hunter2")
    monkeypatch.setenv("TOKENGATE_DATABASE_URL", "postgresql://u:pw@db:5432/t")
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-a-real-key-of-the-shell")
    env = _environment(9090, "sk-sim-1", "tg-demo", "tg-admin-1", tmp_path / "db")
    assert env["TOKENGATE_MODEL_ALIASES"] == '{"x": "y"}'  # theirs
    assert env["TOKENGATE_ADMIN_KEY"] == "tg-admin-1"  # the demo's: they set none
    assert [k["alias"] for k in json.loads(env["TOKENGATE_KEYS"])] == ["mine", "demo"]
    assert env["TAOTOKEN_API_KEY"] == "sk-sim-1"  # the sim's, never the shell's real one
    listed = demo_text.honoured(user_variables())
    assert 'TOKENGATE_MODEL_ALIASES={"x": "y"}' in listed
    assert "hunter2" not in listed and "TOKENGATE_REDIS__PASSWORD=***" in listed
    assert "pw@" not in listed and "TOKENGATE_DATABASE_URL=postgresql://u:***@db:5432/t" in listed
