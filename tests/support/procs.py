"""Real processes on loopback ports for end-to-end tests: sim, gateway, redis-server.

Each helper starts the real command (`python -m app.commands.cli ...`, `redis-server`), waits
until it answers, and stops it (SIGTERM, then SIGKILL) when the test ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import tomli_w

from tests.support.waiting import PATIENCE

C = TypeVar("C")

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "config"
UPSTREAM_KEY = "sk-upstream-test-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortTaken(RuntimeError):
    """Another process answered on the port picked for ours, and ours exited.

    `free_port` is a race: the port is free when picked and bound only when the server
    starts, so two test workers (or two test sessions) may pick the same one. The loser
    fails to bind while the winner answers its health check; without this check a test
    then talked to another test's gateway (a valid key refused with 401, seen in CI)."""


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on `port` (Linux's /proc/net tables)."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    found.add(fields[9])
    return found


def listens_on(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on `port`."""
    inodes = _listening_inodes(port)
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
    return False


def wait_http(
    url: str,
    *,
    timeout: float = PATIENCE,
    proc: subprocess.Popen[bytes] | None = None,
    headers: dict[str, str] | None = None,
    own: bool = False,
) -> None:
    """Wait until `url` answers below 500. With `own`, the answer must come from `proc`
    itself (it holds the listening socket), else `PortTaken` once `proc` exits."""
    deadline = time.monotonic() + timeout
    last: object = None
    foreign = False
    port = httpx.URL(url).port
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            if foreign:
                raise PortTaken(f"another process answered on {url}; ours exited")
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            r = httpx.get(url, timeout=1.0, headers=headers)
            if r.status_code < 500:
                if not own or proc is None or port is None or listens_on(proc.pid, port):
                    return
                foreign, last = True, "another process answered"
            else:
                last = r.status_code
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.05)
    if proc is not None:  # a process that never answered is not left behind
        proc.kill()
        proc.wait()
    raise TimeoutError(f"{url} did not answer in {timeout}s (last: {last!r})")


def stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


# `make test-compiled` sets this to a directory the compiled build is installed in (`pip
# install --target`): the gateways and sims the tests start then import `app` from there,
# C extensions and all, while the test process itself stays on the repo's source. With
# faulthandler on: a crash inside compiled code leaves the Python stacks in the log.
BUILD = os.environ.get("TOKENGATE_TEST_BUILD", "")


def in_build(build: str, code: str) -> list[str]:
    """`python -c CODE` with `app` imported from the build installed in `build` (`-P`:
    not from the working directory, which is the repo)."""
    boot = f"import faulthandler, sys; faulthandler.enable(); sys.path.insert(0, {build!r}); "
    return [sys.executable, "-P", "-c", boot + code]


def cli_argv(*args: str, build: str = BUILD) -> list[str]:
    """`tokengate ARGS` as a command: the repo's source, or the build installed in
    `build`. Whatever the environment a test passes (most strip every TOKENGATE_
    variable), because the build's directory is in the command itself."""
    if build:
        main = "from app.commands.cli import main; raise SystemExit(main())"
        return [*in_build(build, main), *args]
    return [sys.executable, "-m", "app.commands.cli", *args]


def run_cli(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`tokengate ARGS` run to its end from the repo, in exactly `env` (nothing of this
    process's environment leaks in), its output captured as text."""
    return subprocess.run(
        cli_argv(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@dataclass
class Sim:
    port: int
    proc: subprocess.Popen[bytes]
    api_key: str = UPSTREAM_KEY

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def records(self, path: str | None = None) -> list[dict[str, Any]]:
        params = {"path": path} if path else None
        return list(httpx.get(f"{self.url}/_sim/records", params=params).json())

    def clear(self) -> None:
        httpx.delete(f"{self.url}/_sim/records")

    def faults(self, **faults: Any) -> None:
        httpx.put(f"{self.url}/_sim/faults", json=faults).raise_for_status()

    def balance(self, tokens: int | None) -> None:
        """The upstream account's prepaid tokens (0: empty, None: unlimited)."""
        httpx.put(f"{self.url}/_sim/quota", json={"balance": tokens}).raise_for_status()

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/_sim/stats").json())

    def stop(self) -> int:
        return stop(self.proc)


def start_sim(*args: str, api_key: str = UPSTREAM_KEY, port: int | None = None) -> Sim:
    for _ in range(3):
        at = port or free_port()
        proc = subprocess.Popen(
            cli_argv("sim", "--port", str(at), "--api-key", api_key, *args),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_http(f"http://127.0.0.1:{at}/_sim/stats", proc=proc, own=True)
            return Sim(at, proc, api_key)
        except PortTaken:
            if port is not None:  # the caller's own port: nothing to move to
                raise
    raise PortTaken("no free port for the sim")


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class Gateway:
    port: int
    proc: subprocess.Popen[bytes]
    workdir: Path
    keys: dict[str, str]
    env: dict[str, str]
    args: list[str]
    log_path: Path
    fixed_port: bool = False  # the caller chose the port: never moved on PortTaken
    # SDK clients made for this gateway, closed when it stops. An SDK client sits in a
    # reference cycle (client <-> its resources), so only the cyclic collector frees one
    # left open, finalizing its pooled sockets in any order: some tests later, a socket
    # finalized before its pool raised ResourceWarning in whichever test was running.
    clients: list[Any] = field(default_factory=list, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def keep(self, client: C) -> C:
        """`client` (a sync SDK or httpx client) is closed when this gateway stops."""
        self.clients.append(client)
        return client

    @property
    def key(self) -> str:
        return next(iter(self.keys.values()))

    def openai(self, alias: str | None = None, **kwargs: Any) -> Any:
        import openai

        key = self.keys[alias] if alias else self.key
        kwargs.setdefault("max_retries", 0)
        return self.keep(openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, **kwargs))

    def async_openai(self, alias: str | None = None, **kwargs: Any) -> Any:
        import openai

        key = self.keys[alias] if alias else self.key
        kwargs.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=key, **kwargs)

    def headers(self, alias: str | None = None) -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[alias] if alias else self.key}"}

    def log_lines(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        out = []
        for line in self.log_path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out

    def access(self) -> list[dict[str, Any]]:
        return [line for line in self.log_lines() if line.get("logger") == "tokengate.access"]

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics").text

    def stop(self) -> int:
        while self.clients:
            self.clients.pop().close()
        return stop(self.proc)

    def ready(self, timeout: float = 60.0) -> Gateway:
        """Wait until a gateway started with `wait=False` answers: replicas started
        together boot side by side instead of one after the other. A port another
        process won meanwhile (`PortTaken`) is given up for a new one."""
        for _ in range(3):
            try:
                wait_http(f"{self.url}/health", proc=self.proc, timeout=timeout, own=True)
                return self
            except PortTaken:
                if self.fixed_port:
                    raise
                self.port = free_port()
                self.proc = _spawn_gateway(self.port, self.args, self.env, self.workdir)
        raise PortTaken(f"no free port for the gateway in {self.workdir}")

    def restart(self) -> None:
        stop(self.proc)  # its clients stay open: they reconnect to the new process
        self.proc = _spawn_gateway(self.port, self.args, self.env, self.workdir)
        wait_http(f"{self.url}/health", proc=self.proc, own=True)


def _spawn_gateway(
    port: int, args: list[str], env: dict[str, str], workdir: Path
) -> subprocess.Popen[bytes]:
    with open(workdir / "stdout.log", "ab") as out:
        return subprocess.Popen(
            cli_argv("serve", "--port", str(port), *args),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@dataclass
class GatewaySpec:
    """What to run: config.toml and settings.json as dicts on top of the seed files."""

    toml: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, dict[str, Any]] = field(default_factory=lambda: {"alice": {}})
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    secrets: dict[str, str] = field(default_factory=dict)  # alias -> plaintext to reuse


def seed_toml() -> dict[str, Any]:
    import tomllib

    return tomllib.loads((SEED / "config.toml").read_text())


def seed_settings() -> dict[str, Any]:
    return dict(json.loads((SEED / "settings.json").read_text()))


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        elif v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def start_gateway(
    workdir: Path,
    spec: GatewaySpec,
    upstream: str | None = None,
    *,
    port: int | None = None,
    wait: bool = True,
) -> Gateway:
    workdir.mkdir(parents=True, exist_ok=True)
    fixed = port is not None  # the caller's port is never moved on PortTaken
    port = port or free_port()
    toml = _merge(seed_toml(), spec.toml)
    settings = _merge(seed_settings(), spec.settings)
    keys = {
        alias: spec.secrets.get(alias) or f"tg-test-{alias}-{os.urandom(6).hex()}"
        for alias in spec.keys
    }
    settings.setdefault(
        "keys",
        [
            {"alias": alias, "key_sha256": digest(keys[alias]), **extra}
            for alias, extra in spec.keys.items()
        ],
    )
    if upstream is not None:
        settings["api_endpoint"] = upstream
    log_path = workdir / "gateway.log"
    settings = _merge({"logging": {}}, settings)
    toml = _merge(toml, {"logging": {"output": str(log_path)}})
    settings["database"] = {
        "path": str(workdir / "tokengate.sqlite3"),
        **settings.get("database", {}),
    }
    (workdir / "config.toml").write_text(tomli_w.dumps(toml))
    (workdir / "settings.json").write_text(json.dumps(settings, indent=2))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENGATE_", "PROMETHEUS_"))}
    env.update({"TAOTOKEN_API_KEY": UPSTREAM_KEY, **spec.env})
    args = [
        "--config",
        str(workdir / "config.toml"),
        "--settings",
        str(workdir / "settings.json"),
        *spec.args,
    ]
    proc = _spawn_gateway(port, args, env, workdir)
    gw = Gateway(port, proc, workdir, keys, env, args, log_path, fixed)
    if wait:
        try:  # a bound, not a speed test: a loaded machine starts a gateway slowly
            gw.ready()
        except BaseException:
            stop(gw.proc)  # never left running when the caller gets no Gateway to stop
            raise
    return gw


@dataclass
class Redis:
    port: int
    proc: subprocess.Popen[bytes] | None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is not installed (make test installs it)"
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return
            time.sleep(0.05)
        raise TimeoutError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(5)
            self.proc = None


@contextlib.contextmanager
def redis_server() -> Iterator[Redis]:
    r = Redis(free_port(), None)
    r.start()
    try:
        yield r
    finally:
        r.kill()
