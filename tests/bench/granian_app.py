"""tokengate's ASGI app as a factory, for servers other than uvicorn (tests/bench/engines.py).

Built as `tokengate serve --workers 1` builds it (the runtime from TOKENGATE_CONFIG and
TOKENGATE_SETTINGS, the process set up, every default feature on); only the server
differs. `BENCH_BUILD` names a build directory (`make compiled`) to import the app from
instead of the source (not a `TOKENGATE_` name: the gateway warns about those it does not
read). A measuring aid, not a supported way to run the gateway.
"""

from __future__ import annotations

import os
import sys

from starlette.types import ASGIApp


def app() -> ASGIApp:
    build = os.environ.get("BENCH_BUILD")
    if build:  # `engines.py --build`: the compiled build's `app` before the source's
        sys.path.insert(0, build)
    from app.bootstrap import load_runtime, setup_process
    from app.main import create_app

    runtime = load_runtime()
    setup_process(runtime)
    return create_app(runtime)
