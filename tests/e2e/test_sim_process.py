"""`tokengate sim` as a process: what a test harness (or a developer's Ctrl-C) relies on."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import httpx

from tests.support.procs import Sim
from tests.support.waiting import wait_until


def test_sigterm_ends_the_sim_even_with_an_answer_stalled(make_sim: Callable[..., Sim]) -> None:
    # A stalled answer (the `stall_ms` fault) held the sim's shutdown for as long as the
    # stall: every test session ended waiting 15 s for it before killing it.
    sim = make_sim()
    sim.faults(stall_ms=600_000)

    def client() -> None:
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        auth = {"authorization": f"Bearer {sim.api_key}"}
        try:
            httpx.post(f"{sim.url}/v1/chat/completions", json=body, headers=auth, timeout=700)
        except httpx.HTTPError:
            pass  # cut by the shutdown: what a stalled client gets

    threading.Thread(target=client, daemon=True).start()
    wait_until(lambda: sim.stats()["inflight"] == 1, "the stalled answer to be in flight")
    # ended by the SIGTERM (uvicorn re-raises it once shut down), not killed by the
    # harness after its 15 s patience (-9)
    assert sim.stop() in (0, -signal.SIGTERM)
