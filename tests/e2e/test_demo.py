"""`make demo` runs the shipped config against the simulator and answers through the SDK."""

from __future__ import annotations

import subprocess
import sys

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
