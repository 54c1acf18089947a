"""Record what the real coding agents send and expect, into `tests/fixtures/agents/`.

    make agents-refresh        (python -m tests.support.agents_record)

Each pinned client (Makefile: CODEX_VERSION, CLAUDE_CODE_VERSION) runs one agent turn
straight against `tokengate sim` standing in for its vendor's API (no gateway between):
Codex CLI over HTTP + SSE and over the WebSocket mode, Claude Code over the Messages API
with a tool round trip. The simulator records each request (headers, body, WebSocket
frames); for each, what the vendor answered (the stream's event types, the output item
types, the stop reason) is asked again of a fresh simulator and stored beside it. The
replay test (`tests/e2e/test_agent_corpus.py`) sends the same requests through the
gateway, in each upstream shape, and checks the client gets what it expects.

A client release is then one command and one diff: bump the version in the Makefile, run
`make agents-refresh`, read the diff of the fixture (new headers, betas, tool types).

Nothing secret or machine-specific is kept: credentials are dropped, and installation,
session and window ids, temporary paths and the user name are replaced by fixed
placeholders (`scrub`).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
import websockets.sync.client as ws_client

from tests.support.procs import ROOT, Sim, start_sim

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
FIXTURES = ROOT / "tests" / "fixtures" / "agents"
CODEX_MODEL = "local-model"  # not in Codex's catalogue: plain function tools
CLAUDE_MODEL = "claude-sonnet"
# Headers worth keeping: what the clients say about themselves and the API they speak.
KEPT = re.compile(
    r"^(anthropic-.*|openai-.*|x-stainless-.*|x-claude-code-.*|x-codex-.*|session[-_]id|"
    r"thread[-_]id|originator|user-agent|accept|content-type|x-app|version|"
    r"x-client-request-id)$"
)
DROPPED_HEADERS = ("x-codex-turn-metadata",)  # an installation id and machine details
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def scrub(value: Any, work: Path) -> Any:
    """The recorded value with every id and path that names this machine or run
    replaced by a placeholder (the same id, the same placeholder)."""
    text = json.dumps(value)
    text = text.replace(str(work), "/tmp/agent/work").replace(str(work.parent), "/tmp/agent")
    seen: dict[str, str] = {}
    text = _UUID.sub(
        lambda m: seen.setdefault(m.group(0), f"00000000-0000-4000-8000-{len(seen) + 1:012d}"), text
    )
    return json.loads(text)


def headers_of(record: dict[str, Any]) -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(record["headers"].items())
        if KEPT.match(k) and k not in DROPPED_HEADERS
    }


# -- running the clients ----------------------------------------------------------------


def codex_config(base: str, websockets: bool) -> str:
    return "\n".join(
        [
            f'model = "{CODEX_MODEL}"',
            'model_provider = "vendor"',
            'web_search = "disabled"',
            "[features]",
            "plugins = false",
            "unbounded_connection_retries = false",
            "[analytics]",
            "enabled = false",
            "[model_providers.vendor]",
            'name = "vendor"',
            f'base_url = "{base}/v1"',
            'env_key = "VENDOR_API_KEY"',
            'wire_api = "responses"',
            f"supports_websockets = {str(websockets).lower()}",
            "",
        ]
    )


def run_codex(codex: Path, sim: Sim, home: Path, websockets: bool) -> None:
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(codex_config(sim.url, websockets))
    work = home / "work"
    work.mkdir()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "VENDOR_API_KEY": sim.api_key,
    }
    args = [
        str(codex),
        "exec",
        "--strict-config",
        "--skip-git-repo-check",
        "--ephemeral",
        "-s",
        "danger-full-access",
        "Say PONG",
    ]
    done = subprocess.run(
        args,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"codex failed: {done.stderr[-2000:]}")


def run_claude(claude: Path, sim: Sim, home: Path) -> None:
    work = home / "work"
    work.mkdir(parents=True)
    (work / "hello.txt").write_text("hello from the corpus 42\n")
    env = {
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "TERM": "dumb",
        "ANTHROPIC_BASE_URL": sim.url,
        "ANTHROPIC_API_KEY": sim.api_key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }
    args = [str(claude), "-p", f"Use Read on {work}/hello.txt", "--model", CLAUDE_MODEL]
    done = subprocess.run(
        args,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"claude failed: {done.stdout[-1000:]} {done.stderr[-1000:]}")


def version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True)
    found = re.search(r"\d+\.\d+\.\d+", out.stdout)
    if found is None:
        raise SystemExit(f"no version in {out.stdout!r}")
    return found.group(0)


# -- what the vendor answered -------------------------------------------------------------


def expected(sim: Sim, record: dict[str, Any]) -> dict[str, Any]:
    """The vendor's answer to the HTTP request `record`, reduced to what a client relies
    on (WebSocket frames: `socket_expectations`)."""
    headers = {
        "authorization": f"Bearer {sim.api_key}",
        "x-api-key": sim.api_key,
        **headers_of(record),
    }
    r = httpx.post(sim.url + record["path"], json=record["body"], headers=headers, timeout=60)
    if not r.headers.get("content-type", "").startswith("text/event-stream"):
        return {"status": r.status_code, "keys": sorted(r.json())}
    lines = r.text.split("\n")  # not splitlines(): a JSON string may hold U+2028
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    return {"status": r.status_code, **summary(events)}


def summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"events": [e.get("type") for e in events]}
    final = next((e["response"] for e in events if e.get("type") == "response.completed"), None)
    if final is not None:
        out["output"] = [item["type"] for item in final.get("output") or []]
    stop = [e["delta"].get("stop_reason") for e in events if e.get("type") == "message_delta"]
    if stop:
        out["stop_reason"] = stop[-1]
    return out


def socket_expectations(sim: Sim, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The vendor's answers to a connection's frames, sent in order on one socket (a
    frame's `previous_response_id` names the response before it on that socket)."""
    out = []
    url = sim.url.replace("http", "ws") + "/v1/responses"
    with ws_client.connect(
        url, additional_headers={"authorization": f"Bearer {sim.api_key}"}
    ) as ws:
        last = None
        for frame in frames:
            if frame.get("generate") is False:  # a warm-up: answered by the sim as by OpenAI
                frame = {**frame, "input": frame.get("input") or []}
            if "previous_response_id" in frame and last is not None:
                frame = {**frame, "previous_response_id": last}
            ws.send(json.dumps(frame))
            events = []
            while True:
                event = json.loads(ws.recv(timeout=60))
                events.append(event)
                if event.get("type") in TERMINAL or event.get("type") == "error":
                    break
            last = (events[-1].get("response") or {}).get("id") or last
            out.append(summary(events))
    return out


def exchanges(sim: Sim, vendor: Sim, work: Path, paths: tuple[str, ...]) -> list[dict[str, Any]]:
    records = [r for r in sim.records() if r["path"] in paths]
    frames = [r["body"] for r in records if r["method"] == "WEBSOCKET"]
    answers = iter(socket_expectations(vendor, frames) if frames else [])
    out = []
    for record in records:
        socket = record["method"] == "WEBSOCKET"
        out.append(
            {
                "transport": "websocket" if socket else "http",
                "method": "GET" if socket else record["method"],
                "path": record["path"],
                "headers": headers_of(record),
                "body": record["body"],
                "expect": next(answers) if socket else expected(vendor, record),
            }
        )
    scrubbed: list[dict[str, Any]] = scrub(out, work)
    return scrubbed


def record(codex: Path, claude: Path, into: Path) -> list[Path]:
    into.mkdir(parents=True, exist_ok=True)
    written = []
    models = f"{CODEX_MODEL},{CLAUDE_MODEL}"
    with tempfile.TemporaryDirectory(prefix="agents-") as tmp:
        root = Path(tmp)
        for name, client in (("codex", codex), ("claude-code", claude)):
            named = ("--tool-calls", "named") if name == "claude-code" else ()
            sim = start_sim("--models", models, "--responses-websocket", *named)
            vendor = start_sim("--models", models, "--responses-websocket", *named)
            try:
                runs: list[dict[str, Any]] = []
                if name == "codex":
                    for websockets in (False, True):
                        home = root / f"codex-{websockets}"
                        run_codex(client, sim, home, websockets)
                        runs += exchanges(sim, vendor, home / "work", ("/v1/responses",))
                        sim.clear()
                else:
                    home = root / "claude"
                    run_claude(client, sim, home)
                    paths = ("/v1/messages", "/v1/messages/count_tokens")
                    runs += exchanges(sim, vendor, home / "work", paths)
            finally:
                sim.stop()
                vendor.stop()
            path = into / f"{name}.json"
            doc = {"client": name, "version": version(client), "exchanges": runs}
            path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            written.append(path)
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--codex", type=Path, default=ROOT / ".cache/npm/node_modules/.bin/codex")
    p.add_argument(
        "--claude", type=Path, default=ROOT / ".cache/claude-code/node_modules/.bin/claude"
    )
    p.add_argument("--into", type=Path, default=FIXTURES)
    args = p.parse_args()
    for path in record(args.codex, args.claude, args.into):
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
