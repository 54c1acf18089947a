"""Scenario "affinity": coding-agent sessions over three domains, each with its own cache.

Three `tokengate sim` upstreams are the domains of one gateway; each simulator keeps
its own prompt cache (`app/sim/cache.py`: prefixes at message boundaries, 1024-token
minimum) and reports `prompt_tokens_details.cached_tokens`. 200 agent sessions of 8
turns each run, 32 at a time; every session has a long prefix of its own (a system
prompt of about 1,500 tokens) that each turn repeats with the conversation so far, as
an agent does. Two cases, each on fresh simulators (empty caches):

- `affinity`: the default (`affinity.enabled = true`);
- `no_affinity`: `TOKENGATE_AFFINITY__ENABLED=false` (least expected wait).

Reported per case: cached share = cached tokens / prompt tokens over all turns, against
the ideal share (every turn after a session's first served from cache: its cached part
is the whole previous prompt), their ratio, the requests each domain served and
max / mean of those, and the gateway's `tokengate_affinity_total` outcomes.

Run alone: `.venv/bin/python -m tests.bench.affinity` (about a minute).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import tomli_w

from tests.bench import subjects
from tests.bench.procs import ROOT, Group, free_port, sigterm_as_interrupt, wait_http
from tests.support.scrape import samples

SIM_KEY_ENV = "BENCH_AFFINITY_UPSTREAM_KEY"
CASES = ("affinity", "no_affinity")
WORDS = "build test parse route cache queue token stream domain agent tool patch".split()


@dataclass(frozen=True)
class AffinityPlan:
    domains: int = 3
    sessions: int = 200
    turns: int = 8
    concurrency: int = 32
    prefix_words: int = 1500
    sim_latency_ms: float = 20.0


def secret() -> str:
    return "tg-bench-affinity-0123456789abcdef"


def _config(tmp: Path, sims: list[str]) -> Path:
    config = tomllib.loads((ROOT / "config" / "config.toml").read_text())
    base = dict(config.pop("scale_up", {}))
    config["scale_up"] = [
        base | {"domain": f"d{i}", "api_base": url, "api_key_env": SIM_KEY_ENV}
        for i, url in enumerate(sims)
    ]
    path = tmp / "config.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def _start(group: Group, tmp: Path, plan: AffinityPlan, affinity: bool) -> str:
    sims = []
    for i in range(plan.domains):
        port = free_port()
        cmd = [sys.executable, "-m", "app.commands.cli", "sim", "--port", str(port), "--no-record"]
        cmd += ["--api-key", subjects.UPSTREAM_KEY, "--latency-ms", f"{plan.sim_latency_ms:g}"]
        proc = group.start(f"affinity-sim-{i}", cmd, env=subjects.clean_env())
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/_sim/stats", proc)
        sims.append(url)
    keys = [
        {
            "alias": "agents",
            "key_sha256": subjects.sha256(secret()),
            "requests_per_minute": subjects.HUGE_RPM,
            "tokens_per_minute": subjects.HUGE_TPM,
        }
    ]
    settings = subjects.write_settings(tmp / "settings.json", keys)
    env = subjects.clean_env(
        **{SIM_KEY_ENV: subjects.UPSTREAM_KEY, "TAOTOKEN_API_KEY": subjects.UPSTREAM_KEY},
        TOKENGATE_LOGGING__OUTPUT=str(tmp / "gateway.log"),
        TOKENGATE_LOGGING__LEVEL="warning",
        TOKENGATE_DATABASE__PATH=str(tmp / "tokengate.sqlite3"),
        TOKENGATE_AFFINITY__ENABLED="true" if affinity else "false",
    )
    port = free_port()
    cmd = [sys.executable, "-m", "app.commands.cli", "serve", "--port", str(port)]
    cmd += ["--config", str(_config(tmp, sims)), "--settings", str(settings)]
    gw = group.start("affinity-gateway", cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health/ready", gw, timeout=60, ok=lambda r: r.status_code == 200)
    return url


def _prefix(i: int, words: int) -> str:
    return f"You work on repository {i}. " + " ".join(
        WORDS[(i * 7 + j * 5) % len(WORDS)] for j in range(words)
    )


@dataclass
class Turn:
    domain: str
    prompt: int
    cached: int
    ideal: int


async def _session(http: aiohttp.ClientSession, url: str, i: int, plan: AffinityPlan) -> list[Turn]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _prefix(i, plan.prefix_words)},
        {"role": "user", "content": f"task {i}: fix the failing test"},
    ]
    turns, last = [], 0
    for n in range(plan.turns):
        body = {"model": "gpt-4o", "messages": messages, "max_tokens": 16}
        async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
            resp.raise_for_status()
            answer = await resp.json()
            domain = resp.headers["x-tokengate-domain"]
        usage = answer["usage"]
        prompt = usage["prompt_tokens"]
        turns.append(Turn(domain, prompt, usage["prompt_tokens_details"]["cached_tokens"], last))
        last = prompt
        messages += [answer["choices"][0]["message"], {"role": "user", "content": f"step {n}"}]
    return turns


async def _drive(url: str, plan: AffinityPlan) -> list[Turn]:
    gate = asyncio.Semaphore(plan.concurrency)
    headers = subjects.bearer(secret())

    async def one(i: int) -> list[Turn]:
        async with gate:
            return await _session(http, url, i, plan)

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
        done = await asyncio.gather(*(one(i) for i in range(plan.sessions)))
    return [t for turns in done for t in turns]


def _outcomes(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for sample in samples(text, "tokengate_affinity_total"):
        outcome = sample.labels["outcome"]
        out[outcome] = out.get(outcome, 0.0) + sample.value
    return out


def _case(tmp: Path, plan: AffinityPlan, affinity: bool) -> dict[str, Any]:
    with Group(tmp) as group:
        url = _start(group, tmp, plan, affinity)
        started = time.monotonic()
        turns = asyncio.run(_drive(url, plan))
        wall = time.monotonic() - started
        outcomes = _outcomes(url)
    prompt = sum(t.prompt for t in turns)
    cached = sum(t.cached for t in turns)
    ideal = sum(t.ideal for t in turns)
    served = Counter(t.domain for t in turns)
    counts = [served.get(f"d{i}", 0) for i in range(plan.domains)]
    mean = sum(counts) / len(counts)
    return {
        "requests": len(turns),
        "wall_s": wall,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": cached / prompt,
        "ideal_share": ideal / prompt,
        "share_of_ideal": cached / ideal if ideal else float("nan"),
        "served": {f"d{i}": c for i, c in enumerate(counts)},
        "max_over_mean": max(counts) / mean if mean else float("nan"),
        "outcomes": outcomes,
    }


def run(tmp: Path, plan: AffinityPlan | None = None) -> dict[str, Any]:
    plan = plan or AffinityPlan()
    results: dict[str, Any] = {"plan": plan.__dict__, "cases": {}}
    for case in CASES:
        workdir = tmp / case
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            results["cases"][case] = _case(workdir, plan, affinity=case == "affinity")
        except Exception as exc:  # recorded; the other case still runs
            results["cases"][case] = {"error": f"{type(exc).__name__}: {exc}"}
    return results


def main() -> int:
    sigterm_as_interrupt()
    with tempfile.TemporaryDirectory(prefix="tokengate-affinity-") as tmp:
        print(json.dumps(run(Path(tmp)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
