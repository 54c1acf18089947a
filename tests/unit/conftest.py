from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests see no TOKENGATE_* variables but the ones they set."""
    for name in list(os.environ):
        if name.startswith(("TOKENGATE_", "PROMETHEUS_MULTIPROC")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-unit-upstream")
