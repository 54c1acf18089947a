"""The import-linter contract names every top-level module of app/, so none escapes it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _top_level() -> set[str]:
    app = ROOT / "app"
    modules = {p.stem for p in app.glob("*.py") if p.stem != "__init__"}
    return modules | {p.name for p in app.iterdir() if (p / "__init__.py").is_file()}


def test_every_top_level_module_is_in_the_layers_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers" and "containers" not in c]
    named = {m for layer in layers for m in re.findall(r"app\.(\w+)", layer)}
    assert sorted(_top_level() - named) == [], "add them to [tool.importlinter] in pyproject.toml"
