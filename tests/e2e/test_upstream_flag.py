"""`tokengate serve --upstream sim:PORT` on the shipped files, from a shell that set
nothing: both dialects answer through a running `tokengate sim`, and a misspelt variable
is named at start with the one meant."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx

from tests.support.procs import SEED, Sim, cli_argv, free_port, stop, wait_http


def test_serve_upstream_sim_needs_no_variable(sim: Sim, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENGATE_", "TAOTOKEN_"))}
    env["TOKENGATE_SIM_API_KEY"] = sim.api_key  # the sim's own key (it was started with one)
    env["TOKENGATE_API_BASE"] = "http://elsewhere"  # a name tokengate does not read
    out = tmp_path / "serve.log"
    files = ["--config", str(SEED / "config.toml"), "--settings", str(SEED / "settings.json")]
    serve = ["serve", "--port", str(port), "--no-auth", "--upstream", f"sim:{sim.port}", *files]
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            cli_argv(*serve),
            cwd=tmp_path,  # its var/ (the database) goes here, not into the repository
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/health/ready", proc=proc, timeout=60)
        body = {
            "model": "claude-sonnet",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
        }
        chat = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
        assert chat.status_code == 200, chat.text
        messages = httpx.post(f"{base}/v1/messages", json=body, timeout=30)
        assert messages.status_code == 200 and messages.json()["type"] == "message"
        assert {r["path"] for r in sim.records()} >= {"/v1/chat/completions", "/v1/messages"}
    finally:
        stop(proc)
    printed = out.read_text()
    assert f"upstream http://127.0.0.1:{sim.port}" in printed
    assert "OpenAI and Anthropic APIs" in printed
    assert (
        "tokengate: warning: TOKENGATE_API_BASE is set, but tokengate reads no such variable "
        "(ignored); did you mean TOKENGATE_API_ENDPOINT?"
    ) in printed
