"""Scenario "throttle": a burst against an upstream that quantizes its quota (issue 17).

The upstream (`tokengate sim --quota-mode window`) admits 10 requests per aligned
1-second window (600/min) and answers 429 past it, as providers enforce per-minute
quotas. Four equal keys offer 160 requests at 50 req/s in all (open loop, 3.2 s), so
the physical optimum is 160 / 10 = 16 s. Cases:

| case | gateway's `requests_per_minute` | what the upstream sends with a 429 |
|---|---|---|
| `correct` | 600 | Retry-After and x-ratelimit-* on every answer |
| `absent` | unset | nothing (bare 429s) |
| `too_high` | 1200 (2x) | nothing (bare 429s) |
| `replicas` | 600 on each of two gateways sharing Redis | Retry-After and x-ratelimit-* |
| `litellm` | LiteLLM proxy, default settings, on the `correct` upstream | |

Measured: goodput (200s / offered), upstream 429s (from the sim's own count), Jain's
index of the keys' answers (over the whole run, and at half the makespan: the share
each key got while all were still waiting), and makespan / optimum.

Run alone: `.venv/bin/python -m tests.bench.throttle [case ...]` (about 25 s a case).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import tomli_w

from tests.bench import subjects
from tests.bench.procs import ROOT, Group, free_port, sigterm_as_interrupt, wait_http
from tests.bench.quota import Outcome, _send, jain

CASES = ("correct", "absent", "too_high", "replicas", "litellm")
SIM_KEY_ENV = "BENCH_THROTTLE_UPSTREAM_KEY"
DOMAIN = "throttled-domain"


@dataclass(frozen=True)
class Plan:
    quota_rpm: int = 600  # what the upstream enforces: 10 per 1-s window
    window_sec: float = 1.0
    keys: int = 4
    per_key: int = 40
    offered_rps: float = 50.0
    max_queue_wait_ms: int = 30_000
    sim_latency_ms: float = 20.0

    @property
    def offered(self) -> int:
        return self.keys * self.per_key

    @property
    def optimum_s(self) -> float:
        return self.offered / (self.quota_rpm / 60)


def secret(alias: str) -> str:
    return f"tg-bench-throttle-{alias}-0123456789abcdef"


def aliases(plan: Plan) -> list[str]:
    return [f"key-{i + 1}" for i in range(plan.keys)]


def _sim(group: Group, plan: Plan, headers: str) -> str:
    port = free_port()
    cmd = [sys.executable, "-m", "app.commands.cli", "sim", "--port", str(port), "--no-record"]
    cmd += ["--api-key", subjects.UPSTREAM_KEY, "--rpm", str(plan.quota_rpm)]
    cmd += ["--quota-window-sec", f"{plan.window_sec:g}", "--quota-mode", "window"]
    cmd += ["--quota-headers", headers, "--latency-ms", f"{plan.sim_latency_ms:g}"]
    proc = group.start(f"throttle-sim-{port}", cmd, env=subjects.clean_env())
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/_sim/stats", proc)
    return url


def _config(tmp: Path, sim_url: str, rpm: int | None) -> Path:
    config = tomllib.loads((ROOT / "config" / "config.toml").read_text())
    table = dict(config.pop("scale_up", {}))
    table |= {"domain": DOMAIN, "api_base": sim_url, "api_key_env": SIM_KEY_ENV}
    if rpm is not None:
        table["requests_per_minute"] = rpm
    config["scale_up"] = [table]
    path = tmp / "config.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def _gateway(
    group: Group, tmp: Path, sim_url: str, plan: Plan, rpm: int | None, redis_url: str | None
) -> str:
    tmp.mkdir(parents=True, exist_ok=True)
    keys = [
        {
            "alias": a,
            "key_sha256": subjects.sha256(secret(a)),
            "requests_per_minute": subjects.HUGE_RPM,
            "tokens_per_minute": subjects.HUGE_TPM,
        }
        for a in aliases(plan)
    ]
    settings = subjects.write_settings(tmp / "settings.json", keys)
    env = subjects.clean_env(
        **{SIM_KEY_ENV: subjects.UPSTREAM_KEY, "TAOTOKEN_API_KEY": subjects.UPSTREAM_KEY},
        TOKENGATE_LOGGING__OUTPUT=str(tmp / "gateway.log"),
        TOKENGATE_LOGGING__LEVEL="warning",
        TOKENGATE_DATABASE__PATH=str(tmp / "tokengate.sqlite3"),
        TOKENGATE_TOKEN_SCHEDULER__MAX_QUEUE_WAIT_MS=str(plan.max_queue_wait_ms),
        TOKENGATE_HEALTH_CHECK__ENABLED="false",  # probes would spend the upstream's quota
    )
    if redis_url:
        env["TOKENGATE_REDIS_URL"] = redis_url
    port = free_port()
    cmd = [sys.executable, "-m", "app.commands.cli", "serve", "--port", str(port)]
    cmd += ["--config", str(_config(tmp, sim_url, rpm)), "--settings", str(settings)]
    proc = group.start(f"throttle-gw-{port}", cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health/ready", proc, timeout=60, ok=lambda r: r.status_code == 200)
    return url


async def _offer(targets: list[tuple[str, dict[str, dict[str, str]]]], plan: Plan) -> list[Outcome]:
    """Round-robin over keys (and over gateways, for replicas), on a fixed schedule."""
    timeout = aiohttp.ClientTimeout(total=plan.max_queue_wait_ms / 1000 + 30)
    names = aliases(plan)
    tasks: list[asyncio.Task[Outcome]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i in range(plan.offered):
            await asyncio.sleep(max(0.0, t0 + i / plan.offered_rps - loop.time()))
            alias = names[i % len(names)]
            url, headers = targets[(i // len(names)) % len(targets)]
            send = _send(s, url, alias, "normal", t0, headers[alias])
            tasks.append(asyncio.create_task(send))
        return list(await asyncio.gather(*tasks))


def run_case(case: str, tmp: Path, plan: Plan | None = None) -> dict[str, object]:
    plan = plan or Plan()
    tmp.mkdir(parents=True, exist_ok=True)
    with Group(tmp) as group:
        headers = "none" if case in ("absent", "too_high") else "full"
        sim_url = _sim(group, plan, headers)
        gateway_headers = {a: subjects.bearer(secret(a)) for a in aliases(plan)}
        if case == "litellm":
            subject = subjects.litellm(group, "throttle-litellm", tmp / "litellm", sim_url)
            lite = {a: subject.headers for a in aliases(plan)}
            targets = [(subject.chat_url, lite)]
        else:
            rpm = {"correct": 600, "absent": None, "too_high": 1200, "replicas": 600}[case]
            redis_url = subjects.redis_server(group) if case == "replicas" else None
            count = 2 if case == "replicas" else 1
            urls = [
                _gateway(group, tmp / f"gw{i}", sim_url, plan, rpm, redis_url) for i in range(count)
            ]
            targets = [(f"{u}/v1/chat/completions", gateway_headers) for u in urls]
        httpx.delete(f"{sim_url}/_sim/records", timeout=10)  # start counting from here
        outcomes = asyncio.run(_offer(targets, plan))
        stats = httpx.get(f"{sim_url}/_sim/stats", timeout=10).json()
    return summarize(case, plan, outcomes, stats["statuses"])


def summarize(
    case: str, plan: Plan, outcomes: list[Outcome], upstream: dict[str, int]
) -> dict[str, object]:
    ok = [o for o in outcomes if o.status == 200]
    makespan = max((o.done for o in ok), default=float("nan"))
    names = aliases(plan)
    per_key = [sum(1 for o in ok if o.alias == a) for a in names]
    half = [sum(1 for o in ok if o.alias == a and o.done <= makespan / 2) for a in names]
    refused: dict[str, int] = {}
    for o in outcomes:
        if o.status != 200:
            label = f"{o.status} {o.code}".strip()
            refused[label] = refused.get(label, 0) + 1
    return {
        "case": case,
        "offered": plan.offered,
        "ok": len(ok),
        "goodput": round(len(ok) / plan.offered, 3),
        "refused": refused,
        "upstream_429": int(upstream.get("429", 0)),
        "upstream_429_share": round(int(upstream.get("429", 0)) / plan.offered, 3),
        "upstream_statuses": upstream,
        "jain": round(jain([float(n) for n in per_key]), 4),
        "jain_at_half": round(jain([float(n) for n in half]), 4),
        "makespan_s": round(makespan, 2),
        "optimum_s": round(plan.optimum_s, 2),
        "makespan_x_optimum": round(makespan / plan.optimum_s, 3),
    }


def run(tmp: Path, cases: tuple[str, ...] = CASES) -> dict[str, object]:
    out: dict[str, object] = {"plan": Plan().__dict__, "cases": {}}
    for case in cases:
        print(f"  throttle: {case}", flush=True)
        try:
            result = run_case(case, tmp / case)
        except Exception as exc:  # one failing case must not lose the others
            result = {"case": case, "error": f"{type(exc).__name__}: {exc}"}
        out["cases"][case] = result  # type: ignore[index]
        print(f"    {json.dumps(result)}", flush=True)
    return out


def main(argv: list[str]) -> int:
    sigterm_as_interrupt()
    cases = tuple(argv) or CASES
    with tempfile.TemporaryDirectory(prefix="tokengate-bench-throttle-") as tmp:
        result = run(Path(tmp), cases)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
