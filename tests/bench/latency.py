"""Scenario "sim": latency a hop adds in front of an upstream that takes its time.

`tokengate sim` answers after `latency_ms` and streams `reply_tokens` tokens at
`tokens_per_sec`, like a real model. At concurrency 1 the hop's added latency is
the subject's p50 minus the direct p50 (wrk, non-streaming), and its added time to
first token is the same difference on the first SSE `data:` line (aiohttp client).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.bench import common, subjects, ttft
from tests.bench.common import Plan
from tests.bench.procs import Group, free_port, pinned, wait_http
from tests.bench.subjects import Subject


@dataclass(frozen=True)
class SimShape:
    latency_ms: float = 20.0
    tokens_per_sec: float = 200.0
    reply_tokens: int = 16

    def args(self) -> list[str]:
        return [
            "--latency-ms",
            f"{self.latency_ms:g}",
            "--tokens-per-sec",
            f"{self.tokens_per_sec:g}",
            "--reply-tokens",
            str(self.reply_tokens),
        ]


@dataclass
class Row:
    c1: dict[str, object]  # the wrk cell, non-streaming
    p50_ms: float
    stream: dict[str, float | int] = field(default_factory=dict)
    added_p50_ms: float | None = None
    added_ttft_p50_ms: float | None = None

    @property
    def ttft_p50_ms(self) -> float:
        return float(self.stream.get("ttft_p50_ms", float("nan")))


@dataclass
class LatencyResult:
    shape: SimShape
    rows: dict[str, Row] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        rows = {name: asdict(row) for name, row in self.rows.items()}
        return {"sim": asdict(self.shape), "rows": rows, "errors": self.errors}


def start_sim(group: Group, shape: SimShape, plan: Plan) -> Subject:
    port = free_port()
    cmd = [sys.executable, "-m", "app.commands.cli", "sim", "--port", str(port)]
    cmd += ["--api-key", subjects.UPSTREAM_KEY, "--no-record", *shape.args()]
    proc = group.start("sim", pinned(cmd, plan.load_cpus), env=subjects.clean_env())
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/_sim/stats", proc)
    pace = f"{shape.latency_ms:g} ms, {shape.tokens_per_sec:g} tok/s, {shape.reply_tokens} tokens"
    notes = [f"tokengate sim, {pace}"]
    return Subject("direct", url, subjects.bearer(subjects.UPSTREAM_KEY), proc, notes)


def _subjects(
    group: Group, tmp: Path, sim: Subject, plan: Plan, litellm: bool, errors: list[str]
) -> list[Subject]:
    work = tmp / "sim"
    cpus = plan.subject_cpus
    out = [sim]

    starters: dict[str, Callable[[], Subject]] = {
        "nginx-proxy": lambda: subjects.nginx_proxy(
            group, "nginx-proxy-sim", work / "nginx-proxy", sim.url, cpus
        ),
        "tokengate-1w": lambda: subjects.tokengate(
            group, "tg1-sim", work / "tg1", sim.url, workers=1, cpus=cpus
        ),
    }
    if litellm:
        starters["litellm"] = lambda: subjects.litellm(
            group, "litellm-sim", work / "litellm", sim.url, cpus=cpus
        )
    for name, start in starters.items():
        print(f"  starting {name} (sim)", flush=True)
        try:
            subject = start()
        except Exception as exc:  # reported, the others still run
            errors.append(f"{name}: failed to start: {type(exc).__name__}: {exc}")
            continue
        subject.name = name
        problem = common.preflight(subject, True) or common.preflight(subject, False)
        if problem:
            errors.append(f"{name}: preflight failed: {problem}")
            continue
        out.append(subject)
    return out


def run(
    group: Group, tmp: Path, plan: Plan, *, litellm: bool, shape: SimShape | None = None
) -> LatencyResult:
    shape = shape or SimShape()
    result = LatencyResult(shape)
    sim = start_sim(group, shape, plan)
    started = _subjects(group, tmp, sim, plan, litellm, result.errors)
    try:
        for s in started:
            common.cell(s, common.chat_body(False), 1, plan, tmp, seconds=plan.warmup)
        for s in started:
            cell = common.cell(s, common.chat_body(False), 1, plan, tmp)
            result.rows[s.name] = Row(cell, common.ms(cell, "p50_us"))
        for s in started:
            times = ttft.measure(
                s.chat_url, common.chat_body(True), s.headers, n=plan.ttft_requests
            )
            row = result.rows[s.name]
            row.stream = times.summary()
            print(
                f"    sim c=1 {s.name:14} p50 {row.p50_ms:7.2f} ms  "
                f"ttft p50 {row.ttft_p50_ms:.2f} ms",
                flush=True,
            )
        _added(result)
    finally:
        for s in reversed(started):
            if s.proc is not None:
                group.stop(s.proc)
    return result


def _added(result: LatencyResult) -> None:
    """Differences against the direct row: what the hop costs a client."""
    direct = result.rows.get("direct")
    if direct is None:
        return
    for row in result.rows.values():
        row.added_p50_ms = round(row.p50_ms - direct.p50_ms, 3)
        row.added_ttft_p50_ms = round(row.ttft_p50_ms - direct.ttft_p50_ms, 3)
