"""setuptools' hook for the compiled build; pyproject.toml declares everything else.

    python -m pip wheel .                                            # pure Python
    TOKENGATE_COMPILE=1 python -m pip wheel --no-build-isolation .   # the request's path in C

With `TOKENGATE_COMPILE=1` the modules `app/build.py` lists are compiled with mypyc, which
must be importable (`pip install mypy==<the version in the Dockerfile>`, hence
`--no-build-isolation`), with a C compiler and Python's headers. They make one C
extension of one C file per module, compiled on every core at once. The `.py` files
ship beside the extensions: the import system loads the extension, tracebacks and
`inspect` still find the source.
"""

from __future__ import annotations

import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _build_module():  # type: ignore[no-untyped-def]
    # By path: importing `app` would import its dependencies, absent while building.
    spec = importlib.util.spec_from_file_location("_tokengate_build", ROOT / "app" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _ParallelBuildExt(build_ext):
    """Compiles an extension's C files on every core at once: the compiled build is one
    extension (see `_compiled`) of about a hundred C files, and setuptools compiles an
    extension's sources one after another."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:  # the per-module shims are small extensions of their own
            self.parallel = os.cpu_count() or 1

    def build_extension(self, ext: Extension) -> None:
        compiler = self.compiler
        serial = compiler.compile
        workers = os.cpu_count() or 1

        def compile_all(sources: list[str], *args: object, **kwargs: object) -> list[str]:
            if len(sources) < 2 or workers < 2:
                return serial(sources, *args, **kwargs)  # type: ignore[arg-type]
            with ThreadPoolExecutor(workers) as pool:  # gcc runs as a process: no GIL
                done = pool.map(lambda src: serial([src], *args, **kwargs), sources)  # type: ignore[arg-type]
                return [obj for objs in done for obj in objs]

        compiler.compile = compile_all  # type: ignore[method-assign]
        try:
            super().build_extension(ext)
        finally:
            compiler.compile = serial  # type: ignore[method-assign]


def _compiled() -> dict[str, object]:
    try:
        from mypyc.build import mypycify
    except ImportError as e:
        raise SystemExit(
            "TOKENGATE_COMPILE=1 needs mypyc in the build environment: "
            "pip install mypy, then build with --no-build-isolation"
        ) from e
    paths = _build_module().compiled_paths(ROOT)
    # One group: every call between compiled modules is a native call. (Two groups
    # compiled side by side crashed: a property of an Exception subclass read from the
    # other group was called through a vtable it does not have, mypy 2.4.1.) One C file
    # per module (`multi_file`), compiled on every core by `_ParallelBuildExt`.
    # mypyc writes C under build/ relative to the working directory: build from the root.
    os.chdir(ROOT)
    return {
        "ext_modules": mypycify(
            paths, multi_file=True, group_name="tokengate", opt_level="3", debug_level="0"
        ),
        "cmdclass": {"build_ext": _ParallelBuildExt},
    }


if __name__ == "__main__":
    compile_ = os.environ.get("TOKENGATE_COMPILE", "").strip().lower() in ("1", "true", "yes")
    setup(**(_compiled() if compile_ else {}))
