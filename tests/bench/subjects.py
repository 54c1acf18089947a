"""The things measured: the upstream itself, nginx, tokengate (1 and 2 workers), LiteLLM.

Every subject is an HTTP base URL plus the headers a client sends it, and the root
pid of its process tree (for RSS and CPU). tokengate runs with its default features
on (gateway-key auth, per-key limits, queue, metrics, ledger, health probes) with
limits high enough never to refuse, so the numbers are the cost of the checks, not
of refusals. LiteLLM runs from its own throwaway venv outside the repo, configured
the way its docs describe (a `model_list` entry, a master key, one worker).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.bench import nginx
from tests.bench.procs import ROOT, Group, Proc, free_port, pinned, wait_http, wait_port
from tests.support.procs import cli_argv

GATEWAY_KEY = "tg-bench-" + "0123456789abcdef" * 2
UPSTREAM_KEY = "sk-bench-upstream-0123456789"
LITELLM_MASTER_KEY = "sk-bench-litellm-master-0123456789"
LITELLM_VENV = Path(os.environ.get("TOKENGATE_BENCH_LITELLM_VENV", "/tmp/tokengate-bench-litellm"))
HUGE_RPM = 1_000_000_000
HUGE_TPM = 100_000_000_000
# The build every `tokengate` subject runs unless told: "" the repo's source, else a
# directory a build is installed in (`run.py --build build/compiled`, as `make bench`
# passes it: the compiled build the image ships).
BUILD = ""


def use_build(directory: str) -> None:
    """Run every `tokengate` subject from the build installed in `directory` ("": the
    source), as `run.py --build` and `guard.py --build` ask."""
    global BUILD
    BUILD = str(Path(directory).resolve()) if directory else ""


@dataclass
class Subject:
    name: str
    url: str
    headers: dict[str, str]
    proc: Proc | None = None  # None: nothing of its own to measure
    notes: list[str] = field(default_factory=list)
    gateway_log: Path | None = None  # tokengate's own log file

    @property
    def chat_url(self) -> str:
        return f"{self.url}/v1/chat/completions"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


def clean_env(**extra: str) -> dict[str, str]:
    """The parent's environment without anything that would reconfigure a child."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENGATE_", "PROMETHEUS_"))}
    env.update(extra)
    return env


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_settings(path: Path, keys: list[dict[str, object]]) -> Path:
    """The repo's settings.json plus gateway `keys` (only hashes), as tests do."""
    settings = json.loads((ROOT / "config" / "settings.json").read_text())
    settings["keys"] = keys
    path.write_text(json.dumps(settings, indent=2))
    return path


def tokengate(
    group: Group,
    name: str,
    workdir: Path,
    upstream: str,
    *,
    workers: int,
    log_level: str = "warning",
    cpus: str | None = None,
    redis_url: str | None = None,
    extra_env: dict[str, str] | None = None,
    wrap: list[str] | None = None,
    build: str | None = None,
) -> Subject:
    """`tokengate serve --workers N` on the repo's config.toml, pointed at `upstream`.

    `wrap` runs it under another program (`valgrind --tool=callgrind ...`: see profile.py).
    `build`: a directory a build is installed in (`make compiled`: build/compiled) to run
    instead of the repo's source ("": the source; None: `BUILD`).

    `redis_url` shares limits through Redis (`TOKENGATE_REDIS_URL`) instead of
    in-process state; `extra_env` sets anything else (a domain's quota, say).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    key: dict[str, object] = {"alias": "bench", "key_sha256": sha256(GATEWAY_KEY)}
    key |= {"requests_per_minute": HUGE_RPM, "tokens_per_minute": HUGE_TPM}
    settings = write_settings(workdir / "settings.json", [key])
    env = clean_env(
        TAOTOKEN_API_KEY=UPSTREAM_KEY,
        TOKENGATE_API_ENDPOINT=upstream,
        TOKENGATE_LOGGING__OUTPUT=str(workdir / "gateway.log"),
        TOKENGATE_LOGGING__LEVEL=log_level,
        TOKENGATE_DATABASE__PATH=str(workdir / "tokengate.sqlite3"),
        TOKENGATE_RATE_LIMIT__REQUESTS_PER_MINUTE=str(HUGE_RPM),
        TOKENGATE_RATE_LIMIT__TOKENS_PER_MINUTE=str(HUGE_TPM),
    )
    if redis_url:
        env["TOKENGATE_REDIS_URL"] = redis_url
    env.update(extra_env or {})
    if workers > 1:
        # What the CLI would create in /tmp, but inside the run's dir so it never leaks;
        # one worker keeps in-memory metrics, as `serve` does by default.
        env["PROMETHEUS_MULTIPROC_DIR"] = str(workdir / "prom")
        (workdir / "prom").mkdir(exist_ok=True)
    port = free_port()
    build = BUILD if build is None else build
    cmd = cli_argv("serve", "--port", str(port), build=build)
    cmd += ["--workers", str(workers), "--config", str(ROOT / "config" / "config.toml")]
    cmd += ["--settings", str(settings)]
    proc = group.start(name, pinned([*(wrap or ()), *cmd], cpus), env=env)
    url = f"http://127.0.0.1:{port}"
    timeout = 900 if wrap else 60
    wait_http(f"{url}/health/ready", proc, timeout=timeout, ok=lambda r: r.status_code == 200)
    notes = [f"{workers} worker(s), log level {log_level}, auth + limits + queue + metrics on"]
    if redis_url:
        notes.append("limits in Redis")
    if extra_env:
        notes.append(" ".join(f"{k}={v}" for k, v in sorted(extra_env.items())))
    if build:
        notes.append(f"the build installed in {build}")
    return Subject(name, url, bearer(GATEWAY_KEY), proc, notes, workdir / "gateway.log")


def floor(
    group: Group,
    name: str,
    app: str,
    upstream: str,
    *,
    stream: bool,
    cpus: str | None,
    wrap: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
) -> Subject:
    """uvicorn as `tokengate serve` runs it, on one of `floor_app`'s bare apps (`canned`:
    no upstream; `relay`: aiohttp to `upstream`): the libraries' own cost, nothing else."""
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", f"tests.bench.floor_app:{app}", "--port", str(port)]
    cmd += ["--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
    cmd += ["--no-server-header", "--no-proxy-headers"]
    env = clean_env(FLOOR_UPSTREAM=upstream, FLOOR_CANNED="sse" if stream else "json")
    env.update(extra_env or {})
    proc = group.start(name, pinned([*(wrap or ()), *cmd], cpus), env=env)
    wait_port(port, proc, timeout=900 if wrap else 10)
    notes = [f"uvicorn (uvloop, httptools) on floor_app:{app}: no feature of tokengate"]
    # The upstream's key, which `relay` passes through as nginx-proxy does (`canned` reads none).
    return Subject(name, f"http://127.0.0.1:{port}", bearer(UPSTREAM_KEY), proc, notes)


def nginx_proxy(group: Group, name: str, prefix: Path, upstream: str, cpus: str | None) -> Subject:
    """nginx as the reference hop in front of `upstream` (see nginx.proxy_config)."""
    port = free_port()
    config = nginx.proxy_config(prefix, port, int(upstream.rsplit(":", 1)[1]))
    server = nginx.start(group, name, prefix, config, (port,), cpus)
    notes = ["nginx 1 worker, upstream keepalive 64, HTTP/1.1, proxy_buffering off"]
    url = f"http://127.0.0.1:{port}"
    return Subject("nginx-proxy", url, bearer(UPSTREAM_KEY), server.proc, notes)


def redis_server(group: Group, cpus: str | None = None) -> str | None:
    """A throwaway `redis-server` on a free loopback port (no persistence); its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        return None
    port = free_port()
    cmd = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    wait_port(port, group.start(f"redis-{port}", pinned(cmd, cpus)))
    return f"redis://127.0.0.1:{port}/0"


# -- LiteLLM ------------------------------------------------------------------------------


def litellm_bin() -> Path:
    return LITELLM_VENV / "bin" / "litellm"


def _stream_pip(cmd: list[str], deadline_s: float) -> None:
    """Run pip, echoing its progress lines (minus the local-index noise)."""
    started = time.monotonic()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pip:
        assert pip.stdout is not None
        try:
            for line in pip.stdout:
                if "is ignored" in line or not line.strip():
                    continue
                elapsed = time.monotonic() - started
                print(f"  [litellm install {elapsed:5.0f}s] {line.rstrip()[:150]}", flush=True)
                if elapsed > deadline_s:
                    raise TimeoutError(f"pip took longer than {deadline_s:.0f}s")
        finally:
            if pip.poll() is None:
                pip.kill()
        if pip.wait() != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {pip.returncode}")


def ensure_litellm(deadline_s: float = 900.0) -> Path:
    """Install `litellm[proxy]` into its own venv once; reuse it afterwards."""
    exe = litellm_bin()
    if exe.exists():
        return exe
    print(f"installing litellm[proxy] into {LITELLM_VENV} (first run only; minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
    pip = [str(LITELLM_VENV / "bin" / "python"), "-m", "pip"]
    _stream_pip([*pip, "install", "--progress-bar", "off", "litellm[proxy]"], deadline_s)
    if not exe.exists():
        raise RuntimeError(f"pip finished but {exe} is missing")
    return exe


def litellm_version() -> str:
    done = subprocess.run(
        [str(LITELLM_VENV / "bin" / "python"), "-m", "pip", "show", "litellm"],
        capture_output=True,
        text=True,
    )
    for line in done.stdout.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _litellm_config(upstream: str, api_key: str) -> str:
    return (
        "model_list:\n"
        "  - model_name: claude-sonnet\n"
        "    litellm_params:\n"
        "      model: openai/claude-sonnet\n"
        f"      api_base: {upstream}/v1\n"
        f"      api_key: {api_key}\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_MASTER_KEY}\n"
    )


def litellm(
    group: Group,
    name: str,
    workdir: Path,
    upstream: str,
    *,
    upstream_key: str = UPSTREAM_KEY,
    cpus: str | None = None,
) -> Subject:
    """`litellm --config config.yaml --port P --num_workers 1` (no database)."""
    exe = ensure_litellm()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.yaml"
    config.write_text(_litellm_config(upstream, upstream_key))
    port = free_port()
    # Loopback only: use the model cost map bundled with the package, not GitHub's.
    env = clean_env(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY="False")
    cmd = [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--num_workers", "1"]
    proc = group.start(name, pinned(cmd, cpus), env=env, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health/liveliness", proc, timeout=120, ok=lambda r: r.status_code == 200)
    notes = [f"litellm {litellm_version()}, 1 worker, master key, no database, default logging"]
    return Subject(name, url, bearer(LITELLM_MASTER_KEY), proc, notes)
