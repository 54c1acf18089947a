"""Files only the gateway's user can read: the database, its WAL and shared memory,
ledger spill files and backups hold prompts, outputs, usage and budgets.

Each is created 0600 in directories created 0700, by explicit mode and `chmod` (a
`mkdir`/`open` mode is masked by the umask, which may be looser or tighter than wanted),
never by changing the process's umask, which would reach every file a library writes.
Directories that already exist keep their mode (`/tmp`, `/var/lib` are not ours to
change); a database file that already exists is tightened to 0600, once, since SQLite
gives its WAL and shared-memory files the database file's own mode.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("tokengate.db")
FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: Path) -> None:
    """`path` and each missing parent, created 0700."""
    missing: list[Path] = []
    here = path
    while not here.exists():
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for folder in reversed(missing):
        folder.mkdir(mode=DIR_MODE, exist_ok=True)
        os.chmod(folder, DIR_MODE)
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")


def private_file(path: Path, *, tighten: bool = False) -> None:
    """`path` created empty 0600 if absent; an existing file is left as it is unless
    `tighten` (then it loses any group or other permission)."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        if tighten:
            _tighten(path)
        return
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def write_private(path: Path, text: str) -> None:
    """`text` written to `path` (replaced if present), the file 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(fd, FILE_MODE)
        out.write(text)


def open_private(path: Path) -> int:
    """A descriptor on `path` for appending (a lock file), created 0600."""
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    return fd


def _tighten(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077 and path.stat().st_uid == os.geteuid():
        os.chmod(path, mode & 0o700)
        log.warning("%s was readable by others (%o): now %o", path, mode, mode & 0o700)
