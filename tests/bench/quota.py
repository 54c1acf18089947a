"""Scenario "quota": a 5x oversubscribed burst against an upstream key's quota.

`tokengate sim --rpm R --quota-window-sec W` enforces a quota the way providers do
(429 + Retry-After past it). The gateway's domain declares the same quota, so it
should pace traffic under it (queue, never trip the upstream's 429), spend all of
it (goodput close to 100 % of the quota), serve `high` before `normal` before
`low`, and share fairly between keys of one class (Jain's index close to 1).

Offered load is open-loop (requests sent on a fixed schedule whatever the answers),
5x the quota in total: `high` 0.5x, three `normal` keys 1.2x each, `low` 0.9x. So
`high` alone fits and should wait little, the three `normal` keys split what is
left, and `low` mostly waits out `max_queue_wait_ms` (503). Time to response is
measured client-side per class; the gateway's own `tokengate_queue_wait_seconds`
histogram (all classes together) is read from /metrics.

Run alone: `.venv/bin/python -m tests.bench.quota` (about 45 s).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
import tomli_w

from tests.bench import common, subjects
from tests.bench.procs import ROOT, Group, free_port, sigterm_as_interrupt, wait_http

SIM_KEY_ENV = "BENCH_QUOTA_UPSTREAM_KEY"
DOMAIN = "quota-domain"


@dataclass(frozen=True)
class QuotaPlan:
    rpm: int = 600  # the upstream key's quota: 10 requests/s
    window_sec: float = 5.0  # its burst window: 50 requests
    seconds: float = 30.0  # offered-load window
    max_queue_wait_ms: int = 10_000  # so every request resolves soon after the window
    sim_latency_ms: float = 10.0
    # key alias -> (priority, share of the quota it offers); shares add up to 5.0
    keys: tuple[tuple[str, str, float], ...] = (
        ("high-1", "high", 0.5),
        ("normal-1", "normal", 1.2),
        ("normal-2", "normal", 1.2),
        ("normal-3", "normal", 1.2),
        ("low-1", "low", 0.9),
    )

    @property
    def rate(self) -> float:
        return self.rpm / 60

    @property
    def burst(self) -> float:
        return self.rpm * self.window_sec / 60

    @property
    def oversubscription(self) -> float:
        return sum(share for _, _, share in self.keys)


@dataclass
class Outcome:
    alias: str
    priority: str
    sent: float
    done: float
    status: int  # 0: transport error or client timeout
    code: str = ""  # OpenAI error `code` of a refusal (queue_timeout, queue_full, ...)


@dataclass
class QuotaRun:
    plan: QuotaPlan
    outcomes: list[Outcome] = field(default_factory=list)
    upstream_statuses: dict[str, int] = field(default_factory=dict)
    queue_wait: dict[str, float] = field(default_factory=dict)
    gateway_log: dict[str, object] = field(default_factory=dict)
    window_end: float = 0.0


def secret(alias: str) -> str:
    return f"tg-bench-quota-{alias}-0123456789abcdef"


def domain_config(
    tmp: Path, sim_url: str, domain: str, key_env: str, rpm: int, window_sec: float
) -> Path:
    """The repo's config.toml with its one domain replaced by a quota-declaring one."""
    config = tomllib.loads((ROOT / "config" / "config.toml").read_text())
    table = dict(config.pop("scale_up", {}))
    table |= {
        "domain": domain,
        "api_base": sim_url,
        "api_key_env": key_env,
        "requests_per_minute": rpm,
        "quota_window_sec": window_sec,
    }
    config["scale_up"] = [table]
    path = tmp / "config.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def _keys(plan: QuotaPlan) -> list[dict[str, object]]:
    return [
        {
            "alias": alias,
            "key_sha256": subjects.sha256(secret(alias)),
            "priority": priority,
            "requests_per_minute": subjects.HUGE_RPM,
            "tokens_per_minute": subjects.HUGE_TPM,
        }
        for alias, priority, _ in plan.keys
    ]


def start_sim(group: Group, name: str, rpm: int, window_sec: float, latency_ms: float) -> str:
    """`tokengate sim` enforcing a quota of `rpm` per `window_sec`; its URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "app.commands.cli", "sim", "--port", str(port)]
    cmd += ["--api-key", subjects.UPSTREAM_KEY, "--no-record", "--rpm", str(rpm)]
    cmd += ["--quota-window-sec", f"{window_sec:g}", "--latency-ms", f"{latency_ms:g}"]
    sim = group.start(name, cmd, env=subjects.clean_env())
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/_sim/stats", sim)
    return url


def start_gateway(
    group: Group,
    name: str,
    tmp: Path,
    files: tuple[Path, Path],
    key_env: str,
    max_queue_wait_ms: int,
    **env: str,
) -> tuple[str, Path]:
    """`tokengate serve` with (config, settings), logging to a file; its URL and log."""
    config, settings = files
    port, log = free_port(), tmp / "gateway.log"
    environ = subjects.clean_env(
        **{key_env: subjects.UPSTREAM_KEY, "TAOTOKEN_API_KEY": subjects.UPSTREAM_KEY},
        TOKENGATE_LOGGING__OUTPUT=str(log),
        TOKENGATE_DATABASE__PATH=str(tmp / "tokengate.sqlite3"),
        TOKENGATE_TOKEN_SCHEDULER__MAX_QUEUE_WAIT_MS=str(max_queue_wait_ms),
        **{"TOKENGATE_LOGGING__LEVEL": "warning", **env},
    )
    cmd = [sys.executable, "-m", "app.commands.cli", "serve", "--port", str(port)]
    cmd += ["--config", str(config), "--settings", str(settings)]
    gw = group.start(name, cmd, env=environ)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health/ready", gw, timeout=60, ok=lambda r: r.status_code == 200)
    return url, log


def _start(group: Group, tmp: Path, plan: QuotaPlan) -> tuple[str, str, Path]:
    """The quota sim and a gateway whose domain declares the same quota."""
    sim_url = start_sim(group, "quota-sim", plan.rpm, plan.window_sec, plan.sim_latency_ms)
    config = domain_config(tmp, sim_url, DOMAIN, SIM_KEY_ENV, plan.rpm, plan.window_sec)
    settings = subjects.write_settings(tmp / "settings.json", _keys(plan))
    gw_url, log = start_gateway(
        group, "quota-gateway", tmp, (config, settings), SIM_KEY_ENV, plan.max_queue_wait_ms
    )
    return sim_url, gw_url, log


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    alias: str,
    priority: str,
    t0: float,
    headers: dict[str, str],
) -> Outcome:
    sent = time.monotonic()
    status, code = 0, "transport"
    try:
        async with session.post(url, data=common.chat_body(False), headers=headers) as resp:
            raw = await resp.read()
            status, code = resp.status, "" if resp.status == 200 else _error_code(raw)
    except (TimeoutError, aiohttp.ClientError):
        pass
    return Outcome(alias, priority, sent - t0, time.monotonic() - t0, status, code)


def _error_code(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "?"


async def _key_load(
    session: aiohttp.ClientSession,
    url: str,
    spec: tuple[str, str, float],
    plan: QuotaPlan,
    t0: float,
    tasks: list[asyncio.Task[Outcome]],
    headers: dict[str, str],
) -> None:
    """Send this key's share on a fixed schedule (open loop), for the whole window."""
    alias, priority, share = spec
    interval = 1 / (plan.rate * share)
    i = 0
    while (due := i * interval) < plan.seconds:
        await asyncio.sleep(max(0.0, t0 + due - time.monotonic()))
        tasks.append(asyncio.create_task(_send(session, url, alias, priority, t0, headers)))
        i += 1


async def load(
    gw_url: str, plan: QuotaPlan, secret_of: Callable[[str], str] | None = None
) -> tuple[list[Outcome], float]:
    """Offer each of `plan.keys` its share of the quota, open loop, for `plan.seconds`;
    every outcome, and when the offered window ended (seconds after it began)."""
    url = f"{gw_url}/v1/chat/completions"
    secret_of = secret_of or secret
    timeout = aiohttp.ClientTimeout(total=plan.max_queue_wait_ms / 1000 + 20)
    tasks: list[asyncio.Task[Outcome]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        t0 = time.monotonic()
        await asyncio.gather(
            *(
                _key_load(s, url, spec, plan, t0, tasks, subjects.bearer(secret_of(spec[0])))
                for spec in plan.keys
            )
        )
        window_end = time.monotonic() - t0
        outcomes = list(await asyncio.gather(*tasks))
    return outcomes, window_end


_BUCKET = re.compile(
    r'^tokengate_queue_wait_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\}\s+([0-9.e+]+)$'
)


def queue_wait_from_metrics(text: str) -> dict[str, float]:
    """Count, mean and a bucket-bound p99 of `tokengate_queue_wait_seconds` (all domains)."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for line in text.splitlines():
        if m := _BUCKET.match(line):
            le = math.inf if m[1] == "+Inf" else float(m[1])
            buckets[le] = buckets.get(le, 0.0) + float(m[2])
        elif line.startswith("tokengate_queue_wait_seconds_sum"):
            total += float(line.split()[-1])
        elif line.startswith("tokengate_queue_wait_seconds_count"):
            count += float(line.split()[-1])
    p99 = next((le for le, n in sorted(buckets.items()) if count and n >= 0.99 * count), math.nan)
    return {"count": count, "mean_s": total / count if count else math.nan, "p99_bucket_le_s": p99}


def run(tmp: Path, plan: QuotaPlan | None = None) -> dict[str, object]:
    """Start the sim and the gateway, offer the burst, collect; both stop on return."""
    plan = plan or QuotaPlan()
    tmp.mkdir(parents=True, exist_ok=True)
    with Group(tmp) as group:
        sim_url, gw_url, log = _start(group, tmp, plan)
        print(
            f"  quota: {plan.rpm} rpm, window {plan.window_sec:g}s, "
            f"{plan.oversubscription:g}x offered for {plan.seconds:g}s",
            flush=True,
        )
        outcomes, window_end = asyncio.run(load(gw_url, plan))
        result = QuotaRun(plan, outcomes, window_end=window_end)
        stats = httpx.get(f"{sim_url}/_sim/stats", timeout=10).json()
        result.upstream_statuses = dict(stats["statuses"])
        metrics = httpx.get(f"{gw_url}/metrics", timeout=10).text
        result.queue_wait = queue_wait_from_metrics(metrics)
        result.gateway_log = common.log_findings(log)
    return summarize(result)


# -- analysis -----------------------------------------------------------------------------


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 = perfectly equal, 1/n = one takes everything."""
    square_sum = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * square_sum) if square_sum else math.nan


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def _per_class(outcomes: list[Outcome]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for priority in ("high", "normal", "low"):
        mine = [o for o in outcomes if o.priority == priority]
        ok = [o.done - o.sent for o in mine if o.status == 200]
        statuses: dict[str, int] = {}
        for o in mine:
            label = f"{o.status} {o.code}".strip()
            statuses[label] = statuses.get(label, 0) + 1
        out[priority] = {
            "sent": len(mine),
            "statuses": statuses,
            "ok_p50_s": round(percentile(ok, 50), 3),
            "ok_p99_s": round(percentile(ok, 99), 3),
            "all_p99_s": round(percentile([o.done - o.sent for o in mine], 99), 3),
        }
    return out


def _timeline(ok: list[Outcome], last: float, step: float = 5.0) -> list[int]:
    """Successful answers per `step` seconds: the pace the upstream actually saw."""
    counts = [0] * (int(last // step) + 1)
    for o in ok:
        counts[int(o.done // step)] += 1
    return counts


def summarize(run_: QuotaRun) -> dict[str, object]:
    plan = run_.plan
    ok = [o for o in run_.outcomes if o.status == 200]
    in_window = [o for o in ok if o.done <= run_.window_end]
    last = max((o.done for o in ok), default=run_.window_end)
    allowed_window = plan.burst + plan.rate * run_.window_end
    allowed_total = plan.burst + plan.rate * last
    normals = [a for a, p, _ in plan.keys if p == "normal"]
    per_key = {a: sum(1 for o in ok if o.alias == a) for a, _, _ in plan.keys}
    return {
        "plan": {
            "rpm": plan.rpm,
            "window_sec": plan.window_sec,
            "seconds": plan.seconds,
            "oversubscription": plan.oversubscription,
            "max_queue_wait_ms": plan.max_queue_wait_ms,
            "keys": [{"alias": a, "priority": p, "offered_x_quota": s} for a, p, s in plan.keys],
        },
        "sent": len(run_.outcomes),
        "ok": len(ok),
        "window_end_s": round(run_.window_end, 2),
        "last_ok_s": round(last, 2),
        "goodput_in_window": round(len(in_window) / allowed_window, 3),
        "goodput_total": round(len(ok) / allowed_total, 3),
        "quota_allows_in_window": round(allowed_window, 1),
        "upstream_statuses": run_.upstream_statuses,
        "upstream_429": int(run_.upstream_statuses.get("429", 0)),
        "ok_per_key": per_key,
        "ok_per_5s": _timeline(ok, last),
        "jain_normal": round(jain([float(per_key[a]) for a in normals]), 4),
        "per_class": _per_class(run_.outcomes),
        "gateway_queue_wait": {k: round(v, 4) for k, v in run_.queue_wait.items()},
        "gateway_log": run_.gateway_log,
    }


def run_alone(scenario: Callable[[Path], dict[str, object]], name: str) -> int:
    """`python -m tests.bench.<name>`: one scenario in a temp dir, its result as JSON."""
    sigterm_as_interrupt()
    with tempfile.TemporaryDirectory(prefix=f"tokengate-bench-{name}-") as tmp:
        result = scenario(Path(tmp))
    print(json.dumps(result, indent=2))
    return 0


def main() -> int:
    return run_alone(run, "quota")


if __name__ == "__main__":
    raise SystemExit(main())
