"""Helpers shared by the hardening suite: measuring a real gateway from outside.

Everything here observes processes through their public surfaces (HTTP, `/proc`), never
by importing their internals: RSS and open file descriptors from `/proc/<pid>`, tasks and
in-flight counts from `/admin/status`, the ledger from `/admin/usage`, upstream
concurrency from the simulator's `/_sim/stats`.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx

from tests.support.procs import Gateway, Sim
from tests.support.scrape import metric_sum as metric_sum  # the chaos tests import it here
from tests.support.waiting import wait_until

ADMIN = "adm-chaos-7f3a9c2e51b8d4a6"
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
PING = [{"role": "user", "content": "ping"}]
Make = Callable[..., Gateway]


def chat(model: str = "gpt-4o", max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": PING, "max_tokens": max_tokens, **extra}


def stream_chat(model: str = "gpt-4o", max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return chat(model, max_tokens, stream=True, stream_options={"include_usage": True}, **extra)


# -- process measurements ------------------------------------------------------------------
def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        lines = f.read().splitlines()
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settle_rss(pid: int, seconds: float = 3.0) -> float:
    """RSS after letting the process go idle (its allocator returns what it can)."""
    gc.collect()
    time.sleep(seconds)
    return rss_mib(pid)


# -- the gateway's own accounts -----------------------------------------------------------
def admin_status(gw: Gateway) -> dict[str, Any]:
    r = httpx.get(f"{gw.url}/admin/status", headers=ADMIN_H, timeout=10)
    r.raise_for_status()
    return dict(r.json())


def usage_rows(gw: Gateway) -> list[dict[str, Any]]:
    r = httpx.get(f"{gw.url}/admin/usage", headers=ADMIN_H, timeout=10)
    r.raise_for_status()
    return list(r.json()["data"])


def ledger_totals(gw: Gateway, model: str | None = None) -> dict[str, int]:
    names = (
        "requests",
        "errors",
        "prompt_tokens",
        "completion_tokens",
        "failed_prompt_tokens",
        "failed_completion_tokens",
    )
    out = dict.fromkeys(names, 0)
    for row in usage_rows(gw):
        if model is None or row["model"] == model:
            for n in names:
                out[n] += int(row[n])
    return out


def quiescent(gw: Gateway, sim: Sim | None = None) -> dict[str, Any]:
    """Wait until nothing is queued or in flight anywhere, then return the admin status."""

    def idle() -> bool:
        status = admin_status(gw)
        domains = status["domains"].values()
        busy = any(d["inflight"] or d["queue_depth"] for d in domains) or status["tasks"]
        return not busy and (sim is None or sim.stats()["inflight"] == 0)

    wait_until(idle, "the gateway and the upstream to go idle")
    return admin_status(gw)


# -- what clients got back ------------------------------------------------------------------
@dataclass
class Tally:
    """Outcomes as the clients saw them, and the usage the upstream reported in 200s."""

    statuses: dict[int | str, int] = field(default_factory=dict)
    prompt: int = 0
    completion: int = 0
    streamed_errors: int = 0
    missing_retry_after: list[int] = field(default_factory=list)
    bodies: list[str] = field(default_factory=list)

    def count(self, status: int | str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def add_usage(self, usage: dict[str, Any] | None) -> None:
        assert usage is not None, "a 200 answer without usage"
        self.prompt += int(usage["prompt_tokens"])
        self.completion += int(usage["completion_tokens"])

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


def sse_events(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def stream_usage(events: Iterable[Any]) -> dict[str, Any] | None:
    found = None
    for ev in events:
        if isinstance(ev, dict) and ev.get("usage"):
            found = ev["usage"]
    return found


async def send(
    session: aiohttp.ClientSession,
    gw: Gateway,
    body: dict[str, Any],
    tally: Tally,
    *,
    keep_body: bool = False,
) -> None:
    """One request; count its outcome; add its usage when it is a complete 200."""
    try:
        async with session.post(
            f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers()
        ) as r:
            raw = await r.read()
            text = raw.decode()
            if keep_body:
                tally.bodies.append(text)
            if r.status in (429, 503) and "retry-after" not in r.headers:
                tally.missing_retry_after.append(r.status)
            if r.status != 200:
                tally.count(r.status)
                return
            if body.get("stream"):
                events = sse_events(text)
                if any("error" in ev for ev in events) or not text.rstrip().endswith("[DONE]"):
                    tally.streamed_errors += 1
                    tally.count("stream_error")
                    return
                tally.add_usage(stream_usage(events))
            else:
                tally.add_usage(json.loads(raw)["usage"])
            tally.count(200)
    except (TimeoutError, aiohttp.ClientError) as exc:
        tally.count(type(exc).__name__)


async def burst(
    gw: Gateway,
    bodies: list[dict[str, Any]],
    *,
    concurrency: int = 200,
    timeout: float = 60,
    keep_body: bool = False,
) -> Tally:
    tally = Tally()
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as session:
        await asyncio.gather(*(send(session, gw, b, tally, keep_body=keep_body) for b in bodies))
    return tally


def assert_ledger_matches(gw: Gateway, tally: Tally, model: str | None = None) -> dict[str, int]:
    """The ledger bills exactly the usage the upstream reported in the answers clients got."""
    totals: dict[str, int] = {}

    def matches() -> bool:
        totals.update(ledger_totals(gw, model))
        return (totals["prompt_tokens"], totals["completion_tokens"]) == (
            tally.prompt,
            tally.completion,
        )

    try:
        wait_until(matches, "the ledger to settle")
    except TimeoutError:  # the assertion below names what differs
        pass
    assert (totals["prompt_tokens"], totals["completion_tokens"]) == (
        tally.prompt,
        tally.completion,
    ), f"ledger {totals} vs answers prompt={tally.prompt} completion={tally.completion}"
    return totals
