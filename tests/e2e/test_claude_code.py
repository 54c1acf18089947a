"""The real Claude Code CLI (`claude -p`, npm `@anthropic-ai/claude-code`, installed by
`make claude-code`) through `tokengate serve` in front of `tokengate sim`, offline, in a
throwaway HOME with nothing of the outer environment.

It completes a one-line prompt with and without `--model` (its own default model id
reaches the sim through the `claude-*` pattern alias; without it, a 404 it reports), runs
a tool round trip (the sim asks for `Read`, Claude Code reads the file and sends the
result back), counts tokens through the gateway (`/context`), and works for several
turns on a key of 60,000 tokens a minute because the output reserved is an estimate,
where reserving its `max_tokens` (128,000) refuses it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import ROOT, UPSTREAM_KEY, Gateway, GatewaySpec, Sim, start_sim

Make = Callable[..., Gateway]
CLAUDE = Path(
    os.environ.get("TOKENGATE_CLAUDE_BIN", ROOT / ".cache/claude-code/node_modules/.bin/claude")
)
KEYS: dict[str, dict[str, Any]] = {
    "agent": {"tokens_per_minute": 60_000},  # rate_limit.reserve_output: estimate (default)
    "strict": {"tokens_per_minute": 60_000, "reserve_output": "max_tokens"},
}


@dataclass
class Run:
    code: int
    out: str
    err: str


@pytest.fixture(scope="module")
def claude_bin() -> Path:
    if not CLAUDE.exists():
        pytest.fail(f"Claude Code is not installed at {CLAUDE}: run `make claude-code`")
    return CLAUDE


@pytest.fixture(scope="module")
def _named_sim() -> Iterator[Sim]:
    """A sim that calls a tool only when the prompt names one: Claude Code sends its whole
    tool set on every turn, and a call for "say hi" would send it down sub-tasks."""
    s = start_sim("--tool-calls", "named")
    yield s
    s.stop()


@pytest.fixture
def sim(_named_sim: Sim) -> Sim:
    _named_sim.clear()
    return _named_sim


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.txt").write_text("hello from the tool test file 42\n")
    yield work


def claude(bin: Path, gw: Gateway, alias: str, cwd: Path, *args: str) -> Run:
    home = cwd.parent / f"home-{os.urandom(3).hex()}"
    home.mkdir()
    env = {
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "TERM": "dumb",
        "ANTHROPIC_BASE_URL": gw.url,
        "ANTHROPIC_API_KEY": gw.keys[alias],
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",  # a refusal is reported at once, not after 3 minutes
    }
    done = subprocess.run(
        [str(bin), *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def gateway(make_gateway: Make, sim: Sim, aliases: dict[str, str]) -> Gateway:
    spec = GatewaySpec(
        toml={"scale_up": {"api_style": "both"}},
        settings={"model_aliases": aliases},
        keys=KEYS,
    )
    return make_gateway(spec, sim.url)


def test_a_one_line_prompt_with_and_without_model(
    claude_bin: Path, make_gateway: Make, sim: Sim, workdir: Path
) -> None:
    gw = gateway(make_gateway, sim, {"claude-*": "claude-sonnet"})
    own_default = claude(claude_bin, gw, "agent", workdir, "-p", "say hi")
    assert own_default.code == 0, own_default
    named = claude(claude_bin, gw, "agent", workdir, "-p", "say hi", "--model", "claude-sonnet")
    assert named.code == 0, named
    first, second = sim.records("/v1/messages")
    assert first["body"]["model"] == "claude-sonnet" and first["body"]["stream"] is True
    assert second["body"]["model"] == "claude-sonnet"
    assert "claude-code-20250219" in first["headers"]["anthropic-beta"]  # passed through
    assert first["headers"]["x-api-key"] == UPSTREAM_KEY
    assert gw.keys["agent"] not in str(first["headers"])
    words = own_default.out.split()
    assert words and all(w.isalpha() and w.islower() for w in words)  # the sim's answer
    asked = [line["requested_model"] for line in gw.access() if line["endpoint"] == "messages"]
    assert asked[0].startswith("claude-") and asked[0] != "claude-sonnet"  # its own default
    assert asked[1] == "claude-sonnet"


def test_its_default_model_is_a_404_without_an_alias(
    claude_bin: Path, make_gateway: Make, sim: Sim, workdir: Path
) -> None:
    gw = gateway(make_gateway, sim, {})
    run = claude(claude_bin, gw, "agent", workdir, "-p", "say hi")
    assert run.code == 1 and "issue with the selected model" in run.out, run
    assert sim.records("/v1/messages") == []  # refused by the gateway, never sent


def test_a_tool_round_trip_and_token_counts(
    claude_bin: Path, make_gateway: Make, sim: Sim, workdir: Path
) -> None:
    gw = gateway(make_gateway, sim, {"claude-*": "claude-sonnet"})
    run = claude(claude_bin, gw, "agent", workdir, "-p", f"Use Read on {workdir}/hello.txt")
    assert run.code == 0, run
    ask, answer = sim.records("/v1/messages")
    (use,) = [b for b in ask_reply_blocks(answer) if b["type"] == "tool_use"]
    assert use["name"] == "Read" and use["input"] == {"file_path": f"{workdir}/hello.txt"}
    results = [b for b in answer["body"]["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert "hello from the tool test file 42" in str(results[0]["content"])
    assert answer["body"]["tools"] == ask["body"]["tools"]  # tools passed through unchanged

    context = claude(claude_bin, gw, "agent", workdir, "-p", "/context")
    assert context.code == 0, context
    counts = sim.records("/v1/messages/count_tokens")
    assert counts and all(r["status"] == 200 for r in counts)
    assert "token-counting-2024-11-01" in counts[0]["headers"]["anthropic-beta"]


def ask_reply_blocks(follow_up: dict[str, object]) -> list[dict[str, object]]:
    """The assistant turn Claude Code sent back: the sim's tool_use, as it received it."""
    messages = follow_up["body"]["messages"]  # type: ignore[index]
    assistant = [m for m in messages if m["role"] == "assistant"][-1]
    return list(assistant["content"])


def test_a_modest_key_serves_turn_after_turn_with_the_output_estimate(
    claude_bin: Path, make_gateway: Make, sim: Sim, workdir: Path
) -> None:
    gw = gateway(make_gateway, sim, {"claude-*": "claude-sonnet"})
    for n in range(4):
        run = claude(claude_bin, gw, "agent", workdir, "-p", f"turn {n}: say hi")
        assert run.code == 0, (n, run)
    sent = sim.records("/v1/messages")
    assert len(sent) == 4 and sent[0]["body"]["max_tokens"] > 60_000  # its own ceiling
    refused = claude(claude_bin, gw, "strict", workdir, "-p", "say hi")
    assert refused.code == 1 and "429" in refused.out, refused
    assert len(sim.records("/v1/messages")) == 4  # the strict key's request never left
