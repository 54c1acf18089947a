"""Which modules the compiled build turns into C, and whether this process runs them.

The request's path is Python that mypy --strict already types fully, so mypyc (mypy's
compiler) can turn it into C extensions: issue #32 measured the gateway's own code at
0.43x its interpreted cost, and a request through the whole gateway at 24 % fewer
instructions, once the records built per request wrote their `__init__` out (a generated
one stays Python: docs/development.md). `setup.py` compiles the modules listed here when
`TOKENGATE_COMPILE=1` (the container image does); a plain `pip install` stays pure
Python, and both run the same source.

The list is the request's path, not the whole package: what runs per request is where
compiling pays, and everything compiled must pass the end-to-end suite as compiled
(`make test-compiled`). Left interpreted, and why:

- modules mypyc cannot compile (async generators) or whose libraries' declared types
  are not what they return at run time (`INTERPRETED`, with each reason);
- `app/errors.py`: compiled, an `Exception` subclass loses its class-level defaults
  (`status = 503` read `AttributeError` on every instance: mypy 2.4.1, found by
  `make test-compiled`), and errors are not the path a served request takes;
- `__init__.py` files, and what runs at start or per scrape (config, commands, the
  database, the simulator, the status page).

This module reads no setting and imports nothing of `app`: `setup.py` loads it by path
before anything is installed.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# Packages whose modules are compiled, and single modules outside them (repo paths).
PACKAGES = (
    "app/pipeline",
    "app/limits",
    "app/upstream",
    "app/dispatch",
    "app/billing",
    "app/status",
    "app/metrics",
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
)
# In those packages, left interpreted, with the reason: mypyc cannot compile the module,
# or compiled it would check a type that its library declares but does not return.
INTERPRETED: dict[str, str] = {
    "app/pipeline/answer.py": "async generators (mypyc: unimplemented): the WebSocket frames",
    "app/upstream/httpx_transport.py": "async generators (mypyc: unimplemented)",
    "app/upstream/responses_chat_stream.py": "async generators (mypyc: unimplemented)",
    "app/upstream/websocket.py": "async generators (mypyc: unimplemented)",
    # SQLAlchemy types a row of `select(a, b)` as `tuple[A, B]`; at run time it is a
    # `Row`, which compiled code refuses (`tuple object expected`). The database, not
    # the request's path.
    "app/billing/books.py": "SQLAlchemy rows are typed as tuples",
}


def compiled_paths(root: Path) -> list[str]:
    """The source files the compiled build compiles, relative to `root` (the repo)."""
    found = [
        p.relative_to(root).as_posix()
        for pkg in PACKAGES
        for p in sorted((root / pkg).glob("*.py"))
        if p.name != "__init__.py"
    ]
    found += [f for f in FILES if (root / f).is_file()]
    return [f for f in found if f not in INTERPRETED]


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def installed_version() -> str:
    try:
        return version("tokengate")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(source)"


@functools.cache
def compiled_modules() -> tuple[int, int]:
    """(compiled, listed): how many of the listed modules this installation would load
    as C extensions. Read from where the import system finds each module, without
    importing it, so the start-up banner and `tokengate_build_info` can say which build
    is running (an interpreted install beside a stale `.so` would show here too)."""
    root = Path(__file__).resolve().parent.parent
    listed = [_module(p) for p in compiled_paths(root)]
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    compiled = 0
    for name in listed:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None and spec.origin.endswith(suffixes):
            compiled += 1
    return compiled, len(listed)


def build_name() -> str:
    """`compiled` when every listed module loads as a C extension, `interpreted` when
    none does, `partly compiled` otherwise (a build to fix: some `.so` files missing)."""
    compiled, listed = compiled_modules()
    if compiled == 0:
        return "interpreted"
    return "compiled" if compiled == listed else "partly compiled"
