"""`make demo [PORT=8080] [SIM_PORT=9090]`: the shipped config against the built-in
simulated upstream, the whole product in miniature.

Starts `tokengate sim` (tool calls only when a request asks for one, as a model makes
them) and `tokengate serve` on config/config.toml + config/settings.json (unchanged seed
files), overriding through the environment what a local trial needs: the upstream
endpoint (the sim), its key, a demo gateway key, a demo admin key (the status page at
`/ui`), both API dialects on the domain, a `claude-*` alias for Claude Code's own
default model, and where logs and state go (var/). Every `TOKENGATE_*` variable of the
user's shell wins over these defaults and is listed. Both ports are checked first: a
taken one stops the demo before anything starts, naming it. Once the gateway answers
the demo key, prints the gateway's banner, the status page's address and the snippets
of `app.commands.demo_text` (curl, the SDKs, a tool round trip, Claude Code, Codex,
readiness, metrics, `tokengate check`), each of which runs as printed from the repository's root,
then waits for Ctrl-C. `--smoke` runs one SDK call itself and exits with its result
(used by the tests).
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
from app.commands import demo_text

ROOT = Path(__file__).resolve().parents[2]  # the repository
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


def _text(base: str, sim_port: int, key: str, admin_key: str | None, user: dict[str, str]) -> str:
    blocks = [f"# {title}\n{body}" for title, body in demo_text.snippets(base, key)]
    return (
        f"\ntokengate is running at {base} (upstream: tokengate sim on port {sim_port}). "
        f"Demo key: {key}\n{demo_text.page(base, admin_key)}\n{demo_text.honoured(user)}\n"
        f"Each snippet below runs as printed, from {os.getcwd()}:\n\n"
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


def user_variables(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The `TOKENGATE_*` variables the user's shell sets: they win over the demo's."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k.upper().startswith("TOKENGATE_")}


def _with_demo_key(keys: str | None, key: str) -> str:
    """The gateway keys: the user's `TOKENGATE_KEYS` (if any) and the demo's own."""
    demo = {"alias": "demo", "key_sha256": digest(key)}
    try:
        mine = json.loads(keys) if keys else []
    except ValueError:
        return keys or ""  # serve names the bad value
    return json.dumps([*mine, demo]) if isinstance(mine, list) else (keys or "")


def _environment(
    sim_port: int, upstream_key: str, key: str, admin_key: str, db: Path
) -> dict[str, str]:
    env = dict(os.environ)
    user = user_variables(env)
    defaults = {
        "TOKENGATE_API_ENDPOINT": f"http://{HOST}:{sim_port}",
        # the seed's single domain speaks both dialects here: /v1/messages works too
        "TOKENGATE_SCALE_UP__API_STYLE": "both",
        # Claude Code asks for its own default model (a new id each release)
        "TOKENGATE_MODEL_ALIASES": json.dumps({"claude-*": demo_text.MODEL}),
        "TOKENGATE_LOGGING__OUTPUT": str(VAR / "demo-gateway.log"),
        "TOKENGATE_DATABASE__PATH": str(db),
        "TOKENGATE_ADMIN_KEY": admin_key,
    }
    env |= {k: v for k, v in defaults.items() if k not in user}
    env["TOKENGATE_KEYS"] = _with_demo_key(user.get("TOKENGATE_KEYS"), key)
    env["TAOTOKEN_API_KEY"] = upstream_key  # the sim's; never a real key of the shell's
    return env


def _start(
    port: int, sim_port: int, env: dict[str, str], upstream_key: str
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    cli = [sys.executable, "-m", "app.commands.cli"]
    sim_cmd = [*cli, "sim", "--port", str(sim_port), "--api-key", upstream_key]
    with open(VAR / "demo-sim.log", "ab") as sim_log, open(VAR / "demo-serve.log", "wb") as out:
        sim = subprocess.Popen(
            # a tool call only when a request asks for one, as a model would: agents send
            # their whole tool set on every turn
            [*sim_cmd, "--tokens-per-sec", "200", "--tool-calls", "named"],
            cwd=ROOT,
            env=env,
            stdout=sim_log,
            stderr=sim_log,
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
    user = user_variables()
    admin_key = None if "TOKENGATE_ADMIN_KEY" in user else "tg-admin-" + secrets.token_hex(12)
    env = _environment(
        args.sim_port, upstream_key, key, admin_key or "", _fresh_database(args.port)
    )
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
        print(_text(base, args.sim_port, key, admin_key, user), flush=True)
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
