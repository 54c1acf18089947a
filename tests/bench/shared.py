"""Scenario "redis": what sharing limits through Redis costs one replica (issue 22).

One tokengate worker with in-process limits (`tokengate-1w`) and the same with limits
shared through a `redis-server` on loopback (`tokengate-1w-redis`), plus the same with
its domain paced through Redis (`tokengate-1w-redis-paced`: a domain quota far above
the load, so every request books a shared pace slot and none waits), all in front of
the static nginx upstream at c=64. Cells are interleaved, `ROUNDS` rounds of each, and
the median of each subject's rounds is compared, so drift of a shared machine moves
all of them alike. Redis runs on the load generator's CPU, not the gateway's: what is
measured is the gateway's own cost of talking to Redis.

Beside each cell, from `INFO commandstats` before and after it (heartbeats and the
live-limits poll included, the INFO calls themselves not): the calls the gateway sent
per request (`EVALSHA` and plain commands: what costs it CPU and round trips), and the
commands Redis executed per request, those run inside the scripts included.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import redis as redis_lib

from tests.bench import common, subjects, throughput
from tests.bench.common import Plan
from tests.bench.procs import Group

ROUNDS = 3
C = 64
PACED = {"requests_per_minute": 10**9}  # paced (every request books a slot), never waits
# Run only inside our Lua scripts: executed by Redis, never sent by the gateway.
IN_SCRIPTS = {"time", "hmget", "hset", "pexpire", "del", "zadd", "zremrangebyscore", "zcard"}
IN_SCRIPTS |= {"get", "set"}


def _commands(port: int) -> dict[str, int]:
    client = redis_lib.Redis(port=port)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in stats.items()
        if name != "cmdstat_info"
    }


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def run(group: Group, tmp: Path, plan: Plan) -> dict[str, Any]:
    up = throughput.start_upstream(group, tmp / "redis-upstream", plan)
    work, cpus = tmp / "redis-scenario", plan.subject_cpus
    ports: dict[str, int] = {}

    def shared(name: str, paced: bool) -> subjects.Subject:
        url = subjects.redis_server(group, cpus=plan.load_cpus)
        assert url is not None, "redis-server is not installed"
        ports[name] = int(url.rsplit(":", 1)[1].split("/")[0])
        return subjects.tokengate(
            group, name, work / name, up.json_url, workers=1, cpus=cpus, redis_url=url,
            extra_env={"TOKENGATE_SCALE_UP": json.dumps(PACED)} if paced else None,
        )  # fmt: skip

    cast = [
        subjects.tokengate(group, "tokengate-1w", work / "tg1", up.json_url, workers=1, cpus=cpus),
        shared("tokengate-1w-redis", paced=False),
        shared("tokengate-1w-redis-paced", paced=True),
    ]
    for subject, name in zip(cast, ("tokengate-1w", *ports), strict=True):
        subject.name = name
        problem = common.preflight(subject, stream=False)
        assert problem is None, f"{name}: {problem}"
    body = common.chat_body(False)
    for subject in cast:
        common.cell(subject, body, 16, plan, tmp, seconds=plan.warmup)
    cells: list[dict[str, Any]] = []
    for n in range(ROUNDS):
        for subject in cast:
            port = ports.get(subject.name)
            before = _commands(port) if port else {}
            row = common.cell(subject, body, C, plan, tmp, upstream_pid=up.pid)
            if port:
                used = _delta(before, _commands(port))
                row["redis_commands"] = used
                requests = int(str(row["requests"])) or 1
                sent = sum(n for cmd, n in used.items() if cmd not in IN_SCRIPTS)
                row["redis_calls_per_request"] = round(sent / requests, 4)
                row["redis_commands_per_request"] = round(sum(used.values()) / requests, 4)
            row["round"] = n
            cells.append(row)
            print(
                f"    redis c={C} round {n} {subject.name:26} {row['rps']:>9} req/s  "
                f"cpu {row['subject_cpu_us_per_req']} µs/req  "
                f"redis calls/req {row.get('redis_calls_per_request', '-')} "
                f"(commands run {row.get('redis_commands_per_request', '-')})",
                flush=True,
            )
    for subject in cast:
        group.stop(subject.proc) if subject.proc else None
    group.stop(up.server.proc)
    return {"c": C, "rounds": ROUNDS, "cells": cells, "summary": _summary(cells)}


def _summary(cells: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(c["subject"] for c in cells):
        mine = [c for c in cells if c["subject"] == name]
        row: dict[str, Any] = {
            "rps": statistics.median(float(c["rps"]) for c in mine),
            "cpu_us_per_req": statistics.median(float(c["subject_cpu_us_per_req"]) for c in mine),
            "errors": sum(int(c["errors"]) for c in mine),
        }
        per_request = [c["redis_commands_per_request"] for c in mine if "redis_commands" in c]
        if per_request:
            row["redis_commands_per_request"] = statistics.median(per_request)
            row["redis_calls_per_request"] = statistics.median(
                c["redis_calls_per_request"] for c in mine
            )
            total: dict[str, int] = {}
            for c in mine:
                for cmd, calls in c["redis_commands"].items():
                    total[cmd] = total.get(cmd, 0) + calls
            requests = sum(int(c["requests"]) for c in mine) or 1
            row["per_command"] = {k: round(v / requests, 4) for k, v in sorted(total.items())}
        out[name] = row
    base = out.get("tokengate-1w", {}).get("rps")
    for row in out.values():
        row["x_inprocess"] = round(row["rps"] / base, 3) if base else None
    return out
