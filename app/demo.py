"""`make demo [PORT=8080] [SIM_PORT=9090]`: the shipped config against the built-in
simulated upstream.

Starts `tokengate sim` and `tokengate serve` on config/config.toml + config/settings.json
(unchanged seed files), overriding through the environment exactly what a local trial
needs: the upstream endpoint (the sim), its key, a demo gateway key, both API dialects
on the domain, and where logs and state go (var/). Both ports are checked first: a
taken one stops the demo before anything starts, naming it. Once the gateway answers
the demo key, prints the gateway's banner and snippets (curl, the OpenAI SDK, the
Anthropic SDK, an agent's tool round trip, readiness, metrics, `tokengate check`), each
of which runs as printed from the repository's root, then waits for Ctrl-C.
`--smoke` runs one SDK call itself and exits with its result (used by the tests).
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

from app import listen
from app.auth import digest, new_key

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
HOST = "127.0.0.1"


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-5:])
            raise SystemExit(
                f"demo: a process exited early (code {proc.returncode}); the end of {log}:\n{tail}"
            )
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"demo: {url} did not become ready in {timeout:.0f}s")


def _command(name: str) -> str:
    """This interpreter's `name` (python, tokengate) as a shell word that works from the
    directory the demo was started in: `.venv/bin/python` under `make demo`."""
    path = Path(sys.executable).parent / name
    relative = os.path.relpath(path, os.getcwd())
    return relative if not relative.startswith("..") else str(path)


def snippets(base: str, key: str) -> list[tuple[str, str]]:
    """(title, shell text) of each snippet, ready to paste; the tests run each one."""
    python, tokengate = _command("python"), _command("tokengate")
    ping = '[{"role": "user", "content": "ping"}]'
    return [
        (
            "a chat completion with curl",
            f"curl {base}/v1/chat/completions \\\n"
            f'  -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\\n'
            f'  -d \'{{"model": "claude-sonnet", "max_tokens": 8, "messages": {ping}}}\'',
        ),
        (
            "the OpenAI SDK",
            f"{python} - <<'PY'\n"
            "from openai import OpenAI\n"
            f'client = OpenAI(base_url="{base}/v1", api_key="{key}")\n'
            'r = client.chat.completions.create(model="claude-sonnet", max_tokens=8,\n'
            f"        messages={ping})\n"
            "print(r.choices[0].message.content, r.usage)\n"
            "PY",
        ),
        (
            "the Anthropic SDK (POST /v1/messages, the same domain)",
            f"{python} - <<'PY'\n"
            "from anthropic import Anthropic\n"
            f'client = Anthropic(base_url="{base}", api_key="{key}")\n'
            'm = client.messages.create(model="claude-sonnet", max_tokens=8,\n'
            f"        messages={ping})\n"
            "print(m.content[0].text, m.usage)\n"
            "PY",
        ),
        (
            "an agent's round trip: the model asks for a tool, the agent answers with its result",
            f"{python} - <<'PY'\n"
            "from openai import OpenAI\n"
            f'client = OpenAI(base_url="{base}/v1", api_key="{key}")\n'
            'tools = [{"type": "function", "function": {"name": "get_time",\n'
            '          "description": "The current UTC time", "parameters": {"type": "object",\n'
            '          "properties": {"zone": {"type": "string"}}}}}]\n'
            'messages = [{"role": "user", "content": "What time is it?"}]\n'
            'r = client.chat.completions.create(model="claude-sonnet", max_tokens=64,\n'
            "        messages=messages, tools=tools)\n"
            "asked = r.choices[0].message\n"
            "if asked.tool_calls:  # run each tool asked for, send the results back\n"
            "    messages.append(asked.model_dump(exclude_none=True))\n"
            "    for call in asked.tool_calls:\n"
            '        print("tool call:", call.function.name, call.function.arguments)\n'
            '        result = {"role": "tool", "tool_call_id": call.id, "content": "12:00"}\n'
            "        messages.append(result)\n"
            '    r = client.chat.completions.create(model="claude-sonnet", max_tokens=64,\n'
            "            messages=messages, tools=tools)\n"
            'print("answer:", r.choices[0].message.content)\n'
            "PY",
        ),
        ("readiness: every domain's state", f"curl {base}/health/ready"),
        ("metrics", f"curl -s {base}/metrics | grep '^tokengate_requests_total'"),
        (
            "the whole chain verified: models, a ping, 16 concurrent probes",
            f"TOKENGATE_API_KEY={key} {tokengate} check --target {base}",
        ),
    ]


def _text(base: str, sim_port: int, key: str) -> str:
    blocks = [f"# {title}\n{body}" for title, body in snippets(base, key)]
    return (
        f"\ntokengate is running at {base} (upstream: tokengate sim on port {sim_port}). "
        f"Demo key: {key}\nEach snippet below runs as printed, from {os.getcwd()}:\n\n"
        + "\n\n".join(blocks)
        + "\n\nCtrl-C stops both processes (gateway log: var/demo-gateway.log).\n"
    )


def _smoke(base: str, key: str) -> int:
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    r = client.chat.completions.create(
        model="claude-sonnet", messages=[{"role": "user", "content": "ping"}], max_tokens=8
    )
    print(f"smoke: {r.choices[0].message.content!r} usage={r.usage}")
    return 0 if r.choices and r.usage and r.usage.completion_tokens > 0 else 1


def _taken(port: int, sim_port: int) -> str | None:
    """Why the demo can not use these ports (with free ones to use instead), or None."""
    if port == sim_port:
        return f"PORT and SIM_PORT are both {port}: give them different values"
    for name, value in (("PORT", port), ("SIM_PORT", sim_port)):
        problem = listen.problem(HOST, value)
        if problem is not None:
            gateway = _free_after(port, avoid={sim_port})
            sim = _free_after(sim_port, avoid={gateway})
            return f"{name} {problem}. Try: make demo PORT={gateway} SIM_PORT={sim}"
    return None


def _free_after(port: int, avoid: set[int]) -> int:
    return next(
        (p for p in range(port + 1, port + 200) if p not in avoid and not listen.problem(HOST, p)),
        0,  # none nearby: port 0 lets the system pick
    )


def _fresh_database(port: int) -> Path:
    """A new SQLite file for this demo run (a trial's state is not kept: an older
    tokengate's file could hold a schema this one refuses)."""
    path = VAR / f"demo-{port}.sqlite3"
    for stale in VAR.glob(f"{path.name}*"):  # with its -wal, -shm and .lock
        stale.unlink()
    return path


def _environment(sim_port: int, upstream_key: str, key: str, db: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENGATE_")}
    env.update(
        TAOTOKEN_API_KEY=upstream_key,
        TOKENGATE_API_ENDPOINT=f"http://{HOST}:{sim_port}",
        TOKENGATE_KEYS=json.dumps([{"alias": "demo", "key_sha256": digest(key)}]),
        # the seed's single domain speaks both dialects here: /v1/messages works too
        TOKENGATE_SCALE_UP__API_STYLE="both",
        TOKENGATE_LOGGING__OUTPUT=str(VAR / "demo-gateway.log"),
        TOKENGATE_DATABASE__PATH=str(db),
    )
    return env


def _start(
    port: int, sim_port: int, env: dict[str, str], upstream_key: str
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    cli = [sys.executable, "-m", "app.cli"]
    sim_cmd = [*cli, "sim", "--port", str(sim_port), "--api-key", upstream_key]
    with open(VAR / "demo-sim.log", "ab") as sim_log, open(VAR / "demo-serve.log", "wb") as out:
        sim = subprocess.Popen(
            [*sim_cmd, "--tokens-per-sec", "200"], cwd=ROOT, env=env, stdout=sim_log, stderr=sim_log
        )
        gateway = subprocess.Popen(
            [*cli, "serve", "--port", str(port)], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    return sim, gateway


def _ours(base: str, key: str) -> None:
    """The gateway that answers is the one just started: it knows the demo key."""
    answer = httpx.get(f"{base}/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=5)
    if answer.status_code != 200:
        raise SystemExit(
            f"demo: {base} answered the demo key with {answer.status_code}: another gateway "
            "holds the port; stop it or choose PORT"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make demo")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--sim-port", type=int, default=9090)
    p.add_argument("--smoke", action="store_true", help="answer one SDK call, then stop")
    args = p.parse_args(argv)
    taken = _taken(args.port, args.sim_port)
    if taken is not None:
        print(f"demo: cannot start: {taken}", file=sys.stderr)
        return 1
    VAR.mkdir(exist_ok=True)
    upstream_key, key = "sk-sim-" + secrets.token_hex(12), new_key()
    env = _environment(args.sim_port, upstream_key, key, _fresh_database(args.port))
    sim, gateway = _start(args.port, args.sim_port, env, upstream_key)
    base = f"http://{HOST}:{args.port}"
    # Ctrl-C and SIGTERM both stop the demo and its two processes. Set explicitly: a shell
    # that starts a command in the background hands it SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler of its own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        _wait(f"http://{HOST}:{args.sim_port}/_sim/stats", sim, VAR / "demo-sim.log")
        _wait(f"{base}/health/ready", gateway, VAR / "demo-serve.log")
        _ours(base, key)
        if args.smoke:
            return _smoke(base, key)
        print((VAR / "demo-serve.log").read_text().rstrip(), flush=True)  # serve's banner
        print(_text(base, args.sim_port, key), flush=True)
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
