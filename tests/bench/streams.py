"""Scenario "streams": what a streamed answer costs per event, and held open by the thousand.

1. **CPU per SSE chunk.** `tokengate sim` streams `CHUNK_TOKENS` tokens per answer, one
   event every millisecond (each arrives on its own, as a model's tokens do), to wrk at
   c = `CHUNK_CONCURRENCY` through nginx-proxy, floor-relay (uvicorn + aiohttp relaying,
   nothing of tokengate: the floor of this stack) and tokengate-1w; cells interleaved for
   `CHUNK_ROUNDS` rounds. CPU per chunk = the subject's CPU over the cells / (answers x
   the events a client receives per answer). With that many events per answer the
   per-request cost is spread thin (tokengate's ~300 µs over 258 events is ~1 µs of each
   figure); both subjects relay the same events, so the ratio is the relay's cost.
2. **Open streams.** `OPEN_STREAMS` streams held open at once through tokengate-1w (its
   domain's `max_inflight` raised above that, as a deployment serving them would set it)
   and nginx-proxy, in front of a sim that sends one token every `OPEN_TOKEN_GAP_S`
   seconds: a client in this process opens them all, waits for each one's first event,
   holds them `HOLD_S` seconds while the subject's RSS (its whole process tree) is
   sampled, then hangs up. Reported: RSS before, the peak while all were open, and the
   increment per stream.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.bench import common, latency, rss, subjects
from tests.bench.common import Plan
from tests.bench.procs import Group
from tests.bench.subjects import Subject

CHUNK_TOKENS = 256
CHUNK_TOKENS_PER_SEC = 1000.0
CHUNK_CONCURRENCY = 16
CHUNK_ROUNDS = 2
OPEN_STREAMS = 2000
OPEN_TOKEN_GAP_S = 0.5
OPEN_REPLY_TOKENS = 120  # 60 s of stream, longer than the scenario holds them
HOLD_S = 3.0
OPEN_LIMIT_ENV = {"TOKENGATE_TOKEN_SCHEDULER__MAX_INFLIGHT": str(OPEN_STREAMS + 100)}


def stream_body(tokens: int) -> str:
    return json.dumps(
        {
            "model": "claude-sonnet",
            "messages": common.MESSAGES,
            "max_tokens": tokens,
            "stream": True,
        },
        separators=(",", ":"),
    )


@dataclass
class StreamsResult:
    chunk: dict[str, Any] = field(default_factory=dict)
    open: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _events(subject: Subject, body: str) -> int:
    """SSE events a client receives in one answer through `subject`."""
    import httpx

    r = httpx.post(subject.chat_url, content=body, headers=subject.headers, timeout=60)
    if r.status_code != 200:
        raise RuntimeError(f"{subject.name}: HTTP {r.status_code}: {r.text[:200]}")
    return sum(1 for line in r.text.splitlines() if line.startswith("data:"))


def _start(
    group: Group, tmp: Path, sim: Subject, plan: Plan, name: str, extra: dict[str, str] | None
) -> Subject:
    if name == "nginx-proxy":
        s = subjects.nginx_proxy(
            group, f"nginx-{tmp.name}", tmp / "nginx", sim.url, plan.subject_cpus
        )
    elif name == "floor-relay":
        s = subjects.floor(
            group, f"floor-{tmp.name}", "relay", sim.url, stream=True, cpus=plan.subject_cpus
        )
    else:
        s = subjects.tokengate(
            group,
            f"tg1-{tmp.name}",
            tmp / "tg1",
            sim.url,
            workers=1,
            cpus=plan.subject_cpus,
            extra_env=extra,
        )
    s.name = name
    return s


# -- 1. CPU per chunk --------------------------------------------------------------------------


def per_chunk(group: Group, tmp: Path, plan: Plan, out: StreamsResult) -> None:
    shape = latency.SimShape(0.0, CHUNK_TOKENS_PER_SEC, CHUNK_TOKENS)
    sim = latency.start_sim(group, shape, plan)
    body = stream_body(CHUNK_TOKENS)
    work = tmp / "chunks"
    started: list[Subject] = []
    try:
        for name in ("nginx-proxy", "floor-relay", "tokengate-1w"):
            try:
                started.append(_start(group, work, sim, plan, name, None))
            except Exception as exc:  # recorded; the other subject still runs
                out.errors.append(f"chunks: {name} failed to start: {type(exc).__name__}: {exc}")
        events = _events(sim, body)
        rows: dict[str, dict[str, Any]] = {
            s.name: {"events_per_answer": _events(s, body), "cpu_s": 0.0, "answers": 0, "cells": []}
            for s in started
        }
        for s in started:
            common.cell(s, body, CHUNK_CONCURRENCY, plan, tmp, seconds=plan.warmup)
        for _ in range(CHUNK_ROUNDS):
            for s in started:
                cell: dict[str, Any] = common.cell(
                    s, body, CHUNK_CONCURRENCY, plan, tmp, upstream_pid=sim.pid
                )
                row = rows[s.name]
                row["cells"].append(cell)
                # µs/request x requests = the subject's CPU over the cell
                row["cpu_s"] += (cell["subject_cpu_us_per_req"] or 0) * cell["requests"] / 1e6
                row["answers"] += cell["requests"] - cell["status"]
                print(
                    f"    chunks c={CHUNK_CONCURRENCY} {s.name:14} {cell['rps']:>7} answers/s  "
                    f"cpu {cell['subject_cpu_util']}",
                    flush=True,
                )
        for row in rows.values():
            chunks = row["answers"] * events
            row["cpu_us_per_chunk"] = round(row["cpu_s"] * 1e6 / chunks, 2) if chunks else None
        out.chunk = {
            "sim": asdict(shape),
            "concurrency": CHUNK_CONCURRENCY,
            "rounds": CHUNK_ROUNDS,
            "events_per_answer": events,
            "rows": rows,
        }
    finally:
        for s in reversed(started):
            if s.proc is not None:
                group.stop(s.proc)
        if sim.proc is not None:
            group.stop(sim.proc)


# -- 2. open streams ---------------------------------------------------------------------------


async def _hold(subject: Subject, body: str, n: int, hold_s: float) -> dict[str, Any]:
    """Open `n` streams through `subject`, hold them, sample its RSS; hang up."""
    assert subject.pid is not None
    opened = 0
    all_open = asyncio.Event()
    release = asyncio.Event()
    failures: list[str] = []
    gate = asyncio.Semaphore(200)  # connections being set up at once

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal opened
        await gate.acquire()
        held = True
        try:
            async with session.post(subject.chat_url, data=body, headers=subject.headers) as r:
                if r.status != 200:
                    failures.append(f"HTTP {r.status}")
                    return
                async for line in r.content:
                    if line.startswith(b"data:"):
                        break
                opened += 1
                if opened == n:
                    all_open.set()
                gate.release()
                held = False
                await release.wait()
        except (aiohttp.ClientError, TimeoutError) as exc:
            failures.append(type(exc).__name__)
        finally:
            if held:
                gate.release()

    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    before = rss.rss_bytes(subject.pid)
    started = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(one(session)) for _ in range(n)]
        waiter = asyncio.create_task(all_open.wait())
        while not waiter.done() and not all(t.done() for t in tasks):
            await asyncio.wait([waiter], timeout=0.5)
            if time.monotonic() - started > 120:
                break
        open_after = time.monotonic() - started
        peak = rss.rss_bytes(subject.pid)
        deadline = time.monotonic() + hold_s
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            peak = max(peak, rss.rss_bytes(subject.pid))
        held = opened
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        waiter.cancel()
    mib = rss.MIB
    return {
        "streams": n,
        "held_open": held,
        "failures": len(failures),
        "failure_kinds": sorted(set(failures))[:5],
        "seconds_to_open": round(open_after, 1),
        "rss_before_mib": round(before / mib, 1),
        "rss_open_mib": round(peak / mib, 1),
        "kib_per_stream": round((peak - before) / 1024 / held, 1) if held else None,
    }


def open_streams(group: Group, tmp: Path, plan: Plan, out: StreamsResult) -> None:
    gap = 1 / OPEN_TOKEN_GAP_S
    shape = latency.SimShape(0.0, gap, OPEN_REPLY_TOKENS)
    sim = latency.start_sim(group, shape, plan)
    body = stream_body(OPEN_REPLY_TOKENS)
    rows: dict[str, Any] = {}
    try:
        for name, extra in (("tokengate-1w", OPEN_LIMIT_ENV), ("nginx-proxy", None)):
            try:
                s = _start(group, tmp / "open", sim, plan, name, extra)
            except Exception as exc:
                out.errors.append(
                    f"open streams: {name} failed to start: {type(exc).__name__}: {exc}"
                )
                continue
            try:
                rows[name] = asyncio.run(_hold(s, body, OPEN_STREAMS, HOLD_S))
                row = rows[name]
                print(
                    f"    open streams {name:14} {row['held_open']}/{OPEN_STREAMS} open, RSS "
                    f"{row['rss_before_mib']} -> {row['rss_open_mib']} MiB",
                    flush=True,
                )
            finally:
                if s.proc is not None:
                    group.stop(s.proc)
        out.open = {"sim": asdict(shape), "hold_s": HOLD_S, "env": OPEN_LIMIT_ENV, "rows": rows}
    finally:
        if sim.proc is not None:
            group.stop(sim.proc)


def run(group: Group, tmp: Path, plan: Plan) -> StreamsResult:
    out = StreamsResult()
    (tmp / "streams").mkdir(parents=True, exist_ok=True)
    for step in (per_chunk, open_streams):
        try:
            step(group, tmp / "streams", plan, out)
        except Exception as exc:  # one part failing leaves the other's figures
            out.errors.append(f"{step.__name__}: {type(exc).__name__}: {exc}")
    return out
