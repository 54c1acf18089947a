"""Waiting for something a test started to happen: one deadline for every such wait.

A deadline here only stops a test that would otherwise hang; it never asserts how fast
the machine is. So it is long (a loaded machine, `make test-loaded`, takes many times
longer than an idle one to start a process or drain a queue), and a test that passes
returns as soon as its condition holds, whatever the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable

PATIENCE = 90.0  # seconds: far past any wait that a slow machine makes honestly


def wait_until(
    check: Callable[[], bool], what: str, *, timeout: float = PATIENCE, quiet: bool = False
) -> None:
    """Poll `check` until it is true; past the deadline fail naming `what`. `quiet`: a
    check that raises (a server not up yet) counts as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        if quiet:
            with contextlib.suppress(Exception):
                if check():
                    return
        elif check():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], what: str, *, timeout: float = PATIENCE
) -> None:
    """`wait_until` for a test whose own requests run on the event loop meanwhile; the
    check may be a coroutine function (an in-process gateway asked over ASGI)."""
    deadline = time.monotonic() + timeout
    while True:
        done = check()
        if done if isinstance(done, bool) else await done:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.02)


def sqlite_threads() -> set[threading.Thread]:
    """The worker threads of open aiosqlite connections (one per connection)."""
    return {t for t in threading.enumerate() if t.name.endswith("(_connection_worker_thread)")}


async def sqlite_threads_ended(before: set[threading.Thread]) -> None:
    """Wait, on the test's own loop, for the aiosqlite threads started since `before` to
    end. A connection that failed to open stops its thread without awaiting it: if the
    test's loop closed first, the thread's last answer hit a closed loop and pytest
    charged that to whichever test ran next."""
    await eventually(
        lambda: not any(t.is_alive() for t in sqlite_threads() - before),
        "the failed SQLite connections' threads to end",
    )
