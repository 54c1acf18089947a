"""`make demo`: the shipped config against the built-in simulated upstream.

Starts `tokengate sim` and `tokengate serve` on config/config.toml + config/settings.json
(unchanged seed files), overriding through the environment exactly what a local trial
needs: the upstream endpoint (the sim), its key, a demo gateway key and log output.
Prints a curl line and an OpenAI-SDK snippet, then waits for Ctrl-C and stops both.
`--smoke` runs the SDK snippet itself and exits with its result (used by the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from app.auth import digest, new_key

ROOT = Path(__file__).resolve().parent.parent


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"demo: a process exited early (code {proc.returncode}); see var/")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"demo: {url} did not become ready in {timeout:.0f}s")


def _snippet(base: str, key: str) -> str:
    return f"""
tokengate is running at {base} (upstream: tokengate sim). Demo key: {key}

  curl {base}/v1/chat/completions \\
    -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
    -d '{{"model": "claude-sonnet", "max_tokens": 8,
         "messages": [{{"role": "user", "content": "ping"}}]}}'

  python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{base}/v1", api_key="{key}")
r = client.chat.completions.create(model="claude-sonnet",
        messages=[{{"role": "user", "content": "ping"}}], max_tokens=8)
print(r.choices[0].message.content, r.usage)
PY

  metrics: curl {base}/metrics    readiness: curl {base}/health/ready
  verify:  TOKENGATE_API_KEY={key} .venv/bin/tokengate check --target {base}

Ctrl-C stops both processes.
"""


def _smoke(base: str, key: str) -> int:
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    r = client.chat.completions.create(
        model="claude-sonnet", messages=[{"role": "user", "content": "ping"}], max_tokens=8
    )
    print(f"smoke: {r.choices[0].message.content!r} usage={r.usage}")
    return 0 if r.choices and r.usage and r.usage.completion_tokens > 0 else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make demo")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--sim-port", type=int, default=9090)
    p.add_argument("--smoke", action="store_true", help="answer one SDK call, then stop")
    args = p.parse_args(argv)
    var = ROOT / "var"
    var.mkdir(exist_ok=True)
    upstream_key, key = "sk-sim-" + secrets.token_hex(12), new_key()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENGATE_")}
    env.update(
        TAOTOKEN_API_KEY=upstream_key,
        TOKENGATE_API_ENDPOINT=f"http://127.0.0.1:{args.sim_port}",
        TOKENGATE_KEYS=json.dumps([{"alias": "demo", "key_sha256": digest(key)}]),
        TOKENGATE_LOGGING__OUTPUT=str(var / "demo-gateway.log"),
        TOKENGATE_DATABASE__PATH=str(var / "demo-tokengate.sqlite3"),
    )
    cli = [sys.executable, "-m", "app.cli"]
    with open(var / "demo-sim.log", "ab") as sim_log, open(var / "demo-serve.log", "ab") as gw_log:
        sim = subprocess.Popen(
            [
                *cli,
                "sim",
                "--port",
                str(args.sim_port),
                "--api-key",
                upstream_key,
                "--tokens-per-sec",
                "200",
            ],
            cwd=ROOT,
            env=env,
            stdout=sim_log,
            stderr=sim_log,
        )
        gateway = subprocess.Popen(
            [*cli, "serve", "--port", str(args.port)],
            cwd=ROOT,
            env=env,
            stdout=gw_log,
            stderr=gw_log,
        )
    base = f"http://127.0.0.1:{args.port}"
    try:
        _wait(f"http://127.0.0.1:{args.sim_port}/_sim/stats", sim)
        _wait(f"{base}/health/ready", gateway)
        if args.smoke:
            return _smoke(base, key)
        print(_snippet(base, key), flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        while gateway.poll() is None and sim.poll() is None:
            time.sleep(0.5)
        return 1  # one of them died on its own

    except KeyboardInterrupt:
        return 0
    finally:
        for proc in (gateway, sim):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (gateway, sim):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        print("demo: stopped tokengate and the simulated upstream", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
