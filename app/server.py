"""Running the ASGI app under uvicorn (uvloop + httptools), one or N workers.

SIGTERM drains: the gateway's readiness turns 503 first (`server.drain_delay_sec`
lets load balancers notice), then uvicorn stops accepting and waits for in-flight
requests, queued ones included, up to `server.drain_timeout_sec`; the lifespan then
closes the gateway and the process exits 0.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import uvicorn

from app.bootstrap import setup_process
from app.runtime import Runtime
from app.signals import exit_cleanly

log = logging.getLogger("tokengate.server")


def _config(app: Any, runtime: Runtime, host: str, port: int, workers: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        workers=workers,
        factory=isinstance(app, str),
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=int(runtime.settings.server.drain_timeout_sec) or None,
        timeout_keep_alive=30,
        # Nothing reads the client's address, so X-Forwarded-* rewriting is a middleware
        # layer per request for nothing; and the server need not announce itself.
        proxy_headers=False,
        server_header=False,
        # The Responses WebSocket mode: a `response.create` message is a request body, and
        # frames go uncompressed (as SSE does): deflating each event cost more CPU than
        # the rest of the bridge (tests/bench/responses.py).
        ws_max_size=runtime.settings.server.max_body_bytes,
        ws_per_message_deflate=False,
    )


def run_server(runtime: Runtime, host: str, port: int, *, workers: int = 1) -> int:
    setup_process(runtime)
    if workers == 1:
        from app.main import create_app

        app = create_app(runtime, handle_signals=True)
        server = uvicorn.Server(_config(app, runtime, host, port, 1))
        # uvicorn re-raises the SIGTERM it captured once shutdown is done; a completed
        # drain is a clean exit, so that re-raised signal ends the process with 0.
        signal.signal(signal.SIGTERM, exit_cleanly)
        try:
            server.run()
        except SystemExit as done:
            return int(done.code or 0)
        return 0 if server.started else 1
    config = _config("app.main:factory", runtime, host, port, workers)
    log.info("starting %d workers on %s:%d", workers, host, port)
    sock = config.bind_socket()
    _supervisor(runtime)(config, sockets=[sock]).run()
    return 0


def _supervisor(runtime: Runtime) -> Any:
    from uvicorn.supervisors import Multiprocess

    from app.bootstrap import reload_runtime
    from app.config.errors import ConfigError
    from app.metrics import mark_process_dead

    class Supervisor(Multiprocess):
        """uvicorn's supervisor, but SIGHUP validates the files before replacing workers
        (one at a time, each replacement serving before its predecessor retires), so a
        broken edit never takes the fleet down."""

        def handle_hup(self) -> None:
            try:
                reload_runtime(runtime)
            except ConfigError as exc:
                log.error(
                    "reload refused, workers keep the running configuration:\n%s", exc.render()
                )
                return
            before = {p.pid for p in self.processes}
            super().handle_hup()
            for pid in before - {p.pid for p in self.processes}:
                if pid is not None:
                    mark_process_dead(pid)  # drop its live gauges from the aggregate

    return Supervisor
