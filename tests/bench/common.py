"""What every scenario shares: the request body, the CPU plan, one measured wrk cell.

One body for every subject and every run (a short chat request, `max_tokens` 16),
so differences come from the subject, not the payload. `Plan` says where things
run: on a 2-core machine the load side (wrk and the upstream) gets one core and a
single-process subject the other, so subjects do not fight the load generator for
the same core; a multi-process subject may use both.
"""

from __future__ import annotations

import json
import re
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.bench import rss, wrk
from tests.bench.subjects import Subject

MESSAGES = [{"role": "user", "content": "ping"}]


def chat_body(stream: bool) -> str:
    body: dict[str, object] = {"model": "claude-sonnet", "messages": MESSAGES, "max_tokens": 16}
    if stream:
        body["stream"] = True
    return json.dumps(body, separators=(",", ":"))


@dataclass(frozen=True)
class Plan:
    seconds: float = 5.0  # per wrk cell
    warmup: float = 1.0  # per subject, before its first cell
    levels: tuple[int, ...] = (1, 16, 64, 256)
    load_cpus: str | None = "1"  # wrk, the static upstream, the sim
    subject_cpus: str | None = "0"  # single-process subjects
    ttft_requests: int = 40

    @classmethod
    def unpinned(cls, **kw: object) -> Plan:
        return cls(load_cpus=None, subject_cpus=None, **kw)  # type: ignore[arg-type]


def wait_quiet(pid: int, *, window: float = 0.2, below: float = 0.05, limit: float = 20.0) -> float:
    """Wait until `pid`'s tree uses < `below` of a core; seconds waited.

    A subject may keep working after wrk has gone (answers to requests whose client
    already left): without this wait that backlog would run during the next
    subject's cell, on the same core, and be billed to the wrong subject.
    """
    started = time.monotonic()
    while time.monotonic() - started < limit:
        before = rss.cpu_seconds(pid)
        time.sleep(window)
        if rss.cpu_seconds(pid) - before < below * window:
            break
    return time.monotonic() - started


def idle_cpu(pids: dict[str, int], seconds: float = 1.0) -> dict[str, float]:
    """Cores each subject uses while nobody sends it anything (background loops)."""
    before = {name: rss.cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {
        name: round((rss.cpu_seconds(pid) - before[name]) / seconds, 3)
        for name, pid in pids.items()
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _own_cpu() -> float:
    """This process (the benchmark itself, its RSS sampler thread included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cell(
    subject: Subject,
    body: str,
    connections: int,
    plan: Plan,
    workdir: Path,
    *,
    upstream_pid: int | None = None,
    seconds: float | None = None,
) -> dict[str, object]:
    """One wrk run against `subject`, with the CPU each side used meanwhile."""
    pid = subject.pid
    before = rss.cpu_seconds(pid) if pid else 0.0
    up_before = rss.cpu_seconds(upstream_pid) if upstream_pid else 0.0
    wrk_before, own_before = _children_cpu(), _own_cpu()
    machine_before, steal_before = rss.machine_cpu()
    started = time.monotonic()
    result = wrk.run(
        subject.chat_url,
        body,
        subject.headers,
        connections=connections,
        seconds=seconds or plan.seconds,
        workdir=workdir,
        cpus=plan.load_cpus,
    )
    wall = time.monotonic() - started
    machine_after, steal_after = rss.machine_cpu()
    cpu = (rss.cpu_seconds(pid) - before) if pid else 0.0
    wrk_cpu = _children_cpu() - wrk_before
    own_cpu = _own_cpu() - own_before
    up_cpu = (
        rss.cpu_seconds(upstream_pid) - up_before if upstream_pid and upstream_pid != pid else 0.0
    )
    out = {"subject": subject.name, "c": connections, **result.as_dict()}
    out["subject_cpu_util"] = round(cpu / wall, 3)
    out["subject_cpu_us_per_req"] = (
        round(cpu * 1e6 / result.requests, 1) if result.requests else None
    )
    out["wrk_cpu_util"] = round(wrk_cpu / wall, 3)
    if upstream_pid and upstream_pid != pid:
        out["upstream_cpu_util"] = round(up_cpu / wall, 3)
    # Machine-wide busy time not spent by the subject, its upstream, wrk or us.
    foreign = machine_after - machine_before - cpu - wrk_cpu - up_cpu - own_cpu
    out["other_cpu_util"] = round(max(0.0, foreign) / wall, 3)
    out["steal_util"] = round((steal_after - steal_before) / wall, 3)
    if pid:
        out["rss_mib_after"] = round(rss.rss_bytes(pid) / rss.MIB, 1)
        out["busy_after_s"] = round(wait_quiet(pid), 2)  # backlog left when wrk stopped
    return out


def ms(result: dict[str, object], field: str) -> float:
    """A wrk latency field (µs) of a cell, in ms."""
    value = result[field]
    assert isinstance(value, int | float)
    return value / 1000


def preflight(subject: Subject, stream: bool) -> str | None:
    """One request by hand: None if the answer is what a client expects, else why not."""
    try:
        r = httpx.post(
            subject.chat_url, content=chat_body(stream), headers=subject.headers, timeout=30
        )
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {r.text[:300]}"
    if stream and "data:" not in r.text:
        return f"no SSE data in the answer: {r.text[:300]}"
    if not stream and "choices" not in r.text:
        return f"no choices in the answer: {r.text[:300]}"
    return None


_SAMPLE = re.compile(r"^tokengate_requests_total\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.e+]+)$")


def gateway_statuses(subject: Subject) -> dict[str, int]:
    """`tokengate_requests_total` summed by status, from the gateway's own /metrics."""
    try:
        text = httpx.get(f"{subject.url}/metrics", timeout=10).text
    except httpx.HTTPError as exc:
        return {"scrape_error": 1, type(exc).__name__: 1}
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        status = re.search(r'status="([^"]*)"', m["labels"])
        key = status.group(1) if status else "?"
        out[key] = out.get(key, 0) + int(float(m["value"]))
    return out


def log_findings(path: Path, limit: int = 5) -> dict[str, object]:
    """Warning-and-above lines a gateway wrote during the run (the first few verbatim)."""
    if not path.exists():
        return {"lines": 0, "by_level": {}, "first": []}
    by_level: dict[str, int] = {}
    distinct: dict[str, int] = {}  # warning+ message -> count
    lines = path.read_text(errors="replace").splitlines()
    for line in lines:
        try:
            record = json.loads(line)
            level, msg = str(record.get("level", "?")).lower(), str(record.get("msg", ""))
        except (json.JSONDecodeError, AttributeError):
            level, msg = "text", line
        by_level[level] = by_level.get(level, 0) + 1
        if level not in ("info", "debug"):
            distinct[msg[:300]] = distinct.get(msg[:300], 0) + 1
    first = [f"{n}x {level_msg}" for level_msg, n in list(distinct.items())[:limit]]
    return {"lines": len(lines), "by_level": by_level, "first": first}


def gateway_gauge(subject: Subject, name: str) -> float | None:
    """One unlabelled sample of the gateway's /metrics (e.g. `tokengate_redis_up`)."""
    try:
        text = httpx.get(f"{subject.url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None
