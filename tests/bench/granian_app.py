"""tokengate's ASGI app as a factory, for servers other than uvicorn (tests/bench/engines.py).

Built as `tokengate serve --workers 1` builds it (the runtime from TOKENGATE_CONFIG and
TOKENGATE_SETTINGS, the process set up, every default feature on); only the server
differs. A measuring aid, not a supported way to run the gateway.
"""

from __future__ import annotations

from starlette.types import ASGIApp


def app() -> ASGIApp:
    from app.bootstrap import load_runtime, setup_process
    from app.main import create_app

    runtime = load_runtime()
    setup_process(runtime)
    return create_app(runtime)
