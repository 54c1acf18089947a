"""What compiling the hot path with mypyc would buy: a measurement, not a build.

    python -m tests.bench.compiled                # ownpath, then the cost guard with --floor
    python -m tests.bench.compiled --only ownpath
    python -m tests.bench.compiled --keep         # keep the compiled copy (path printed)

The committed tree (`git archive HEAD`) is unpacked into a temporary directory, the
modules of `HOT` are compiled there with mypyc (mypy's compiler, already a dev
dependency; gcc and Python's headers are needed), and the in-process own-path benchmark
(`tests.bench.ownpath`) and the cost guard (`tests.bench.guard --floor`) run on that copy
with the same interpreter: their figures compare directly with the same commands run on
the repo itself. Compiling 81 modules takes about 5 minutes of one core.

Left interpreted, and why (mypyc's limits, not choices):

- async generators are not implemented by mypyc: `app/pipeline/answer.py`,
  `app/upstream/client.py`, `app/upstream/responses_chat_stream.py`,
  `app/upstream/websocket.py`;
- `app/metrics/`: `Metrics` inherits from several families classes, and a compiled class
  supports one base (an interpreted class cannot inherit a compiled one either);
- `__init__.py` files, and everything outside the request's path (config, commands, db,
  state, the sim, the UI).

Nothing here changes how tokengate is built or shipped (see deploy/BENCHMARKS.md, issue
#32's fourth pass, for the figures and what adopting it would take).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.procs import ROOT, scratch

PACKAGES = (
    "app/pipeline",
    "app/limits",
    "app/upstream",
    "app/dispatch",
    "app/billing",
    "app/status",
)
FILES = (
    "app/api/edge.py",
    "app/api/middleware.py",
    "app/api/disconnect.py",
    "app/api/browser.py",
    "app/api/relay.py",
    "app/api/body.py",
    "app/api/access_note.py",
    "app/auth.py",
    "app/tally.py",
    "app/kinds.py",
    "app/errors.py",
)
INTERPRETED = frozenset(
    {
        "app/pipeline/answer.py",  # async generators
        "app/upstream/client.py",
        "app/upstream/responses_chat_stream.py",
        "app/upstream/websocket.py",
    }
)


def hot(root: Path) -> list[str]:
    """The modules compiled, relative to `root`."""
    found = [
        str(p.relative_to(root)) for pkg in PACKAGES for p in sorted((root / pkg).glob("*.py"))
    ]
    found += [f for f in FILES if (root / f).exists()]
    return [f for f in found if not f.endswith("__init__.py") and f not in INTERPRETED]


def unpack(into: Path) -> None:
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def compile_hot(copy: Path) -> float:
    modules = hot(copy)
    started = time.monotonic()
    mypyc = [sys.executable, "-m", "mypyc", *modules]
    done = subprocess.run(mypyc, cwd=copy, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mypyc failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    took = time.monotonic() - started
    print(f"compiled {len(modules)} modules with mypyc in {took:.0f} s")
    return took


def run_on(copy: Path, module: str, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    print(f"\n$ python -m {module} {' '.join(args)}   (on the compiled copy)", flush=True)
    subprocess.run([sys.executable, "-m", module, *args], cwd=copy, env=env, check=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.compiled", description=__doc__)
    p.add_argument("--only", choices=("ownpath", "guard"), help="run one of the two")
    p.add_argument("--keep", action="store_true", help="keep the compiled copy")
    args = p.parse_args(argv)
    with scratch("tokengate-mypyc-", args.keep) as copy:
        unpack(copy)
        compile_hot(copy)
        if args.only in (None, "ownpath"):
            run_on(copy, "tests.bench.ownpath", "--requests", "5000")
        if args.only in (None, "guard"):
            run_on(copy, "tests.bench.guard", "--floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
