"""What the status page's ring costs a request, measured two ways in one run.

1. micro: the recording calls one streamed request makes (`record_queue_wait`,
   `record_ttft`, `record_answer`) on a `Metrics`, without and with a `StatusBoard`
   attached: ns per request, best of `REPEATS` (a shared machine only makes runs slower).
2. macro: `tokengate serve` with `ui.enabled` true and false, one after the other on the
   same pinned core, in front of the static nginx upstream, wrk at c=16, interleaved
   `ROUNDS` times: requests/s and the gateway's CPU µs per request, and their ratios.

Run alone: `.venv/bin/python -m tests.bench.status_cost [--seconds 3] [--rounds 3]`
(needs nginx and wrk: `make bench-deps`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from app.billing.ledger import UsageEntry
from app.metrics import Metrics
from app.status.board import StatusBoard
from tests.bench import common, subjects, throughput
from tests.bench.common import Plan
from tests.bench.procs import Group, sigterm_as_interrupt

ENTRY = UsageEntry("bench", "claude-sonnet", prompt_tokens=4, completion_tokens=16)
CALLS = 100_000
REPEATS = 7


def _per_request_ns(board: StatusBoard | None) -> float:
    metrics = Metrics(CollectorRegistry(), models=["claude-sonnet"])
    metrics.watch(board)
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter_ns()
        for _ in range(CALLS):
            metrics.record_queue_wait("domain-a", 0.0004)
            metrics.record_ttft("domain-a", "claude-sonnet", 0.012)
            metrics.record_answer("domain-a", "claude-sonnet", ENTRY, 200, 0.03)
        best = min(best, (time.perf_counter_ns() - started) / CALLS)
    return best


def micro() -> dict[str, float]:
    off, on = _per_request_ns(None), _per_request_ns(StatusBoard())
    return {
        "metrics_ns_per_request": round(off),
        "metrics_and_ring_ns_per_request": round(on),
        "ring_ns_per_request": round(on - off),
        "ratio": round(on / off, 3),
    }


def macro(seconds: float, rounds: int) -> dict[str, object]:
    plan = Plan(seconds=seconds)
    body = common.chat_body(False)
    cells: dict[str, list[dict[str, object]]] = {"ui on": [], "ui off": []}
    with tempfile.TemporaryDirectory() as tmp_name, Group(Path(tmp_name)) as group:
        tmp = Path(tmp_name)
        up = throughput.start_upstream(group, tmp, plan)
        gateways = {
            name: subjects.tokengate(
                group,
                name.replace(" ", "-"),
                tmp / name.replace(" ", "-"),
                up.json_url,
                workers=1,
                cpus=plan.subject_cpus,
                extra_env={"TOKENGATE_UI__ENABLED": str(name == "ui on").lower()},
            )
            for name in cells
        }
        for subject in gateways.values():
            common.cell(subject, body, 16, plan, tmp, seconds=plan.warmup)
        order = list(gateways.items())
        for _ in range(rounds):
            order.reverse()  # neither variant always runs first
            for name, subject in order:
                common.wait_quiet(subject.pid or 0)
                cells[name].append(common.cell(subject, body, 16, plan, tmp))
    summary: dict[str, object] = {}
    for name, runs in cells.items():
        summary[name] = {
            "rps": round(statistics.median(float(str(c["rps"])) for c in runs), 1),
            "cpu_us_per_req": round(
                statistics.median(float(str(c["subject_cpu_us_per_req"])) for c in runs),
                1,
            ),
            "rounds_rps": [c["rps"] for c in runs],
        }
    on, off = summary["ui on"], summary["ui off"]
    summary["rps_ratio_on_to_off"] = round(on["rps"] / off["rps"], 3)  # type: ignore[index]
    summary["cpu_ratio_on_to_off"] = round(on["cpu_us_per_req"] / off["cpu_us_per_req"], 3)  # type: ignore[index]
    return summary


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.status_cost")
    p.add_argument("--seconds", type=float, default=3.0, help="per wrk cell")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--micro-only", action="store_true")
    args = p.parse_args()
    out: dict[str, object] = {"micro": micro()}
    if not args.micro_only:
        sigterm_as_interrupt()
        out["macro_c16_json"] = macro(args.seconds, args.rounds)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
