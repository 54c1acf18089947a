"""The issue's targets, evaluated on one run's results (PASS / FAIL with the numbers).

Every ratio is computed from cells of the same run, so a slow machine moves both
sides; absolute figures are reported but never judged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

Results = dict[str, Any]
TG = "tokengate-1w"
# Issue 23's five targets for the hot path ("The hot path, measured"), in its words; the
# report shows them apart, each as measured vs target, met or missed.
HOT_PATH = (
    "throughput_vs_nginx",
    "concurrency_scaling",
    "latency_added_c1",
    "stream_cpu_per_chunk",
    "rss_open_streams",
)


@dataclass
class Target:
    id: str
    goal: str
    value: float | None
    threshold: float
    higher_is_better: bool
    detail: str

    @property
    def verdict(self) -> str:
        if self.value is None or math.isnan(self.value):
            return "N/A"
        ok = self.value >= self.threshold if self.higher_is_better else self.value <= self.threshold
        return "PASS" if ok else "FAIL"

    @property
    def met(self) -> str:
        return {"PASS": "met", "FAIL": "missed"}.get(self.verdict, "not measured")

    @property
    def margin(self) -> str:
        """How far from the threshold, as a factor (ratios) or a difference (ms, MiB)."""
        if self.value is None or math.isnan(self.value):
            return ""
        if self.id.startswith(("latency", "ttft", "rss")):
            return f"{self.value - self.threshold:+.3g} vs limit"
        return f"{self.value / self.threshold:.3f}x the target" if self.threshold else ""

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "verdict": self.verdict, "margin": self.margin}


def cell(results: Results, mode: str, subject: str, c: int) -> dict[str, Any] | None:
    phase = results.get("static", {}).get(mode)
    if not phase:
        return None
    for row in phase["cells"]:
        if row["subject"] == subject and row["c"] == c:
            return dict(row)
    return None


def rps(results: Results, mode: str, subject: str, c: int) -> float | None:
    row = cell(results, mode, subject, c)
    return float(row["rps"]) if row else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "n/a"
    return f"{x:,.3f}{unit}" if unit == " ms" else f"{x:,.1f}{unit}"


def _throughput(r: Results) -> list[Target]:
    tg, ng, ll = (rps(r, "json", s, 64) for s in (TG, "nginx-proxy", "litellm"))
    tg16, tg256 = rps(r, "json", TG, 16), rps(r, "json", TG, 256)
    floor = rps(r, "json", "floor-relay", 64)
    return [
        Target(
            "throughput_vs_floor",
            ">= 0.65x the floor relay (uvicorn + aiohttp, nothing of tokengate) at c=64 "
            "(issue 32; tokengate 1 worker / floor-relay, req/s)",
            ratio(tg, floor),
            0.65,
            True,
            f"tokengate {_fmt(tg)} req/s vs floor-relay {_fmt(floor)} req/s",
        ),
        Target(
            "throughput_vs_nginx",
            ">= 0.3x nginx at c=64 on the static upstream with the default features on "
            "(tokengate 1 worker / nginx-proxy, req/s)",
            ratio(tg, ng),
            0.3,
            True,
            f"tokengate {_fmt(tg)} req/s vs nginx-proxy {_fmt(ng)} req/s",
        ),
        Target(
            "throughput_vs_litellm",
            "tokengate (1 worker) >= 30 x LiteLLM req/s at c=64",
            ratio(tg, ll),
            30.0,
            True,
            f"tokengate {_fmt(tg)} req/s vs LiteLLM {_fmt(ll)} req/s",
        ),
        Target(
            "concurrency_scaling",
            "c=256 >= 0.95x c=16 (tokengate 1 worker, req/s, static upstream)",
            ratio(tg256, tg16),
            0.95,
            True,
            f"c=256 {_fmt(tg256)} req/s vs c=16 {_fmt(tg16)} req/s "
            f"(streaming: {_fmt(ratio(rps(r, 'sse', TG, 256), rps(r, 'sse', TG, 16)))}x)",
        ),
    ]


def _p50_ms(r: Results, subject: str) -> float | None:
    row = cell(r, "json", subject, 1)
    return None if row is None else float(row["p50_us"]) / 1000


def _latency(r: Results) -> list[Target]:
    tg, direct = _p50_ms(r, TG), _p50_ms(r, "direct")
    added = tg - direct if tg is not None and direct is not None else None
    sim = r.get("sim", {}).get("rows", {})
    sim_added = sim.get(TG, {}).get("added_p50_ms")
    ttft_added = sim.get(TG, {}).get("added_ttft_p50_ms")
    s64, j64 = rps(r, "sse", TG, 64), rps(r, "json", TG, 64)
    return [
        Target(
            "latency_added_c1",
            "added p50 at c=1 <= 0.3 ms over direct (tokengate p50 - direct p50, static upstream)",
            added,
            0.3,
            False,
            f"tokengate p50 {_fmt(tg, ' ms')} vs direct {_fmt(direct, ' ms')}; with the sim: "
            f"{_fmt(sim_added, ' ms')} added",
        ),
        Target(
            "streaming_throughput",
            "streaming req/s >= 0.8 x its own non-streaming req/s (c=64)",
            ratio(s64, j64),
            0.8,
            True,
            f"streaming {_fmt(s64)} req/s vs non-streaming {_fmt(j64)} req/s",
        ),
        Target(
            "ttft_added_c1",
            "time to first token added at c=1 <= 1 ms (vs direct, with the sim)",
            ttft_added,
            1.0,
            False,
            f"tokengate TTFT p50 {_fmt(_ttft(sim, TG), ' ms')} "
            f"vs direct {_fmt(_ttft(sim, 'direct'), ' ms')}",
        ),
    ]


def _ttft(sim_rows: dict[str, Any], subject: str) -> float | None:
    value = sim_rows.get(subject, {}).get("stream", {}).get("ttft_p50_ms")
    return None if value is None else float(value)


def _rss(r: Results) -> list[Target]:
    peaks = {
        mode: phase["rss_mib"].get(TG, {}).get("peak")
        for mode, phase in r.get("static", {}).items()
        if phase
    }
    known = [v for v in peaks.values() if v is not None]
    return [
        Target(
            "rss_peak",
            "tokengate (1 worker) peak RSS <= 150 MiB after the c=256 run",
            max(known) if known else None,
            150.0,
            False,
            ", ".join(f"{mode}: {_fmt(v, ' MiB')}" for mode, v in peaks.items())
            + " (sum over the process tree, sampled every 200 ms)",
        ),
    ]


def _streams(r: Results) -> list[Target]:
    """Issue 23: the relay's cost per event against nginx's, and memory per open stream."""
    streams = r.get("streams", {})
    rows = streams.get("chunk", {}).get("rows", {})
    tg, ng = (rows.get(s, {}).get("cpu_us_per_chunk") for s in (TG, "nginx-proxy"))
    held = streams.get("open", {}).get("rows", {}).get(TG, {})
    open_mib = held.get("rss_open_mib") if held.get("held_open") else None
    return [
        Target(
            "stream_cpu_per_chunk",
            "streaming CPU per SSE chunk <= 3x nginx's (tokengate 1 worker / nginx-proxy, "
            "sim upstream, one event per millisecond)",
            ratio(tg, ng),
            3.0,
            False,
            f"tokengate {_fmt(tg)} µs vs nginx-proxy {_fmt(ng)} µs of CPU per event relayed",
        ),
        Target(
            "rss_open_streams",
            "RSS with 2,000 open streams <= 200 MiB (tokengate 1 worker, process tree)",
            open_mib,
            200.0,
            False,
            f"{held.get('held_open', 'n/a')} streams held open; {_fmt(held.get('rss_before_mib'))} "
            f"MiB before, {_fmt(held.get('kib_per_stream'))} KiB per stream",
        ),
    ]


def _throttle(r: Results) -> list[Target]:
    """Issue 17's targets on the throttle scenario's cases (see throttle.py)."""
    cases = r.get("throttle", {}).get("cases", {})

    def value(case: str, field: str) -> float | None:
        row = cases.get(case) or {}
        return None if "error" in row or field not in row else float(row[field])

    gateway = ("correct", "absent", "too_high", "replicas")
    learned = ("absent", "too_high")
    out = [
        Target(
            f"throttle_goodput_{c}",
            f"goodput >= 0.98 with the quota {c.replace('_', ' ')}",
            value(c, "goodput"),
            0.98,
            True,
            f"{_fmt(value(c, 'goodput'))} of {cases.get(c, {}).get('offered', '?')} offered",
        )
        for c in gateway
    ]
    out += [
        Target(
            f"throttle_429_{c}",
            f"upstream 429s {'= 0' if c in ('correct', 'replicas') else '<= 10 % of offered'} "
            f"with the quota {c.replace('_', ' ')}",
            value(c, "upstream_429_share"),
            0.0 if c in ("correct", "replicas") else 0.10,
            False,
            f"{_fmt(value(c, 'upstream_429'))} upstream 429s",
        )
        for c in gateway
    ]
    out += [
        Target(
            f"throttle_jain_{c}",
            f"Jain's index across equal keys >= 0.99 ({c.replace('_', ' ')})",
            value(c, "jain_at_half"),
            0.99,
            True,
            f"at half the makespan; {_fmt(value(c, 'jain'))} over the whole run",
        )
        for c in gateway
    ]
    out += [
        Target(
            f"throttle_makespan_{c}",
            f"makespan <= {1.5 if c in learned else 1.25}x the optimum ({c.replace('_', ' ')})",
            value(c, "makespan_x_optimum"),
            1.5 if c in learned else 1.25,
            False,
            f"{_fmt(value(c, 'makespan_s'), ' s')} vs {_fmt(value(c, 'optimum_s'), ' s')}",
        )
        for c in gateway
    ]
    return out


def _redis(r: Results) -> list[Target]:
    """Issue 22: sharing limits through Redis must cost one replica little."""
    rows = r.get("redis", {}).get("summary", {})
    shared, alone = rows.get("tokengate-1w-redis", {}), rows.get("tokengate-1w", {})
    per, run = shared.get("redis_calls_per_request"), shared.get("redis_commands_per_request")
    return [
        Target(
            "redis_vs_inprocess",
            "1 worker with limits in Redis >= 0.7 x the same in-process, req/s at c=64",
            ratio(shared.get("rps"), alone.get("rps")),
            0.7,
            True,
            f"Redis {_fmt(shared.get('rps'))} req/s vs in-process {_fmt(alone.get('rps'))} "
            f"req/s; Redis calls per request {'n/a' if per is None else f'{per:.3f}'} "
            f"(commands run, scripts' included: {'n/a' if run is None else f'{run:.3f}'})",
        )
    ]


def _affinity(r: Results) -> list[Target]:
    """Issue 25's targets on the affinity scenario (see affinity.py)."""
    cases = r.get("affinity", {}).get("cases", {})
    on, off = cases.get("affinity") or {}, cases.get("no_affinity") or {}

    def value(row: dict[str, Any], field: str) -> float | None:
        return None if "error" in row or field not in row else float(row[field])

    def share(row: dict[str, Any], field: str) -> str:
        x = value(row, field)
        return "n/a" if x is None else f"{x:.3f}"

    return [
        Target(
            "affinity_cached_share",
            "cached-token share with affinity >= 0.9 x the ideal (every turn after the "
            "first served from cache)",
            value(on, "share_of_ideal"),
            0.9,
            True,
            f"cached share {share(on, 'cached_share')} vs ideal {share(on, 'ideal_share')}; "
            f"without affinity {share(off, 'share_of_ideal')}x the ideal",
        ),
        Target(
            "affinity_load_balance",
            "max / mean requests per domain with affinity <= 1.25",
            value(on, "max_over_mean"),
            1.25,
            False,
            f"served {on.get('served', {})}; without affinity {off.get('served', {})}",
        ),
    ]


CHECKS: tuple[Callable[[Results], list[Target]], ...] = (
    _throughput,
    _latency,
    _rss,
    _streams,
    _throttle,
    _redis,
    _affinity,
)


def evaluate(results: Results) -> list[Target]:
    return [t for check in CHECKS for t in check(results)]
