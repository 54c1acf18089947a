"""Where a proxied request's CPU goes: py-spy's frames and callgrind's instruction count.

    python -m tests.bench.profile [--mode json|sse] [-c 64] [--seconds 15]
    python -m tests.bench.profile --callgrind [--mode json|sse] [-c 8]

Starts the static nginx upstream (on the load CPU) and `tokengate serve --workers 1`
with every default feature on, as `make bench` runs it (on the subject CPU), drives it
with wrk, and:

- **py-spy** (default): samples the gateway while wrk runs (`py-spy record --format raw
  --nonblocking`), then prints the frames that were on CPU: self time (the leaf of each
  sample) and inclusive time (anywhere in the stack), both as a share of the samples,
  and the self time summed by package. The raw stacks are kept next to the summary, so
  `py-spy`'s flame graph can be drawn from them later.
- **callgrind** (`--callgrind`): the gateway runs under `valgrind --tool=callgrind` with
  collection off; after a warm-up the counters are switched on for one wrk cell and
  dumped, and the instructions executed are divided by the requests answered. On a
  shared machine this is the stable before/after figure: the count does not depend on
  what else runs, where seconds do.

Needs nginx and wrk (`make bench-deps`) and py-spy or valgrind.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tests.bench import common, subjects, throughput, wrk
from tests.bench.common import Plan
from tests.bench.procs import ROOT, Group, scratch, sigterm_as_interrupt

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]*)(?::\d+)?\)$")


def _short(frame: str) -> str:
    """`ClientRequest.send (aiohttp/client_reqrep.py)`: py-spy's frame without its line."""
    m = _FRAME.match(frame)
    return frame if m is None else f"{m['fn']} ({m['file']})"


def package(frame: str) -> str:
    """What a leaf frame belongs to: `app.<package>`, a site package, or the stdlib module
    (py-spy names files relative to their `sys.path` entry)."""
    m = _FRAME.match(frame)
    path = m["file"] if m else frame
    head, _, rest = path.partition("/")
    if head == "app":
        return "app." + rest.split("/", 1)[0].removesuffix(".py")
    if not rest:
        return head.removesuffix(".py")
    return head


def summarize(raw: str, top: int) -> str:
    """py-spy's collapsed stacks -> self / inclusive shares of the samples, and by package."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        own[_short(frames[-1])] += n
        packages[package(frames[-1])] += n
        for frame in {_short(f) for f in frames}:
            inclusive[frame] += n
    if not total:
        return "no samples"

    def table(title: str, counts: Counter[str]) -> list[str]:
        rows = [f"| {name} | {n / total:.1%} |" for name, n in counts.most_common(top)]
        return [f"| {title} | share |", "|---|---|", *rows, ""]

    return "\n".join(
        [
            f"{total} samples",
            "",
            *table("self (leaf frame)", own),
            *table("inclusive (anywhere in the stack)", inclusive),
            *table("self, by package", packages),
        ]
    )


def _pyspy(args: argparse.Namespace, group: Group, tmp: Path, plan: Plan, out: Path) -> None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    up = throughput.start_upstream(group, tmp, plan)
    url = up.sse_url if args.mode == "sse" else up.json_url
    subject = subjects.tokengate(group, "tg1", tmp / "tg1", url, workers=1, cpus=plan.subject_cpus)
    body = common.chat_body(args.mode == "sse")
    common.cell(subject, body, args.c, plan, tmp, seconds=2)  # warm-up
    raw = out / f"pyspy-{args.mode}-c{args.c}.txt"
    cmd = [exe, "record", "--pid", str(subject.pid), "--rate", str(args.rate)]
    cmd += ["--duration", str(int(args.seconds)), "--format", "raw", "--nonblocking"]
    cmd += ["--output", str(raw)]
    if args.native:
        cmd.append("--native")
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)
    cell = common.cell(subject, body, args.c, plan, tmp, seconds=args.seconds - 1)
    _, err = spy.communicate(timeout=args.seconds + 60)
    if not raw.exists():
        raise RuntimeError(f"py-spy wrote nothing: {err.decode(errors='replace')[-500:]}")
    summary = summarize(raw.read_text(), args.top)
    head = (
        f"{args.mode} c={args.c}: {cell['rps']} req/s, {cell['subject_cpu_us_per_req']} µs CPU "
        f"per request (under py-spy at {args.rate} Hz), other load {cell['other_cpu_util']}"
    )
    (out / f"pyspy-{args.mode}-c{args.c}.md").write_text(head + "\n\n" + summary + "\n")
    print(head, summary, sep="\n\n")


def _callgrind(args: argparse.Namespace, group: Group, tmp: Path, plan: Plan, out: Path) -> None:
    """Instructions per request, counted by callgrind over one wrk cell after a warm-up."""
    up = throughput.start_upstream(group, tmp, plan)
    stream = args.mode == "sse"
    url = up.sse_url if stream else up.json_url
    name = f"{args.subject}-{args.mode}"
    dump = out / f"callgrind-{name}.out"
    vg = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={dump}"]
    if args.subject == "tokengate":
        subject = subjects.tokengate(group, "tg1", tmp / "tg1", url, workers=1, wrap=vg)
    else:
        subject = subjects.floor(
            group, args.subject, args.subject, url, stream=stream, cpus=None, wrap=vg
        )
    assert subject.proc is not None
    pid = subject.proc.pid  # setpriv and taskset exec: valgrind runs in this process
    body = common.chat_body(stream)
    slow = Plan(seconds=args.seconds, load_cpus=plan.load_cpus, subject_cpus=None)
    common.cell(subject, body, args.c, slow, tmp, seconds=5)  # warm-up (imports, caches)
    idle = _counted(pid, out, name, lambda: time.sleep(args.seconds))
    results: list[wrk.WrkResult] = []

    def load() -> None:
        results.append(
            wrk.run(
                subject.chat_url,
                body,
                subject.headers,
                connections=args.c,
                seconds=args.seconds,
                workdir=tmp,
                cpus=plan.load_cpus,
                timeout_s=30,
            )
        )

    busy = _counted(pid, out, name, load)
    requests = results[0].requests
    per = (busy - idle) / requests if requests else float("nan")
    line = (
        f"{name} c={args.c}: {requests} requests in {args.seconds:g} s, {busy:,} "
        f"instructions, {idle:,} in as long idle (background loops): {per:,.0f} per request"
    )
    (out / f"callgrind-{name}.md").write_text(line + "\n")
    print(line)


def _counted(pid: int, out: Path, name: str, during: Callable[[], None]) -> int:
    """Instructions the process executed while `during` ran (callgrind's counters are
    switched on for it, then dumped)."""
    subprocess.run(["callgrind_control", "--zero", str(pid)], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "--instr=on", str(pid)], check=True, capture_output=True)
    during()
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "--instr=off", str(pid)], check=True, capture_output=True)
    dumps = sorted(out.glob(f"callgrind-{name}.out.*"), key=lambda p: p.stat().st_mtime)
    return _instructions(dumps[-1])


def _instructions(dump: Path) -> int:
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.profile", description=__doc__)
    p.add_argument("--mode", choices=("json", "sse"), default="json")
    p.add_argument("-c", type=int, default=None, help="wrk connections (64; 8 under callgrind)")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--native", action="store_true", help="py-spy: C frames too")
    p.add_argument("--callgrind", action="store_true", help="instructions per request instead")
    p.add_argument(
        "--subject",
        choices=("tokengate", "canned", "relay"),
        default="tokengate",
        help="callgrind: tokengate, or one of floor_app's bare apps (uvicorn alone; uvicorn "
        "and aiohttp)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "tests" / "bench" / "results" / "profile")
    args = p.parse_args(argv)
    args.c = args.c or (8 if args.callgrind else 64)
    sigterm_as_interrupt()
    args.out.mkdir(parents=True, exist_ok=True)
    with scratch("tokengate-profile-") as tmp, Group(tmp) as group:
        run = _callgrind if args.callgrind else _pyspy
        run(args, group, tmp, Plan(), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
