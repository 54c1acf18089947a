"""`make bench`: the side-by-side benchmark, one bounded run on loopback.

Scenarios, in order (each one's failure is recorded and the next one still runs):
1. static, non-streaming and streaming: direct / nginx-proxy / tokengate 1 and 2
   workers (+ 1 worker at info log level) / LiteLLM in front of a static nginx
   upstream, wrk at c = 1, 16, 64, 256 (`throughput.py`);
2. sim: added latency and time to first token at c=1 in front of `tokengate sim`
   with a model-like pace (`latency.py`);
2b. streams: CPU per relayed SSE event against nginx's, and RSS with 2,000 streams held
   open at once (`streams.py`);
3. quota: 5x oversubscribed burst against a quota-enforcing sim (`quota.py`);
4. throttle: a burst against an upstream that quantizes its quota, with the quota
   configured right, absent, 2x too high, on two replicas sharing Redis, and LiteLLM
   on the same burst (`throttle.py`);
5. admission: cost of one per-key admission, memory vs Redis vs none (`admission.py`);
6. redis: one worker with limits (and a domain's pace) shared through Redis against
   the same with in-process limits at c=64, with Redis commands per request
   (`shared.py`);
7. affinity: 200 agent sessions of 8 turns over three domains with their own prompt
   caches, with and without prompt-cache affinity (`affinity.py`);
8. offpeak: 2,000 deferred requests released into an off-peak window beside interactive
   traffic, against a run without them (`offpeak.py`, about 4 minutes).

Writes tests/bench/results/<timestamp>/results.{json,md} and latest.{json,md}.
Everything started is stopped on exit, error or Ctrl-C (process groups; see procs.py).
The first run installs LiteLLM into its own venv (outside the repo); that time is
reported but not counted in the run's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from tests.bench import (
    admission,
    affinity,
    common,
    latency,
    offpeak,
    quota,
    report,
    shared,
    streams,
    subjects,
    targets,
    throttle,
    throughput,
)
from tests.bench.common import Plan
from tests.bench.procs import ROOT, Group, sigterm_as_interrupt
from tests.bench.rss import Sampler
from tests.support.procs import in_build

RESULTS = ROOT / "tests" / "bench" / "results"
SCENARIOS = (
    "static",
    "sim",
    "streams",
    "quota",
    "throttle",
    "admission",
    "redis",
    "affinity",
    "offpeak",
)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.bench.run", description=__doc__.splitlines()[0]
    )
    p.add_argument("--seconds", type=float, default=5.0, help="length of one wrk cell (default 5)")
    p.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--no-litellm", action="store_true", help="skip LiteLLM (no install)")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--budget", type=float, default=570.0, help="skip scenarios past this many s")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (configs, logs)")
    p.add_argument(
        "--build",
        default="",
        help="run tokengate from the build installed in this directory (make bench: the "
        "compiled build, build/compiled), with the source beside it at c=1..256",
    )
    return p.parse_args(argv)


def _plan(args: argparse.Namespace) -> Plan:
    pin = not args.no_pin and shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    base = Plan(seconds=args.seconds)
    return base if pin else Plan.unpinned(seconds=args.seconds)


def _output(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({type(exc).__name__})"
    return (
        (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else ""
    )


def _commit() -> str:
    """The commit measured, marked when app/ had uncommitted changes (a shared tree)."""
    head = _output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "app"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{head} (app/ modified)" if dirty else head


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _meta(plan: Plan, litellm_version: str | None) -> dict[str, Any]:
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    versions = {
        "tokengate": metadata.version("tokengate"),
        "python": platform.python_version(),
        "nginx": _output(["/usr/sbin/nginx", "-v"]).replace("nginx version: ", ""),
        "wrk": _output(["/usr/bin/wrk", "--version"]).split(" Copyright")[0],
        "redis-server": _output(["redis-server", "--version"]).split(" sha=")[0],
    }
    if litellm_version:
        versions["litellm"] = litellm_version
    if plan.load_cpus:
        cpu_plan = (
            f"wrk + upstream (nginx / sim) on CPU {plan.load_cpus}, single-process subjects on "
            f"CPU {plan.subject_cpus}, tokengate-2w unpinned (both CPUs)"
        )
    else:
        cpu_plan = "nothing pinned"
    return {
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "nproc": _output(["nproc"]),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.platform(),
        "loadavg_before": Path("/proc/loadavg").read_text().split()[:3],
        "cpu_plan": cpu_plan,
        "plan": {"seconds": plan.seconds, "warmup": plan.warmup, "levels": list(plan.levels)},
        "versions": versions,
        "body": common.chat_body(False),
        "gateway_logging": "level warning (per-request JSON access lines are info: "
        "tokengate-1w-info measures them on)",
    }


def _install_litellm(results: dict[str, Any]) -> bool:
    started = time.monotonic()
    try:
        subjects.ensure_litellm()
    except Exception as exc:  # recorded; the other subjects still run
        results["errors"].append(f"litellm install failed: {type(exc).__name__}: {exc}")
        return False
    finally:
        results["meta_install_s"] = time.monotonic() - started
    return True


def _scenario(
    results: dict[str, Any], name: str, started: float, budget: float, fn: Callable[[], Any]
) -> None:
    """Run one scenario; an exception is a result, not the end of the benchmark."""
    elapsed = time.monotonic() - started
    if elapsed > budget:
        results["errors"].append(
            f"{name}: skipped, {elapsed:.0f}s already past the {budget:.0f}s budget"
        )
        return
    print(f"== {name} (t={elapsed:.0f}s)", flush=True)
    try:
        fn()
    except Exception as exc:  # keep going, say what broke
        traceback.print_exc()
        results["errors"].append(f"{name}: {type(exc).__name__}: {exc}")


def _measure(
    args: argparse.Namespace,
    plan: Plan,
    tmp: Path,
    results: dict[str, Any],
    litellm: bool,
    started: float,
) -> None:
    only = set(args.only)
    with Group(tmp) as group, Sampler() as sampler:

        def static() -> None:
            up = throughput.start_upstream(group, tmp, plan)
            results["static"] = {}
            for mode in ("json", "sse"):
                phase = throughput.run_phase(group, sampler, tmp, up, mode, plan, litellm=litellm)
                results["static"][mode] = phase.as_dict()
            group.stop(up.server.proc)

        def sim() -> None:
            results["sim"] = latency.run(group, tmp, plan, litellm=litellm).as_dict()

        def streams_() -> None:
            results["streams"] = streams.run(group, tmp, plan).as_dict()

        def quota_() -> None:
            results["quota"] = quota.run(tmp / "quota")

        def throttle_() -> None:
            cases = tuple(c for c in throttle.CASES if litellm or c != "litellm")
            results["throttle"] = throttle.run(tmp / "throttle", cases)

        def admission_() -> None:
            results["admission"] = admission.run(group)

        def redis_() -> None:
            results["redis"] = shared.run(group, tmp, plan)

        def affinity_() -> None:
            results["affinity"] = affinity.run(tmp / "affinity")

        def offpeak_() -> None:
            results["offpeak"] = offpeak.run(tmp / "offpeak")

        steps = {
            "static": static,
            "sim": sim,
            "streams": streams_,
            "quota": quota_,
            "throttle": throttle_,
            "admission": admission_,
            "redis": redis_,
            "affinity": affinity_,
            "offpeak": offpeak_,
        }
        for name in SCENARIOS:
            if name in only:
                _scenario(results, name, started, args.budget, steps[name])


def _write(results: dict[str, Any]) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / stamp
    out.mkdir(parents=True, exist_ok=True)
    text = json_dump(results)
    md = report.render(results)
    (out / "results.json").write_text(text)
    (out / "results.md").write_text(md)
    (RESULTS / "latest.json").write_text(text)
    (RESULTS / "latest.md").write_text(md)
    return out


def json_dump(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2, default=str, allow_nan=True)


def _build_shown(directory: str) -> str:
    """Which build the tokengate subjects ran, as that build itself reports it."""
    if not directory:
        return "the repo's source (interpreted)"
    probe = "from app import build; print(build.build_name(), *build.compiled_modules())"
    shown = _output(in_build(directory, probe))
    return f"{shown} (installed in {directory}; tokengate-1w-source: the repo's source)"


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    sigterm_as_interrupt()
    plan = _plan(args)
    subjects.use_build(args.build)
    results: dict[str, Any] = {"errors": []}
    litellm = not args.no_litellm and _install_litellm(results)
    install_s = results.pop("meta_install_s", 0.0)
    results["meta"] = _meta(plan, subjects.litellm_version() if litellm else None)
    results["meta"]["litellm_install_s"] = install_s
    results["meta"]["build"] = _build_shown(subjects.BUILD)
    tmp = Path(tempfile.mkdtemp(prefix="tokengate-bench-"))
    tmp.chmod(0o755)  # nginx's workers (user nobody when run as root) read below it
    code = 0
    started = time.monotonic()
    try:
        _measure(args, plan, tmp, results, litellm, started)
    except KeyboardInterrupt:
        results["errors"].append("interrupted (Ctrl-C / SIGTERM): partial results")
        code = 130
    finally:
        results["meta"]["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
        results["meta"]["wall_s"] = time.monotonic() - started
        if args.keep:
            print(f"temp dir kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    results["targets"] = [t.as_dict() for t in targets.evaluate(results)]
    out = _write(results)
    print(report.render(results))
    print(
        f"\nresults: {out}/results.md (and {RESULTS}/latest.md); "
        f"wall {results['meta']['wall_s']:.0f}s"
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
