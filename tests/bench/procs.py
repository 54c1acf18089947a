"""Processes the benchmark starts, and the guarantee that it stops all of them.

Every child runs in its own session (so a terminal Ctrl-C reaches only the
benchmark, which then stops them in order) under `setpriv --pdeathsig KILL`, so even
a SIGKILLed benchmark does not leave servers behind on loopback ports (done by exec,
not `preexec_fn`, which is unsafe while the RSS sampler thread runs). `Group` owns
the children of one run: leaving its `with` block, normally or by an exception,
SIGTERMs each process group, then SIGKILLs what is still alive.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A loopback port that was free a moment ago (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent(cmd: Sequence[str]) -> list[str]:
    """Wrap `cmd` so the kernel SIGKILLs it when the benchmark dies."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", *cmd] if setpriv else list(cmd)


def pinned(cmd: Sequence[str], cpus: str | None) -> list[str]:
    """Prefix `cmd` with `taskset -c cpus` (None: let the scheduler place it)."""
    return ["taskset", "-c", cpus, *cmd] if cpus else list(cmd)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 15) -> str:
        """The end of its log, for error messages when it fails to start."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop(proc: Proc, grace: float = 8.0) -> None:
    """SIGTERM the whole process group, wait, then SIGKILL it (workers included)."""
    if proc.alive():
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.popen.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    # The leader may be gone while its workers linger: always sweep the group.
    _signal_group(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.popen.wait(5)


@dataclass
class Group:
    """The processes of one run, stopped in reverse start order on exit."""

    logdir: Path
    procs: list[Proc] = field(default_factory=list)

    def start(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
    ) -> Proc:
        log = self.logdir / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                _die_with_parent(cmd),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        stop(proc)
        if proc in self.procs:
            self.procs.remove(proc)

    def close(self) -> None:
        while self.procs:
            stop(self.procs.pop())

    def __enter__(self) -> Group:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def wait_http(
    url: str,
    proc: Proc,
    *,
    timeout: float = 30.0,
    headers: dict[str, str] | None = None,
    ok: Callable[[httpx.Response], bool] = lambda r: r.status_code < 500,
) -> None:
    """Poll `url` until `ok`; fail early, with its log, if the process exits."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        try:
            r = httpx.get(url, timeout=2.0, headers=headers)
            if ok(r):
                return
            last = r.status_code
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{proc.name}: {url} not ready in {timeout:.0f}s ({last!r})\n{proc.tail()}")


def wait_port(port: int, proc: Proc, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{proc.name}: port {port} not open in {timeout:.0f}s\n{proc.tail()}")


def sigterm_as_interrupt() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt, so `finally` blocks stop the children.

    SIGINT is set explicitly because a shell starts background jobs with it ignored,
    and Python then never installs its own handler.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def scratch(prefix: str, keep: bool = False) -> Iterator[Path]:
    """A temporary directory for one run's processes, removed after it unless `keep`.
    World-readable: nginx's workers (user nobody when run as root) read below it."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    tmp.chmod(0o755)
    try:
        yield tmp
    finally:
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
