"""What a serving process does about signals and the garbage collector.

Kept apart from `app.commands.serve` (which runs uvicorn and imports `app.main`) so that
`app.main`'s lifespan can install them without importing the server back.
SIGTERM drains: readiness turns 503 first (`server.drain_delay_sec` lets load
balancers notice), then uvicorn's own stop runs. SIGHUP reloads the configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType


def tune_gc() -> None:
    """After start-up, freeze what is alive (imports, config, pools) out of the collector's
    reach and collect the young generation less often: per-request garbage is short-lived,
    and full collections over the frozen heap were a measurable share of request CPU."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


def exit_cleanly(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM that uvicorn re-raises once its drain is done: a clean exit (0)."""
    raise SystemExit(0)


@contextlib.contextmanager
def lifecycle_signals(
    begin_drain: Callable[[], None],
    reload: Callable[[], None],
    delay: float,
    busy: Callable[[], bool] = lambda: False,
    patience: float = 0.0,
) -> Iterator[None]:
    """SIGTERM: mark draining, then (after `delay`, and once `busy()` is false or
    `patience` more seconds passed) hand over to uvicorn's own stop. `busy` is what
    uvicorn's stop would cut: it closes WebSockets at once (1012), so a Responses turn in
    flight on one is let finish first. SIGHUP: reload the configuration files in place."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    loop = asyncio.get_running_loop()

    def forward() -> None:
        if callable(previous):
            frame: FrameType | None = None
            previous(signal.SIGTERM, frame)

    def on_term() -> None:
        begin_drain()
        give_up = loop.time() + delay + patience

        def when_idle() -> None:
            if busy() and loop.time() < give_up:
                loop.call_later(0.05, when_idle)
            else:
                forward()

        if delay > 0:
            loop.call_later(delay, when_idle)
        else:
            when_idle()

    loop.add_signal_handler(signal.SIGTERM, on_term)
    loop.add_signal_handler(signal.SIGHUP, reload)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
