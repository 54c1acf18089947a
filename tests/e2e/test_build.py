"""The build that runs says so, and the compiled one is really compiled.

`make test` starts every gateway from the repo's source (interpreted); `make
test-compiled` starts them from the compiled build (`TOKENGATE_TEST_BUILD`, the
modules `app/build.py` lists as mypyc C extensions, as the image ships them). A build
that silently fell back to Python (a `.so` missing, a path that finds the source
first) would pass every other test and ship 18 % slower: this one fails instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app import build
from tests.support.procs import BUILD, ROOT, Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]


def test_the_banner_and_the_metric_name_the_build_that_serves(sim: Sim, make_gateway: Make) -> None:
    gw = make_gateway(GatewaySpec(), sim.url)
    listed = len(build.compiled_paths(ROOT))
    terminal = (gw.workdir / "stdout.log").read_text()
    metrics = gw.metrics()
    if BUILD:
        assert f"build     compiled with mypyc ({listed} of {listed} modules" in terminal
        version = _version(metrics)
        assert f'tokengate_build_info{{build="compiled",version="{version}"}} 1.0' in metrics
    else:
        assert "build     interpreted (pure Python" in terminal
        assert 'build="interpreted"' in metrics

    # The build that answers is the one named: a chat completion through the whole path.
    answer = gw.openai().chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert answer.choices[0].message.content and answer.usage is not None


def _version(metrics: str) -> str:
    line = next(ln for ln in metrics.splitlines() if ln.startswith("tokengate_build_info{"))
    return line.split('version="', 1)[1].split('"', 1)[0]


def test_the_build_under_test_is_installed_apart_from_the_source() -> None:
    """`make test-compiled` installs the build with `pip install --target`: its `app`
    is a copy, so an edit of the source is never shadowed by a stale extension, and the
    repo's own tree holds no compiled module."""
    suffixes = (".so", ".pyd")
    assert not [p for p in (ROOT / "app").rglob("*") if p.suffix in suffixes]
    if BUILD:
        target = Path(BUILD) / "app"
        assert target.resolve() != (ROOT / "app").resolve()
        assert any(p.name.endswith(suffixes) for p in (target / "pipeline").iterdir())
