"""Running the ASGI app under uvicorn (uvloop + httptools), one or N workers.

SIGTERM drains: the gateway's readiness turns 503 first (`server.drain_delay_sec`
lets load balancers notice), then uvicorn stops accepting and waits for in-flight
requests, queued ones included, up to `server.drain_timeout_sec`; the lifespan then
closes the gateway and the process exits 0.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
from typing import TYPE_CHECKING, Any

import uvicorn

from app.bootstrap import setup_process
from app.commands import banner
from app.listen import AddressInUse, bind
from app.runtime import Runtime
from app.signals import exit_cleanly

if TYPE_CHECKING:
    from app.gateway import Gateway

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
        timeout_worker_healthcheck=math.ceil(runtime.settings.server.worker_start_timeout_sec),
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
    try:
        sock = bind(host, port)
    except AddressInUse as exc:
        log.error("cannot listen: %s", exc.strerror)
        _say(f"tokengate: cannot listen: {exc.strerror}")
        return 1
    shown = f"[{host}]" if ":" in host else host
    _say(banner.render(runtime, f"http://{shown}:{sock.getsockname()[1]}", workers=workers))
    if workers == 1:
        from app.main import create_app

        app = create_app(runtime, handle_signals=True, on_started=_ready)
        server = uvicorn.Server(_config(app, runtime, host, port, 1))
        # uvicorn re-raises the SIGTERM it captured once shutdown is done; a completed
        # drain is a clean exit, so that re-raised signal ends the process with 0.
        signal.signal(signal.SIGTERM, exit_cleanly)
        code = 0
        try:
            server.run(sockets=[sock])
        except SystemExit as done:
            code = int(done.code or 0)
        if not server.started:
            _say(f"tokengate: start-up failed; the reason is in the log ({_log_place(runtime)})")
            return code or 1
        return code
    config = _config("app.main:factory", runtime, host, port, workers)
    log.info("starting %d workers on %s:%d", workers, host, port)
    _supervisor(runtime)(config, sockets=[sock]).run()
    return 0


def _say(text: str) -> None:
    """The terminal, whatever `logging.output` says (the log may be a file)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _log_place(runtime: Runtime) -> str:
    return runtime.settings.logging.output


def _ready(gateway: Gateway) -> None:
    """Once started (one process): what the first health probe found, per domain."""
    states = []
    for d in gateway.domains:
        probe = d.last_probe
        detail = f": {probe.detail}" if probe is not None and not probe.ok and probe.detail else ""
        states.append(f"{d.name} {d.state()}{detail}")
    _say(f"tokengate: serving; {'; '.join(states)}")


def _supervisor(runtime: Runtime) -> Any:
    from uvicorn.supervisors import Multiprocess

    from app.bootstrap import reload_runtime
    from app.config.problems import ConfigError
    from app.metrics import mark_process_dead
    from app.reload import describe_reload, log_reload

    running = [runtime]  # what the workers run now: the baseline of the next reload

    class Supervisor(Multiprocess):
        """uvicorn's supervisor, but SIGHUP validates the files before replacing workers
        (one at a time, each replacement serving before its predecessor retires), so a
        broken edit never takes the fleet down."""

        def handle_hup(self) -> None:
            try:
                new = reload_runtime(runtime)
            except ConfigError as exc:
                log.error(
                    "reload refused, workers keep the running configuration:\n%s", exc.render()
                )
                return
            log_reload(describe_reload(running[0], new, replaced=True))
            running[0] = new
            before = {p.pid for p in self.processes}
            super().handle_hup()
            for pid in before - {p.pid for p in self.processes}:
                if pid is not None:
                    mark_process_dead(pid)  # drop its live gauges from the aggregate

    return Supervisor
