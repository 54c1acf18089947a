"""A real PostgreSQL server for tests: Debian's package, a throwaway cluster, a free port.

`initdb` into a temporary directory, `postgres` listening on 127.0.0.1 only (and a unix
socket in that directory), trust authentication for the test role plus a password, fsync
off (a test cluster is thrown away). Run as root, the server runs as the `postgres` user
(Popen's `user=`), which is why the directory is not a pytest tmp_path (root-only). Each test
gets its own database (`fresh_database`), so nothing leaks between tests.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.procs import free_port

USER = "tokengate"
PASSWORD = "pg-test-secret-9d1f"


def _bindir() -> Path:
    found = shutil.which("postgres") or shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    assert candidates, "PostgreSQL is not installed (make test installs Debian's postgresql)"
    return Path(candidates[-1]).parent


def _as_postgres() -> dict[str, Any]:
    """Popen arguments that drop root to the `postgres` user (PostgreSQL refuses root);
    the child is the server itself, so signals reach it directly."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


@dataclass
class Postgres:
    port: int
    root: Path
    proc: subprocess.Popen[bytes] | None = None

    def url(self, database: str = "postgres", scheme: str = "postgresql") -> str:
        return f"{scheme}://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        out = subprocess.run(
            [
                str(_bindir() / "psql"),
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
                self.url(database),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    def fresh_database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.psql(f"CREATE DATABASE {name} OWNER {USER}")
        return name

    def start(self) -> None:
        data = self.root / "data"
        if not data.exists():
            self._initdb(data)
        with open(self.root / "postgres.log", "ab") as logfile:
            self.proc = self._spawn(data, logfile)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "postgres.log").read_text()
            ready = subprocess.run(
                [str(_bindir() / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise TimeoutError("postgres did not start")

    def _spawn(self, data: Path, logfile: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            (
                [
                    str(_bindir() / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(self.port),
                    "-h",
                    "127.0.0.1",
                    "-k",
                    str(self.root),
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=200",
                ]
            ),
            stdout=subprocess.DEVNULL,
            stderr=logfile,
            **_as_postgres(),
        )

    def _initdb(self, data: Path) -> None:
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD)
        _chown(self.root)
        subprocess.run(
            (
                [
                    str(_bindir() / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    USER,
                    "--pwfile",
                    str(pwfile),
                    "--auth-local",
                    "trust",
                    "--auth-host",
                    "scram-sha-256",
                    "--no-sync",
                    "-E",
                    "UTF8",
                    "--locale",
                    "C",
                ]
            ),
            check=True,
            capture_output=True,
            **_as_postgres(),
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: sessions are cut
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def _chown(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")
        for entry in path.rglob("*"):
            shutil.chown(entry, "postgres", "postgres")


@contextlib.contextmanager
def postgres_server() -> Iterator[Postgres]:
    root = Path(tempfile.mkdtemp(prefix="tokengate-pg-"))
    os.chmod(root, 0o755)
    pg = Postgres(free_port(), root)
    try:
        pg.start()
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
