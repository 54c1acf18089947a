"""tokengate's ASGI app with pyreqwest as the upstream client (tests/bench/engines.py).

Built as `tokengate serve --workers 1` builds it, with `app.assembly.make_transport`
replaced by the bench's `ReqwestTransport`; served by uvicorn as `serve` does. A
measuring aid, not a supported way to run the gateway.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp


def app() -> ASGIApp:
    import app.assembly as assembly
    from app.bootstrap import load_runtime, setup_process
    from app.main import create_app
    from tests.bench.reqwest_transport import ReqwestTransport

    def make_transport(timeouts: Any, total: float, pool: int, **_: Any) -> ReqwestTransport:
        return ReqwestTransport(timeouts, total, pool)

    assembly.make_transport = make_transport  # type: ignore[attr-defined,assignment]
    runtime = load_runtime()
    setup_process(runtime)
    return create_app(runtime)
