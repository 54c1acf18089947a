"""`make demo` as a newcomer meets it: the shipped config against the simulator, every
printed snippet run exactly as printed, and a second demo on taken ports refused before
anything says it is running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.commands.demo_text import CLAUDE, CODEX
from tests.support.procs import ROOT, free_port


def test_demo_answers_a_chat_completion_through_the_openai_sdk() -> None:
    port, sim_port = free_port(), free_port()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.commands.demo",
            "--smoke",
            "--port",
            str(port),
            "--sim-port",
            str(sim_port),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "smoke: " in proc.stdout and "completion_tokens=8" in proc.stdout
    assert "stopped tokengate and the simulated upstream" in proc.stdout


def newcomer_env() -> dict[str, str]:
    """A shell that never configured tokengate."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("TOKENGATE_", "TAOTOKEN_"))}


class Demo:
    def __init__(self, port: int, sim_port: int, env: dict[str, str] | None = None) -> None:
        self.port, self.sim_port = port, sim_port
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.commands.demo",
                "--port",
                str(port),
                "--sim-port",
                str(sim_port),
            ],
            cwd=ROOT,
            env=newcomer_env() | (env or {}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            self.printed = self._read_until("Ctrl-C stops both processes")
        except BaseException:
            self.stop()
            raise

    def _read_until(self, marker: str, timeout: float = 90) -> str:
        assert self.proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError("the demo ended early:\n" + "".join(lines))
            lines.append(line)
            if marker in line:
                return "".join(lines)
        raise AssertionError("the demo printed no snippets in time:\n" + "".join(lines))

    def snippets(self) -> list[tuple[str, str]]:
        """(title, text) of each `# title` block, as printed."""
        found = re.findall(r"^# (.+)\n((?:.+\n)+?)\n", self.printed, re.M)
        return [(title, body) for title, body in found]

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # Ctrl-C
        rest, _ = self.proc.communicate(timeout=30)  # and the pipe is closed
        return rest


@pytest.fixture
def demo() -> Iterator[Demo]:
    running = Demo(free_port(), free_port())
    yield running
    if running.proc.poll() is None:
        running.stop()


def agents_installed() -> None:
    for path, target in ((CLAUDE, "claude-code"), (CODEX, "codex-cli")):
        if not path.exists():
            pytest.fail(f"{path} is not installed: run `make {target}`")


def test_every_printed_snippet_runs_as_printed(demo: Demo, tmp_path: Path) -> None:
    """Both agents included: each finishes a prompt with a tool round trip."""
    agents_installed()
    assert f"listening on http://127.0.0.1:{demo.port}" in demo.printed  # serve's banner
    assert "Demo key: tg-" in demo.printed
    home = tmp_path / "home"  # where the agents keep their state: not this machine's HOME
    home.mkdir()
    ran = {}
    for title, body in demo.snippets():
        done = subprocess.run(
            ["bash", "-c", body],
            cwd=ROOT,
            env=newcomer_env() | {"HOME": str(home)},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"{title}:\n{body}\n{done.stdout}{done.stderr}"
        ran[title] = done.stdout
    assert len(ran) == 9, list(ran)
    out = list(ran.values())
    assert '"choices"' in out[0] and '"completion_tokens":8' in out[0]  # curl
    assert "completion_tokens=8" in out[1]  # the OpenAI SDK
    assert "output_tokens=8" in out[2]  # the Anthropic SDK, on the same domain
    assert "tool call: get_time" in out[3]  # asked to, the sim called the tool
    assert "answer:" in out[3]  # and the agent's round trip ran to its end
    assert '"status":"ready"' in out[6]
    assert 'status="200"' in out[7]
    assert "16/16 ok" in out[8] and out[8].rstrip().splitlines()[-1].startswith("OK")
    assert "invalid configuration" not in out[8] and "is not set" not in out[8]
    claude, codex = tool_round_trips(demo)
    assert claude["name"] == "Read" and claude["input"] == {"file_path": f"{ROOT}/README.md"}
    assert claude["result"].startswith("1\t# tokengate")  # Claude Code read the file
    assert codex["name"] == "exec_command" and codex["output"]  # Codex ran the command
    for printed in (out[4], out[5]):  # each printed the sim's closing answer: its words
        words = printed.split()
        assert words and all(w.isalpha() and w.islower() for w in words), printed
    assert "stopped tokengate and the simulated upstream" in demo.stop()


def tool_round_trips(demo: Demo) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the sim saw of each agent: the call it made, the result that came back."""
    sim = f"http://127.0.0.1:{demo.sim_port}/_sim/records"
    messages = httpx.get(sim, params={"path": "/v1/messages"}).json()
    (told,) = [  # the request that brought a tool's result back
        m
        for r in messages
        if isinstance((m := r["body"]["messages"])[-1]["content"], list)
        and any(b.get("type") == "tool_result" for b in m[-1]["content"])
    ]
    (use,) = [b for b in told[-2]["content"] if b["type"] == "tool_use"]
    (result,) = [b for b in told[-1]["content"] if b["type"] == "tool_result"]
    responses = httpx.get(sim, params={"path": "/v1/responses"}).json()
    second = responses[-1]["body"]["input"]
    call = next(i for i in second if i.get("type") == "function_call")
    output = next(i for i in second if i.get("type") == "function_call_output")
    return (
        {
            "name": use["name"],
            "input": use["input"],
            "result": str(result["content"]),
        },
        {"name": call["name"], "output": output["output"]},
    )


def test_a_second_demo_on_taken_ports_says_which_before_starting(demo: Demo) -> None:
    def second(port: int, sim_port: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["make", "--no-print-directory", "demo", f"PORT={port}", f"SIM_PORT={sim_port}"],
            cwd=ROOT,
            env=newcomer_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    same = second(demo.port, free_port())
    assert same.returncode != 0
    assert f"demo: cannot start: PORT 127.0.0.1:{demo.port} is already in use" in same.stderr
    assert "Try: make demo PORT=" in same.stderr
    assert "running" not in same.stdout
    sim_taken = second(free_port(), demo.sim_port)
    assert sim_taken.returncode != 0
    assert f"SIM_PORT 127.0.0.1:{demo.sim_port} is already in use" in sim_taken.stderr
    assert demo.proc.poll() is None  # the first demo never noticed


def test_the_users_variables_win_are_listed_and_the_status_page_opens() -> None:
    own_admin = "tg-admin-of-my-own-0123456789"
    demo = Demo(
        free_port(),
        free_port(),
        env={
            "TOKENGATE_RATE_LIMIT__REQUESTS_PER_MINUTE": "900",
            "TOKENGATE_ADMIN_KEY": own_admin,
            "TOKENGATE_LOGGING_OUTPUT": "stdout",  # a typo: the `__` is missing
        },
    )
    try:
        printed = demo.printed
        assert "TOKENGATE_RATE_LIMIT__REQUESTS_PER_MINUTE=900" in printed
        assert "TOKENGATE_ADMIN_KEY=***" in printed and own_admin not in printed
        assert (
            "TOKENGATE_LOGGING_OUTPUT is set, but tokengate reads no such variable (ignored); "
            "did you mean TOKENGATE_LOGGING__OUTPUT?"
        ) in printed
        base = f"http://127.0.0.1:{demo.port}"
        assert f"Status page: {base}/ui (enter the admin key you set" in printed
        assert httpx.get(f"{base}/ui").status_code == 200
        admin = {"authorization": f"Bearer {own_admin}"}
        status = httpx.get(f"{base}/admin/status", headers=admin).json()
        (key,) = status["limits"]["keys"]
        assert key["alias"] == "demo" and key["limits"]["requests_per_minute"] == 900
    finally:
        demo.stop()


def test_a_newcomer_gets_the_status_page_with_a_demo_admin_key(demo: Demo) -> None:
    (line,) = [x for x in demo.printed.splitlines() if x.startswith("Status page: ")]
    base = f"http://127.0.0.1:{demo.port}"
    found = re.fullmatch(rf"Status page: {base}/ui \(enter the demo's admin key: (\S+)\)", line)
    assert found, line
    assert "Your shell sets no TOKENGATE_* variable" in demo.printed
    snapshot = httpx.get(
        f"{base}/admin/ui/snapshot", headers={"authorization": f"Bearer {found[1]}"}
    )
    assert snapshot.status_code == 200 and snapshot.json()["keys"][0]["alias"] == "demo"
