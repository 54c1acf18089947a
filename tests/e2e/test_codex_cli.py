"""OpenAI's Codex CLI (npm `@openai/codex`, pinned) through `tokengate serve` in front of
`tokengate sim`, offline, with a throwaway HOME: once over HTTP + SSE, once in the
WebSocket mode Codex tries first.

Each run is a whole agent turn: the sim answers Codex's request (which declares its
`exec_command` tool) with a function call whose command is a harmless `echo`; Codex
runs it and sends the output back; the sim answers that with text, which Codex prints.
`make test` installs the CLI (`make codex-cli`); without an npm registry it is skipped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.sim import response_shapes, text
from tests.e2e.test_limits import counter
from tests.support.procs import ROOT, Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
VERSION = "0.171.0"
CACHE = ROOT / ".cache" / "npm"
CODEX = CACHE / "node_modules" / ".bin" / "codex"
MODEL = "local-model"  # not in Codex's catalogue: plain function tools, no "lite" format


@pytest.fixture(scope="module")
def codex() -> Path:
    if CODEX.exists():
        return CODEX
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed (`make codex-cli` installs Debian's nodejs and npm)")
    done = subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(CACHE),
            "--no-audit",
            "--no-fund",
            f"@openai/codex@{VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0 or not CODEX.exists():
        pytest.skip(f"npm could not install @openai/codex@{VERSION}: {done.stderr.strip()[-300:]}")
    return CODEX


def config(gw: Gateway, websockets: bool) -> str:
    """docs/agents.md's copy-paste config.toml (so it stays true), pointed at this gateway."""
    doc = (ROOT / "docs" / "agents.md").read_text()
    section = doc[doc.index("**Codex CLI through tokengate**") :]
    block = section[section.index("```toml\n") + 8 : section.index("```\n", 8)]
    assert f'model = "{MODEL}"' in block and "supports_websockets = true" in block
    block = block.replace("http://127.0.0.1:8080", gw.url)
    return block.replace(
        "supports_websockets = true", f"supports_websockets = {str(websockets).lower()}"
    )


def run_codex(
    codex: Path, gw: Gateway, home: Path, websockets: bool
) -> subprocess.CompletedProcess[str]:
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(config(gw, websockets))
    work = home / "work"
    work.mkdir()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "TOKENGATE_API_KEY": gw.key,
    }
    return subprocess.run(
        # The command the sim asks for is an `echo`: no sandbox is needed to run it, and
        # none may be available in a CI container.
        [
            str(codex),
            "exec",
            "--strict-config",
            "--skip-git-repo-check",
            "--ephemeral",
            "-s",
            "danger-full-access",
            "Say PONG",
        ],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def check_turn(done: subprocess.CompletedProcess[str], sim: Sim) -> list[dict[str, Any]]:
    """Codex ran the sim's tool call and printed the sim's answer to its output."""
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = (r["body"] for r in sim.records("/v1/responses"))
    tool = next(t for t in first["tools"] if t.get("name") == "exec_command")
    # the call the sim made (deterministic: from the prompt and the tool's schema)
    words = text.reply_words(response_shapes.seed_of(first["input"]), 2)
    command = json.loads(response_shapes.arguments(tool, words))["cmd"]
    result = next(i for i in second["input"] if i.get("type") == "function_call_output")
    assert command.removeprefix("echo ") in result["output"]  # the command really ran
    answer = " ".join(text.reply_words(response_shapes.seed_of(second["input"]), 16))
    assert answer in done.stdout
    return [first, second]


@pytest.mark.parametrize(
    ("websockets", "upstream_socket"),
    [(False, False), (True, False), (True, True)],
    ids=["http-sse", "websocket", "websocket-to-upstream-websocket"],
)
def test_codex_exec_completes_a_turn_through_the_gateway(
    codex: Path,
    make_sim: Callable[..., Sim],
    make_gateway: Make,
    tmp_path: Path,
    websockets: bool,
    upstream_socket: bool,
) -> None:
    sim = make_sim("--models", MODEL, *(["--responses-websocket"] if upstream_socket else []))
    up = {"domain": "up", "api_base": sim.url, "api_key_env": "TAOTOKEN_API_KEY"}
    gw = make_gateway(
        GatewaySpec(
            toml={"scale_up": [{**up, "responses_websocket": upstream_socket}]},
            settings={"model_route": {"default": MODEL, "fallback": None}},
        )
    )
    done = run_codex(codex, gw, tmp_path / "home", websockets)
    sent = check_turn(done, sim)
    metrics = gw.metrics()
    assert counter(metrics, "tokengate_tokens_total", key="alice", kind="prompt") > 1000
    assert counter(metrics, "tokengate_tokens_total", key="alice", kind="completion") > 0
    # over the socket, Codex's warm-up is a request of the key's too (issue 31)
    answered = 3 if websockets else 2
    assert counter(metrics, "tokengate_requests_total", status="200") == answered
    endpoints = [line["endpoint"] for line in gw.access()]
    if websockets:
        assert endpoints == ["responses_ws.warmup", "responses_ws", "responses_ws"]
        assert counter(metrics, "tokengate_responses_websocket_upgrades_total", status="101") == 1
        assert counter(metrics, "tokengate_responses_websocket_messages_total", kind="warmup") == 1
        if upstream_socket:  # the upstream's socket holds the conversation: new items only
            assert sent[1]["previous_response_id"]
            assert [i["type"] for i in sent[1]["input"]] == ["function_call_output"]
        else:  # a stateless upstream gets whole conversations, no id it could not resolve
            assert all("previous_response_id" not in body for body in sent)
    else:
        assert endpoints == ["responses", "responses"]
        assert counter(metrics, "tokengate_responses_websocket_upgrades_total") == 0


@pytest.mark.parametrize("websockets", [False, True], ids=["http-sse", "websocket"])
def test_codex_exec_completes_a_turn_on_a_chat_only_upstream(
    codex: Path,
    make_sim: Callable[..., Sim],
    make_gateway: Make,
    tmp_path: Path,
    websockets: bool,
) -> None:
    """`responses = "chat"`: Codex's Responses requests (function and namespace tools)
    are translated onto chat completions, and its turn completes as against OpenAI."""
    sim = make_sim("--models", MODEL)
    up = {"domain": "up", "api_base": sim.url, "api_key_env": "TAOTOKEN_API_KEY"}
    gw = make_gateway(
        GatewaySpec(
            toml={"scale_up": [{**up, "responses": "chat"}]},
            settings={"model_route": {"default": MODEL, "fallback": None}},
        )
    )
    done = run_codex(codex, gw, tmp_path / "home", websockets)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sim.records("/v1/responses") == []
    first, second = (r["body"] for r in sim.records("/v1/chat/completions"))
    names = [t["function"]["name"] for t in first["tools"]]
    assert "exec_command" in names
    assert any(n.startswith("multi_agent_v1__") for n in names)  # a namespace, flattened
    (call,) = [m for m in second["messages"] if m.get("tool_calls")][-1]["tool_calls"]
    (result,) = [m for m in second["messages"] if m.get("tool_call_id") == call["id"]]
    assert "exited with code" in result["content"]  # Codex ran the call and sent its output back
    # the sim's answer to that request (deterministic) is what Codex printed
    again = {k: v for k, v in second.items() if k not in ("stream", "stream_options")}
    reply = httpx.post(
        f"{sim.url}/v1/chat/completions",
        json=again,
        headers={"authorization": f"Bearer {sim.api_key}"},
        timeout=30,
    ).json()["choices"][0]["message"]["content"]
    assert reply in done.stdout
    # two turns, and over the socket Codex's warm-up is a request of the key's too (issue 31)
    answered = 3 if websockets else 2
    assert counter(gw.metrics(), "tokengate_requests_total", status="200") == answered
