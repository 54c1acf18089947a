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

import pytest

from tests.support.procs import ROOT, free_port


def test_demo_answers_a_chat_completion_through_the_openai_sdk() -> None:
    port, sim_port = free_port(), free_port()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.demo",
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
    def __init__(self, port: int, sim_port: int) -> None:
        self.port, self.sim_port = port, sim_port
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.demo", "--port", str(port), "--sim-port", str(sim_port)],
            cwd=ROOT,
            env=newcomer_env(),
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


def test_every_printed_snippet_runs_as_printed(demo: Demo) -> None:
    assert f"listening on http://127.0.0.1:{demo.port}" in demo.printed  # serve's banner
    assert "Demo key: tg-" in demo.printed
    ran = {}
    for title, body in demo.snippets():
        done = subprocess.run(
            ["bash", "-c", body], cwd=ROOT, env=newcomer_env(), capture_output=True, text=True
        )
        assert done.returncode == 0, f"{title}:\n{body}\n{done.stdout}{done.stderr}"
        ran[title] = done.stdout
    assert len(ran) == 7, list(ran)
    out = list(ran.values())
    assert '"choices"' in out[0] and '"completion_tokens":8' in out[0]  # curl
    assert "completion_tokens=8" in out[1]  # the OpenAI SDK
    assert "output_tokens=8" in out[2]  # the Anthropic SDK, on the same domain
    assert "tool call: get_time" in out[3]  # the sim asked for the tool (deterministic)
    assert "answer:" in out[3]  # and the agent's round trip ran to its end
    assert '"status":"ready"' in out[4]
    assert 'status="200"' in out[5]
    assert "16/16 ok" in out[6] and out[6].rstrip().splitlines()[-1].startswith("OK")
    assert "stopped tokengate and the simulated upstream" in demo.stop()


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
