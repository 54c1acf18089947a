"""Other engines under tokengate itself: granian (ASGI) against uvicorn as the server, and
pyreqwest against aiohttp as the upstream client.

    python -m tests.bench.engines [--seconds 5] [--rounds 2] [-c 64] [--build build/compiled]

Issue #32 asks whether a faster server or upstream client moves the floor. This runs,
against the static nginx upstream (non-streaming), interleaved cell by cell:

- `tokengate-uvicorn`: `tokengate serve --workers 1` (uvicorn, uvloop, httptools);
- `tokengate-granian`: the same app (`app.main.create_app` on the same runtime, every
  default feature on) served by granian (`--interface asgi --loop uvloop
  --runtime-mode st --workers 1 --no-ws`), via `granian_app:app`;
- `floor-relay` and `floor-relay-granian`: `floor_app:relay` (uvicorn + aiohttp, nothing
  of tokengate) under each server;
- `tokengate-pyreqwest`: the same app on uvicorn (as `serve` runs it) with pyreqwest as
  the upstream client (`reqwest_transport.py`, built by `reqwest_app:app`).

granian and pyreqwest are not dependencies of tokengate: `pip install granian pyreqwest`
into the venv first (`--only` leaves out what is not installed).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from tests.bench import common, subjects, throughput
from tests.bench.common import Plan
from tests.bench.procs import (
    ROOT,
    Group,
    free_port,
    scratch,
    sigterm_as_interrupt,
    wait_http,
    wait_port,
)

SUBJECTS = (
    "tokengate-uvicorn",
    "tokengate-granian",
    "tokengate-pyreqwest",
    "floor-relay",
    "floor-relay-granian",
)


def _granian(target: str, port: int, factory: bool) -> list[str]:
    exe = shutil.which("granian") or str(Path(sys.executable).parent / "granian")
    cmd = [exe, "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--workers", "1", "--loop", "uvloop", "--runtime-mode", "st", "--no-ws"]
    cmd += ["--log-level", "warning", "--http", "1"]
    return [*cmd, *(["--factory"] if factory else []), target]


def _gateway_env(workdir: Path, upstream: str) -> dict[str, str]:
    """What `subjects.tokengate` gives `tokengate serve`, for an app started otherwise."""
    key: dict[str, object] = {"alias": "bench", "key_sha256": subjects.sha256(subjects.GATEWAY_KEY)}
    key |= {"requests_per_minute": subjects.HUGE_RPM, "tokens_per_minute": subjects.HUGE_TPM}
    settings = subjects.write_settings(workdir / "settings.json", [key])
    return subjects.clean_env(
        TAOTOKEN_API_KEY=subjects.UPSTREAM_KEY,
        TOKENGATE_API_ENDPOINT=upstream,
        TOKENGATE_LOGGING__OUTPUT=str(workdir / "gateway.log"),
        TOKENGATE_LOGGING__LEVEL="warning",
        TOKENGATE_DATABASE__PATH=str(workdir / "tokengate.sqlite3"),
        TOKENGATE_RATE_LIMIT__REQUESTS_PER_MINUTE=str(subjects.HUGE_RPM),
        TOKENGATE_RATE_LIMIT__TOKENS_PER_MINUTE=str(subjects.HUGE_TPM),
        TOKENGATE_CONFIG=str(ROOT / "config" / "config.toml"),
        TOKENGATE_SETTINGS=str(settings),
    )


def tokengate_granian(group: Group, workdir: Path, upstream: str) -> subjects.Subject:
    workdir.mkdir(parents=True, exist_ok=True)
    env = _gateway_env(workdir, upstream)
    if subjects.BUILD:
        env["BENCH_BUILD"] = subjects.BUILD
    port = free_port()
    proc = group.start(
        "tokengate-granian", _granian("tests.bench.granian_app:app", port, True), env=env
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health/ready", proc, timeout=60, ok=lambda r: r.status_code == 200)
    notes = ["granian ASGI, 1 worker, uvloop, single-threaded runtime; every default feature"]
    return subjects.Subject(
        "tokengate-granian", url, subjects.bearer(subjects.GATEWAY_KEY), proc, notes
    )


def tokengate_reqwest(group: Group, workdir: Path, upstream: str) -> subjects.Subject:
    """tokengate on uvicorn with pyreqwest as its upstream client (`reqwest_app.py`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = _gateway_env(workdir, upstream)
    port = free_port()
    exe = shutil.which("uvicorn") or str(Path(sys.executable).parent / "uvicorn")
    cmd = [exe, "--factory", "tests.bench.reqwest_app:app", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--loop", "uvloop", "--http", "httptools", "--no-access-log"]
    cmd += ["--no-server-header", "--no-proxy-headers", "--timeout-keep-alive", "30"]
    cmd += ["--log-level", "warning"]
    proc = group.start("tokengate-pyreqwest", cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health/ready", proc, timeout=60, ok=lambda r: r.status_code == 200)
    notes = ["uvicorn (uvloop, httptools), pyreqwest upstream client; every default feature"]
    return subjects.Subject(
        "tokengate-pyreqwest", url, subjects.bearer(subjects.GATEWAY_KEY), proc, notes
    )


def relay_granian(group: Group, upstream: str) -> subjects.Subject:
    port = free_port()
    env = subjects.clean_env(FLOOR_UPSTREAM=upstream, FLOOR_CANNED="json")
    proc = group.start(
        "floor-relay-granian", _granian("tests.bench.floor_app:relay", port, False), env=env
    )
    wait_port(port, proc, timeout=30)
    url = f"http://127.0.0.1:{port}"
    return subjects.Subject(
        "floor-relay-granian", url, subjects.bearer(subjects.UPSTREAM_KEY), proc
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.engines", description=__doc__)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("-c", type=int, default=64)
    p.add_argument(
        "--only",
        nargs="+",
        choices=SUBJECTS,
        default=list(SUBJECTS),
        help="subjects to run (default: all)",
    )
    p.add_argument(
        "--build",
        default="",
        help="run tokengate (under uvicorn and granian) from the build installed in this "
        "directory (make compiled: build/compiled); pyreqwest's subject patches the source "
        "and is left out",
    )
    args = p.parse_args(argv)
    if args.build:
        subjects.use_build(args.build)
        args.only = [name for name in args.only if name != "tokengate-pyreqwest"]
    sigterm_as_interrupt()
    plan = Plan.unpinned(seconds=args.seconds)
    with scratch("tokengate-engines-") as tmp, Group(tmp) as group:
        up = throughput.start_upstream(group, tmp, plan)
        url = up.json_url
        start = {
            "tokengate-uvicorn": lambda: subjects.tokengate(
                group, "tokengate-uvicorn", tmp / "tgu", url, workers=1
            ),
            "tokengate-granian": lambda: tokengate_granian(group, tmp / "tgg", url),
            "tokengate-pyreqwest": lambda: tokengate_reqwest(group, tmp / "tgr", url),
            "floor-relay": lambda: subjects.floor(
                group, "floor-relay", "relay", url, stream=False, cpus=None
            ),
            "floor-relay-granian": lambda: relay_granian(group, url),
        }
        subs = [start[name]() for name in SUBJECTS if name in args.only]
        body = common.chat_body(False)
        for s in subs:
            common.cell(s, body, args.c, plan, tmp, seconds=1)  # warm-up
        rows: dict[str, list[dict[str, object]]] = {s.name: [] for s in subs}
        for _ in range(args.rounds):
            for s in subs:
                rows[s.name].append(common.cell(s, body, args.c, plan, tmp))
        build = f", tokengate from {subjects.BUILD}" if subjects.BUILD else ""
        print(f"c={args.c}, {args.seconds:g} s a cell, {args.rounds} rounds, unpinned{build}")
        print("| subject | req/s per round | CPU µs/request | non-2xx | other load |")
        print("|---|---|---|---|---|")
        for name, cells in rows.items():
            rps = " · ".join(f"{c['rps']}" for c in cells)
            cpu = " · ".join(f"{c['subject_cpu_us_per_req']}" for c in cells)
            bad = sum(int(str(c["status"])) for c in cells)
            other = " · ".join(f"{c['other_cpu_util']}" for c in cells)
            print(f"| {name} | {rps} | {cpu} | {bad} | {other} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
