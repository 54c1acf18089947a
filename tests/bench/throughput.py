"""Scenario "static": every subject in front of the static nginx upstream, c = 1..256.

The upstream answers instantly, so this is the throughput ceiling of each hop. All
subjects of a mode run at once and the cells are interleaved (for each
concurrency, every subject in turn), so slow drift of a shared machine hits all of
them alike and ratios within one concurrency level are fair. Non-streaming and
streaming are two phases because nginx picks the answer by port, not by body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.bench import common, nginx, rss, subjects
from tests.bench.common import Plan
from tests.bench.procs import Group, free_port
from tests.bench.rss import Sampler
from tests.bench.subjects import Subject

INFO_LEVELS = (1, 64)  # the extra info-logging row: enough to see the access-log cost
FLOOR_LEVELS = (1, 64)  # the libraries alone (floor_app.py): what no feature costs
LITELLM_LEVELS = (1, 16, 64)  # at 256 its first answers take longer than a cell
REDIS_LEVELS = (1, 64, 256)  # the shared-limits row: one round trip per admission


@dataclass
class Upstream:
    server: nginx.Nginx

    @property
    def json_url(self) -> str:
        return f"http://127.0.0.1:{self.server.ports[0]}"

    @property
    def sse_url(self) -> str:
        return f"http://127.0.0.1:{self.server.ports[1]}"

    @property
    def pid(self) -> int:
        return self.server.proc.pid


def start_upstream(group: Group, tmp: Path, plan: Plan) -> Upstream:
    json_port, sse_port = free_port(), free_port()
    prefix = tmp / "nginx-upstream"
    config = nginx.static_config(prefix, json_port, sse_port)
    server = nginx.start(
        group, "nginx-upstream", prefix, config, (json_port, sse_port), plan.load_cpus
    )
    return Upstream(server)


@dataclass
class Phase:
    mode: str  # "json" | "sse"
    subjects: list[Subject] = field(default_factory=list)
    cells: list[dict[str, object]] = field(default_factory=list)
    rss: dict[str, dict[str, float]] = field(default_factory=dict)
    idle_cpu: dict[str, float] = field(default_factory=dict)
    statuses: dict[str, dict[str, int]] = field(default_factory=dict)
    logs: dict[str, dict[str, object]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "subjects": {s.name: s.notes for s in self.subjects},
            "cells": self.cells,
            "rss_mib": self.rss,
            "idle_cpu_cores": self.idle_cpu,
            "gateway_statuses": self.statuses,
            "gateway_logs": self.logs,
            "errors": self.errors,
        }


Starter = Callable[[], Subject]


def _starters(
    group: Group, tmp: Path, upstream: str, mode: str, plan: Plan, litellm: bool
) -> dict[str, Starter]:
    """Subjects in table order; each is started lazily so one failure skips only it."""
    cpus = plan.subject_cpus
    work = tmp / mode

    out: dict[str, Starter] = {
        "nginx-proxy": lambda: subjects.nginx_proxy(
            group, f"nginx-proxy-{mode}", work / "nginx-proxy", upstream, cpus
        ),
        "tokengate-1w": lambda: subjects.tokengate(
            group, f"tg1-{mode}", work / "tg1", upstream, workers=1, cpus=cpus
        ),
        "tokengate-2w": lambda: subjects.tokengate(
            group, f"tg2-{mode}", work / "tg2", upstream, workers=2
        ),
    }
    if subjects.BUILD:  # the source beside the build, in the same run
        out["tokengate-1w-source"] = lambda: subjects.tokengate(
            group, f"tg1s-{mode}", work / "tg1s", upstream, workers=1, cpus=cpus, build=""
        )
    for app in ("canned", "relay"):
        out[f"floor-{app}"] = lambda app=app: subjects.floor(  # type: ignore[misc]
            group, f"floor-{app}-{mode}", app, upstream, stream=mode == "sse", cpus=cpus
        )
    if mode == "json":
        out["tokengate-1w-info"] = lambda: subjects.tokengate(
            group, f"tg1i-{mode}", work / "tg1i", upstream, workers=1, log_level="info", cpus=cpus
        )
        out["tokengate-1w-redis"] = lambda: subjects.tokengate(
            group,
            f"tg1r-{mode}",
            work / "tg1r",
            upstream,
            workers=1,
            cpus=cpus,
            redis_url=subjects.redis_server(group),
        )
    if litellm:
        out["litellm"] = lambda: subjects.litellm(
            group, f"litellm-{mode}", work / "litellm", upstream, cpus=cpus
        )
    return out


def _start_all(phase: Phase, starters: dict[str, Starter], stream: bool) -> None:
    for name, start in starters.items():
        print(f"  starting {name} ({phase.mode})", flush=True)
        try:
            subject = start()
        except Exception as exc:  # a subject that fails to start is a result
            phase.errors.append(f"{name}: failed to start: {type(exc).__name__}: {exc}")
            continue
        subject.name = name
        problem = common.preflight(subject, stream)
        if problem:
            phase.errors.append(f"{name}: preflight failed: {problem}")
            continue
        phase.subjects.append(subject)


def _levels_for(subject: Subject, plan: Plan) -> tuple[int, ...]:
    if subject.name == "tokengate-1w-info":
        return tuple(c for c in plan.levels if c in INFO_LEVELS)
    if subject.name.startswith("floor-"):
        return tuple(c for c in plan.levels if c in FLOOR_LEVELS)
    if subject.name == "litellm":
        return tuple(c for c in plan.levels if c in LITELLM_LEVELS)
    if subject.name == "tokengate-1w-redis":
        return tuple(c for c in plan.levels if c in REDIS_LEVELS)
    return plan.levels


def _record_rss(phase: Phase, subject: Subject, sampler: Sampler, key: str) -> None:
    if subject.pid is None:
        return
    sampler.sample_once()
    phase.rss[subject.name] |= {
        "after_last": round(rss.rss_bytes(subject.pid) / rss.MIB, 1),
        "peak": round(sampler.peak(key) / rss.MIB, 1),
        "processes": rss.processes(subject.pid),
    }


def _run_cells(
    phase: Phase, body: str, plan: Plan, tmp: Path, up: Upstream, sampler: Sampler
) -> None:
    for subject in phase.subjects:
        common.cell(subject, body, 16, plan, tmp, seconds=plan.warmup)
    for c in plan.levels:
        for subject in phase.subjects:
            if c not in _levels_for(subject, plan):
                continue
            result = common.cell(subject, body, c, plan, tmp, upstream_pid=up.pid)
            phase.cells.append(result)
            print(
                f"    {phase.mode:4} c={c:<3} {subject.name:18} {result['rps']:>9} req/s  "
                f"p50 {common.ms(result, 'p50_us'):7.2f} ms  "
                f"p99 {common.ms(result, 'p99_us'):8.2f} ms  "
                f"err {result['errors']}  cpu {result['subject_cpu_util']}",
                flush=True,
            )
            if c == _levels_for(subject, plan)[-1]:
                _record_rss(phase, subject, sampler, f"{phase.mode}/{subject.name}")


def run_phase(
    group: Group,
    sampler: Sampler,
    tmp: Path,
    up: Upstream,
    mode: str,
    plan: Plan,
    *,
    litellm: bool,
) -> Phase:
    """Start this mode's subjects, run the interleaved matrix, collect, stop them."""
    stream = mode == "sse"
    url = up.sse_url if stream else up.json_url
    phase = Phase(mode)
    direct = Subject(
        "direct",
        url,
        subjects.bearer(subjects.UPSTREAM_KEY),
        up.server.proc,
        ["the static nginx upstream itself"],
    )
    phase.subjects.append(direct)
    _start_all(phase, _starters(group, tmp, url, mode, plan, litellm), stream)
    for s in phase.subjects:
        if s.pid is not None:
            sampler.watch(f"{mode}/{s.name}", s.pid)
            phase.rss[s.name] = {"start": round(rss.rss_bytes(s.pid) / rss.MIB, 1)}
    pids = {s.name: s.pid for s in phase.subjects if s.pid is not None}
    phase.idle_cpu = common.idle_cpu(pids)
    try:
        _run_cells(phase, common.chat_body(stream), plan, tmp, up, sampler)
        _collect(phase)
    finally:
        for s in phase.subjects:
            sampler.unwatch(f"{mode}/{s.name}")
            if s is not direct and s.proc is not None:
                group.stop(s.proc)
    return phase


def _collect(phase: Phase) -> None:
    for s in phase.subjects:
        if s.gateway_log is not None:
            phase.statuses[s.name] = common.gateway_statuses(s)
            phase.logs[s.name] = common.log_findings(s.gateway_log)
            phase.logs[s.name]["redis_up"] = common.gateway_gauge(s, "tokengate_redis_up")
