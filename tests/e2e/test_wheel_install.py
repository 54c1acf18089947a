"""The container image's install and start, reproduced without a Docker engine.

The Dockerfile's steps, followed from the file itself where it can be read:
  builder  COPY its build inputs (honouring .dockerignore) -> `pip wheel`
  runtime  a fresh interpreter environment with only the wheel and its runtime deps,
           the repo's config/ under <root>/config, a writable <root>/var, the image's
           ENV (with /app/ mapped to <root>/), then its ENTRYPOINT `tokengate serve`
against a real `tokengate sim`; then its HEALTHCHECK command, one chat completion,
and a SIGTERM that must drain. pip may fetch dependencies from the index.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import ROOT, Sim, free_port, start_sim, stop, wait_http
from tests.unit.deploy.files import (
    dockerfile_stages,
    dockerignore_excludes,
    env_of,
    exec_form,
)

CLIENT_KEY = "tg-test-wheel-install-key"
DEV_ONLY = {"pytest", "ruff", "mypy", "hypothesis", "openai", "anthropic"}


@pytest.fixture
def sim() -> Iterator[Sim]:
    s = start_sim()
    yield s
    s.stop()


def _copy_build_inputs(dest: Path) -> None:
    """The builder stage's COPY instructions, from the repo into `dest` (its WORKDIR)."""
    builder = dockerfile_stages()[0]
    copies = [i.args.split() for i in builder.all("COPY") if "--from" not in i.args]
    assert copies, "the builder stage copies nothing"
    for *sources, target in copies:
        to = dest / target
        for pattern in sources:
            for src in sorted(ROOT.glob(pattern)):
                rel = src.relative_to(ROOT).as_posix()
                assert not dockerignore_excludes(rel), f"{rel} is copied but .dockerignored"
                if src.is_dir():  # Docker copies a directory's contents
                    shutil.copytree(src, to, ignore=_dockerignored, dirs_exist_ok=True)
                else:
                    assert target.endswith("/"), "file sources go into a directory"
                    to.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, to / src.name)


def _dockerignored(directory: str, names: list[str]) -> list[str]:
    rel = Path(directory).relative_to(ROOT)
    return [n for n in names if dockerignore_excludes((rel / n).as_posix())]


def _run(
    *argv: str | Path,
    timeout: float = 240,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    argv_s = [str(a) for a in argv]
    result = subprocess.run(
        argv_s, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, check=False
    )
    assert result.returncode == 0, f"{argv_s}\n{result.stdout}\n{result.stderr}"
    return result


def _build_and_install(tmp: Path) -> Path:
    src, wheels, venv = tmp / "src", tmp / "wheels", tmp / "venv"
    src.mkdir()
    _copy_build_inputs(src)
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", wheels, src)
    (wheel,) = wheels.glob("tokengate-*.whl")
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel, timeout=300)
    return venv


def _image_env(root: Path, sim: Sim, port: int) -> dict[str, str]:
    image = {
        k: v.replace("/app/", f"{root}/") if v.startswith("/app/") else v
        for k, v in env_of(dockerfile_stages()[-1]).items()
    }
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TOKENGATE_", "TAOTOKEN_", "PROMETHEUS_", "PYTHON", "VIRTUAL_ENV"))
    }
    digest = hashlib.sha256(CLIENT_KEY.encode()).hexdigest()
    env |= image | {
        # What `docker run -e ...` / a Compose file passes in.
        "TOKENGATE_HOST": "127.0.0.1",
        "TOKENGATE_PORT": str(port),
        "TOKENGATE_API_ENDPOINT": sim.url,
        "TAOTOKEN_API_KEY": sim.api_key,
        "TOKENGATE_KEYS": json.dumps([{"alias": "wheel", "key_sha256": digest}]),
    }
    return env


@pytest.mark.slow
def test_wheel_installs_and_serves(tmp_path: Path, sim: Sim) -> None:
    venv = _build_and_install(tmp_path)
    bin_dir = venv / "bin"

    installed = json.loads(_run(bin_dir / "python", "-m", "pip", "list", "--format", "json").stdout)
    names = {p["name"].lower() for p in installed}
    assert "tokengate" in names
    assert not names & DEV_ONLY, f"dev tools in the runtime install: {names & DEV_ONLY}"

    root = tmp_path / "root"  # the image's /app
    (root / "var").mkdir(parents=True)
    shutil.copytree(ROOT / "config", root / "config")
    port = free_port()
    env = _image_env(root, sim, port)

    where = _run(bin_dir / "python", "-c", "import app; print(app.__file__)", cwd=root, env=env)
    package = Path(where.stdout.strip()).parent
    assert package.is_relative_to(venv), f"imported {package}, not the installed wheel"
    assert (package / "limits" / "token_bucket.lua").is_file(), "the Redis script must ship"
    assert (package / "ui" / "static" / "app.js").is_file(), "the status page must ship"

    (entry, *args) = exec_form(dockerfile_stages()[-1].all("ENTRYPOINT")[-1])
    log = tmp_path / "stdout.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(bin_dir / entry), *args], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", proc=proc)
        health = httpx.get(f"{url}/health")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})

        (check,) = dockerfile_stages()[-1].all("HEALTHCHECK")
        probe, *probe_args = exec_form(check)
        _run(bin_dir / probe, *probe_args, env=env, timeout=60)
        assert httpx.get(f"{url}/health/ready").status_code == 200

        reply = httpx.post(
            f"{url}/v1/chat/completions",
            headers={"authorization": f"Bearer {CLIENT_KEY}"},
            json={"model": "claude-sonnet", "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["choices"][0]["message"]["content"]
        assert body["usage"]["completion_tokens"] > 0
        assert reply.headers["x-tokengate-domain"] == "domain-a"

        # The status page is served from the installed package, not the source tree.
        page = httpx.get(f"{url}/ui")
        assert page.status_code == 200 and "/ui/assets/app.js" in page.text
        for asset in ("app.js", "app.css", "icon.svg"):
            shipped = (package / "ui" / "static" / asset).read_bytes()
            assert httpx.get(f"{url}/ui/assets/{asset}").content == shipped, asset
    finally:
        code = stop(proc)
    # uvicorn re-raises the SIGTERM it caught once shutdown is complete, so a clean
    # drain ends as "terminated by SIGTERM" (143 in a shell); -9 would mean stop()
    # had to SIGKILL it.
    assert code in (0, -signal.SIGTERM), f"no clean drain (exit {code})\n{log.read_text()}"

    lines = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]
    assert any(ln.get("logger", "").startswith("tokengate") for ln in lines), "logs on stdout"
    assert any(ln["msg"].startswith("draining") for ln in lines), "SIGTERM must start a drain"
    assert (root / "var" / "tokengate.sqlite3").is_file(), "the database goes to the writable dir"
