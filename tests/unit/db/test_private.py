"""Files with prompts, usage and budgets are the gateway user's alone (issue #31)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.db.private import private_dir, private_file, write_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0o000)  # the worst case: nothing masked
    try:
        yield
    finally:
        os.umask(old)


def test_missing_directories_are_0700_and_files_0600_whatever_the_umask(
    tmp_path: Path, loose_umask: None
) -> None:
    target = tmp_path / "a" / "b" / "tokengate.sqlite3"
    private_file(target)
    assert mode(target) == 0o600
    assert mode(target.parent) == mode(target.parent.parent) == 0o700
    write_private(tmp_path / "a" / "spill.json", "{}")
    assert mode(tmp_path / "a" / "spill.json") == 0o600


def test_existing_directories_keep_their_mode_and_a_loose_database_is_tightened(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    db = shared / "tokengate.sqlite3"
    db.write_text("")
    os.chmod(db, 0o644)
    private_dir(shared)
    private_file(db)  # left alone unless asked
    assert mode(shared) == 0o755 and mode(db) == 0o644
    private_file(db, tighten=True)
    assert mode(db) == 0o600 and db.read_text() == ""
