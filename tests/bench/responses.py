"""The Responses API's cost through the gateway: `python -m tests.bench.responses`.

One `tokengate sim` and one `tokengate serve` (one worker) on loopback. Sequential
requests (c = 1) with a Codex-sized body (a ~17 KB developer prompt, four function tools,
a user message: ~27 KB of JSON, like Codex CLI's first turn), each streamed to its end:

- chat completions through the gateway (the baseline the gateway was tuned on),
- the Responses API straight to the sim, through the gateway over HTTP + SSE, through the
  gateway's WebSocket mode (one connection, one `response.create` per turn) bridged over
  HTTP + SSE, and the same bridged to the sim's own WebSocket mode.

Reported per path: p50 / p99 wall time of a whole streamed answer, and the gateway's CPU
time per request (from /proc: utime + stime of its process). Figures are ratios against
chat in the same run; absolute numbers depend on the machine.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import websockets.sync.client as ws_client

from tests.support.procs import GatewaySpec, start_gateway, start_sim

N = int(os.environ.get("BENCH_N", "300"))
WARMUP = 30
TOOL = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command in a PTY. " * 20,
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}},
        "required": ["cmd"],
    },
}
SYSTEM = "You are a coding agent running in a terminal. Be precise, safe and helpful. " * 220


def responses_body() -> dict[str, Any]:
    return {
        "model": "gpt-4o",
        "stream": True,
        "store": False,
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": SYSTEM}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Say PONG"}],
            },
        ],
        "tools": [{**TOOL, "name": f"tool_{i}"} for i in range(4)],
        "tool_choice": "none",
        "prompt_cache_key": "bench",
    }


def chat_body() -> dict[str, Any]:
    return {
        "model": "gpt-4o",
        "stream": True,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Say PONG"},
        ],
    }


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(one: Callable[[], None], pid: int | None) -> dict[str, float]:
    for _ in range(WARMUP):
        one()
    cpu0 = cpu_seconds(pid) if pid else 0.0
    times = []
    for _ in range(N):
        t0 = time.perf_counter()
        one()
        times.append((time.perf_counter() - t0) * 1000)
    cpu = round((cpu_seconds(pid) - cpu0) / N * 1e6) if pid else -1
    q = statistics.quantiles(times, n=100)
    return {"p50_ms": round(q[49], 3), "p99_ms": round(q[98], 3), "cpu_us_per_req": cpu}


def http_stream(
    client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]
) -> Callable[[], None]:
    data = json.dumps(body).encode()

    def one() -> None:
        with client.stream("POST", url, content=data, headers=headers) as r:
            assert r.status_code == 200, r.read()
            for _ in r.iter_bytes():
                pass

    return one


def socket_turn(conn: Any) -> Callable[[], None]:
    message = json.dumps({"type": "response.create", **responses_body()})

    def one() -> None:
        conn.send(message)
        while True:
            event = json.loads(conn.recv())
            if event["type"] in ("response.completed", "error"):
                assert event["type"] == "response.completed", event
                return

    return one


def spec(**toml: Any) -> GatewaySpec:
    return GatewaySpec(
        toml=toml,
        keys={"bench": {"tokens_per_minute": 10**9, "requests_per_minute": 10**6}},
        settings={"logging": {"level": "warning"}},
    )


def main() -> int:
    sim = start_sim("--reply-tokens", "32", "--responses-websocket")
    work = Path(tempfile.mkdtemp(prefix="bench-responses-"))
    gw = start_gateway(work / "http", spec(), sim.url)
    up = {"domain": "up", "api_base": sim.url, "api_key_env": "TAOTOKEN_API_KEY"}
    bridged = start_gateway(work / "ws", spec(scale_up=[{**up, "responses_websocket": True}]))
    sim_headers = {"authorization": f"Bearer {sim.api_key}", "content-type": "application/json"}
    gw_headers = {**gw.headers(), "content-type": "application/json"}
    results: dict[str, dict[str, float]] = {}
    try:
        with httpx.Client(timeout=30) as client:
            results["chat via gateway"] = measure(
                http_stream(client, f"{gw.url}/v1/chat/completions", chat_body(), gw_headers),
                gw.proc.pid,
            )
            results["responses direct"] = measure(
                http_stream(client, f"{sim.url}/v1/responses", responses_body(), sim_headers), None
            )
            results["responses via gateway (SSE)"] = measure(
                http_stream(client, f"{gw.url}/v1/responses", responses_body(), gw_headers),
                gw.proc.pid,
            )
        for name, g in (("", gw), (" -> upstream WebSocket", bridged)):
            url = g.url.replace("http", "ws") + "/v1/responses"
            with ws_client.connect(url, additional_headers=g.headers(), max_size=None) as conn:
                results[f"responses via gateway (WebSocket{name})"] = measure(
                    socket_turn(conn), g.proc.pid
                )
    finally:
        gw.stop()
        bridged.stop()
        sim.stop()
    base = results["chat via gateway"]
    print(f"N={N} sequential streamed requests, body {len(json.dumps(responses_body()))} bytes")
    for name, r in results.items():
        ratio = (
            r["cpu_us_per_req"] / base["cpu_us_per_req"]
            if r["cpu_us_per_req"] == r["cpu_us_per_req"]
            else float("nan")
        )
        print(
            f"{name:58s} p50 {r['p50_ms']:8.3f} ms  p99 {r['p99_ms']:8.3f} ms  "
            f"gateway CPU {r['cpu_us_per_req']:>6} us/req  (x{ratio:.2f} of chat)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
