"""Scenario "offpeak": 2,000 deferred requests released into an off-peak window against a
quota-limited upstream, beside the same interactive traffic without them.

`tokengate sim --rpm R` enforces an upstream quota (429 past it); the gateway's domain
declares it, so the gateway paces under it. A Batch API job of `items` requests is held
for the `offpeak` billing window (it opens at the next minute boundary after the job is
submitted) and then released; from that moment interactive traffic is offered open-loop
at `interactive_share` of the quota for `seconds`. The same interactive load is offered
again to a fresh gateway with no batch. Reported for both runs: the interactive
requests' queue wait (the gateway's own `queue_ms` per request, from its access log:
p50, p95, p99), their statuses, the upstream's 429s, and for the deferred run the batch's
goodput (items per second after release, against what the quota leaves interactive
traffic) and its time from release to completion.

Run alone: `.venv/bin/python -m tests.bench.offpeak` (about 4 minutes).
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import tomli_w

from tests.bench import common, subjects
from tests.bench.procs import ROOT, Group, free_port, sigterm_as_interrupt, wait_http
from tests.bench.quota import percentile

SIM_KEY_ENV = "BENCH_OFFPEAK_UPSTREAM_KEY"
DOMAIN = "offpeak-domain"
KEYS = ("web", "batch")


@dataclass(frozen=True)
class Plan:
    rpm: int = 2400  # the upstream key's quota: 40 requests/s
    window_sec: float = 2.0
    items: int = 2000
    interactive_share: float = 0.5  # of the quota, offered open-loop
    seconds: float = 60.0
    sim_latency_ms: float = 20.0
    max_queue_wait_ms: int = 10_000


def secret(alias: str) -> str:
    return f"tg-bench-offpeak-{alias}-0123456789abcdef"


def _config(tmp: Path, sim_url: str, plan: Plan) -> Path:
    config = tomllib.loads((ROOT / "config" / "config.toml").read_text())
    table = dict(config.pop("scale_up", {}))
    table |= {
        "domain": DOMAIN,
        "api_base": sim_url,
        "api_key_env": SIM_KEY_ENV,
        "requests_per_minute": plan.rpm,
        "quota_window_sec": plan.window_sec,
    }
    config["scale_up"] = [table]
    path = tmp / "config.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def _settings(tmp: Path, opens: datetime) -> Path:
    keys = [
        {
            "alias": alias,
            "key_sha256": subjects.sha256(secret(alias)),
            "requests_per_minute": subjects.HUGE_RPM,
            "tokens_per_minute": subjects.HUGE_TPM,
        }
        for alias in KEYS
    ]
    path = subjects.write_settings(tmp / "settings.json", keys)
    settings = json.loads(path.read_text())
    start, end = opens.strftime("%H:%M"), (opens + timedelta(hours=2)).strftime("%H:%M")
    settings["billing"] = {"windows": {"offpeak": {"start": start, "end": end}}}
    path.write_text(json.dumps(settings, indent=2))
    return path


def _start(group: Group, tmp: Path, plan: Plan, opens: datetime) -> tuple[str, str, Path]:
    sim_port, gw_port = free_port(), free_port()
    sim_cmd = [sys.executable, "-m", "app.commands.cli", "sim", "--port", str(sim_port)]
    sim_cmd += ["--api-key", subjects.UPSTREAM_KEY, "--no-record", "--rpm", str(plan.rpm)]
    sim_cmd += ["--quota-window-sec", f"{plan.window_sec:g}"]
    sim_cmd += ["--latency-ms", f"{plan.sim_latency_ms:g}"]
    sim = group.start(f"{tmp.name}-sim", sim_cmd, env=subjects.clean_env())
    sim_url = f"http://127.0.0.1:{sim_port}"
    wait_http(f"{sim_url}/_sim/stats", sim)
    log = tmp / "gateway.log"
    env = subjects.clean_env(
        **{SIM_KEY_ENV: subjects.UPSTREAM_KEY, "TAOTOKEN_API_KEY": subjects.UPSTREAM_KEY},
        TOKENGATE_LOGGING__OUTPUT=str(log),
        TOKENGATE_LOGGING__LEVEL="info",
        TOKENGATE_DATABASE__PATH=str(tmp / "tokengate.sqlite3"),
        TOKENGATE_TOKEN_SCHEDULER__MAX_QUEUE_WAIT_MS=str(plan.max_queue_wait_ms),
        TOKENGATE_BATCH__MAX_ITEMS=str(max(plan.items, 50_000)),
    )
    cmd = [sys.executable, "-m", "app.commands.cli", "serve", "--port", str(gw_port)]
    cmd += ["--config", str(_config(tmp, sim_url, plan)), "--settings", str(_settings(tmp, opens))]
    gw = group.start(f"{tmp.name}-gateway", cmd, env=env)
    gw_url = f"http://127.0.0.1:{gw_port}"
    wait_http(f"{gw_url}/health/ready", gw, timeout=60, ok=lambda r: r.status_code == 200)
    return sim_url, gw_url, log


def _submit(gw_url: str, plan: Plan) -> str:
    headers = {"authorization": f"Bearer {secret('batch')}"}  # multipart: no JSON type
    lines = [
        json.dumps(
            {
                "custom_id": f"item-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": json.loads(common.chat_body(False)),
            }
        )
        for i in range(plan.items)
    ]
    data = ("\n".join(lines) + "\n").encode()
    files = {"file": ("in.jsonl", io.BytesIO(data))}
    up = httpx.post(
        f"{gw_url}/v1/files", headers=headers, files=files, data={"purpose": "batch"}, timeout=60
    )
    if up.status_code != 200:
        raise RuntimeError(f"upload refused: {up.status_code} {up.text[:300]}")
    body = {
        "input_file_id": up.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    made = httpx.post(f"{gw_url}/v1/batches", headers=headers, json=body, timeout=60)
    if made.status_code != 200:
        raise RuntimeError(f"batch refused: {made.status_code} {made.text[:300]}")
    return str(made.json()["id"])


def _batch(gw_url: str, batch_id: str) -> dict[str, Any]:
    headers = subjects.bearer(secret("batch"))
    return dict(httpx.get(f"{gw_url}/v1/batches/{batch_id}", headers=headers, timeout=30).json())


async def _interactive(gw_url: str, plan: Plan) -> list[int]:
    url, headers = f"{gw_url}/v1/chat/completions", subjects.bearer(secret("web"))
    interval = 1 / (plan.rpm / 60 * plan.interactive_share)
    statuses: list[int] = []

    async def one(session: aiohttp.ClientSession) -> None:
        try:
            async with session.post(url, data=common.chat_body(False), headers=headers) as r:
                await r.read()
                statuses.append(r.status)
        except (TimeoutError, aiohttp.ClientError):
            statuses.append(0)

    timeout = aiohttp.ClientTimeout(total=plan.max_queue_wait_ms / 1000 + 20)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        t0, tasks, i = time.monotonic(), [], 0
        while (due := i * interval) < plan.seconds:
            await asyncio.sleep(max(0.0, t0 + due - time.monotonic()))
            tasks.append(asyncio.create_task(one(s)))
            i += 1
        await asyncio.gather(*tasks)
    return statuses


def _queue_ms(log: Path, key: str) -> list[float]:
    out = []
    for line in log.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("logger") == "tokengate.access" and row.get("key") == key:
            out.append(float(row.get("queue_ms") or 0.0))
    return out


def _one(tmp: Path, plan: Plan, deferred: bool) -> dict[str, object]:
    tmp.mkdir(parents=True, exist_ok=True)
    opens = (datetime.now(UTC) + timedelta(minutes=2)).replace(second=0, microsecond=0)
    with Group(tmp) as group:
        sim_url, gw_url, log = _start(group, tmp, plan, opens)
        result: dict[str, object] = {"deferred_items": plan.items if deferred else 0}
        batch_id = _submit(gw_url, plan) if deferred else None
        if batch_id is not None:
            while (held := _batch(gw_url, batch_id).get("tokengate_deferral")) is None:
                time.sleep(0.5)
            result["held_until"] = held["release_at"]
            while not _batch(gw_url, batch_id)["tokengate_deferral"].get("released_at"):
                time.sleep(0.2)
        released = time.monotonic()
        statuses = asyncio.run(_interactive(gw_url, plan))
        if batch_id is not None:
            while (b := _batch(gw_url, batch_id))["status"] not in ("completed", "failed"):
                time.sleep(0.5)
            took = time.monotonic() - released
            done = int(b["request_counts"]["completed"])
            spare = plan.rpm / 60 * (1 - plan.interactive_share)
            result |= {
                "batch_status": b["status"],
                "batch_completed": done,
                "batch_seconds_after_release": round(took, 1),
                "batch_items_per_sec": round(done / took, 2),
                "batch_goodput_of_spare_quota": round(done / took / spare, 3),
                "early": b["tokengate_deferral"]["early"],
            }
        waits = _queue_ms(log, "web")
        stats = httpx.get(f"{sim_url}/_sim/stats", timeout=10).json()
        counts: dict[str, int] = {}
        for s in statuses:
            counts[str(s)] = counts.get(str(s), 0) + 1
        result |= {
            "interactive_sent": len(statuses),
            "interactive_statuses": counts,
            "interactive_queue_ms_p50": round(percentile(waits, 50), 2),
            "interactive_queue_ms_p95": round(percentile(waits, 95), 2),
            "interactive_queue_ms_p99": round(percentile(waits, 99), 2),
            "upstream_statuses": dict(stats["statuses"]),
            "upstream_429": int(stats["statuses"].get("429", 0)),
        }
    return result


def run(tmp: Path, plan: Plan | None = None) -> dict[str, object]:
    plan = plan or Plan()
    print(f"  offpeak: {plan.rpm} rpm quota, {plan.items} deferred items", flush=True)
    return {
        "plan": plan.__dict__,
        "without_deferred": _one(tmp / "plain", plan, deferred=False),
        "with_deferred": _one(tmp / "deferred", plan, deferred=True),
    }


def main() -> int:
    sigterm_as_interrupt()
    with tempfile.TemporaryDirectory(prefix="tokengate-bench-offpeak-") as tmp:
        result = run(Path(tmp))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
