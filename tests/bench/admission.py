"""Microbenchmark: what one per-key admission costs, in-process vs Redis vs none.

An admission is what every request pays at the door and at the end: `reserve`
(1 request + estimated tokens from both buckets) and `settle` (correct the tokens,
add the ledger entry), through `app.limits.Admission` exactly as the pipeline calls
it. Three stores behind the same `Admission`:
- `none`: a store that admits without looking (the cost of the machinery alone),
- `memory`: `MemoryStore`, the default without Redis,
- `redis`: `SharedStore` on a real `redis-server` on a loopback port (a reservation
  waits for its round trip, shared with whatever else met it; a settle rides along).
Reported as µs per admission, sequential and 32 / 64 at a time, and as ratios to
`none` measured in the same run. Best of `repeats`, because a shared machine only
ever makes a run slower. The Redis store's "unreachable" warnings are counted, not
printed: the count says whether a figure is really Redis.

Run alone: `.venv/bin/python -m tests.bench.admission`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from app.billing.ledger import Ledger, UsageEntry
from app.config.schema import DatabaseConfig, LedgerConfig, RedisConfig
from app.db.engine import Database
from app.db.usage import UsageBook
from app.limits.admission import Admission
from app.limits.bucket import Decision, Limits
from app.limits.limit_store import LimitStore, MemoryStore
from app.limits.shared_store import SharedStore
from app.metrics import Metrics
from app.runtime import KeySpec
from tests.bench import subjects
from tests.bench.procs import Group, sigterm_as_interrupt

KEY = KeySpec(
    alias="bench", digests=("0" * 64,), tokens_per_minute=10**12, requests_per_minute=10**10
)
ENTRY = UsageEntry("bench", "claude-sonnet", prompt_tokens=4, completion_tokens=16)
COST = 4 + 16
WIDTHS = (32, 64)


def _unopened_ledger() -> Ledger:
    # Admission only hands entries to the ledger: it never reaches this (unopened) file.
    unused = Database(DatabaseConfig(path=str(Path(tempfile.gettempdir()) / "unused.sqlite3")))
    return Ledger(UsageBook(unused), LedgerConfig())


class NullStore(MemoryStore):
    """Admits everything, records nothing: the no-limit baseline."""

    _yes = Decision(True, None, 0.0, 10**10, 10**10, 0.0, 10**12, 10**12, 0.0)

    async def reserve(self, key: str, limits: Limits, cost: int) -> Decision:
        return self._yes

    def settle(self, key: str, limits: Limits, token_delta: int, request_delta: int) -> None:
        return None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def describe(self) -> dict[str, object]:
        return {"kind": "none"}


class _Spawner:
    """Stands in for the gateway's task owner: the Redis store's round trips run as
    background tasks."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def __call__(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks))


async def _one(admission: Admission) -> None:
    ticket = await admission.admit(KEY, COST)
    admission.settle(ticket, ENTRY, dispatched=True)


async def _sequential(admission: Admission, n: int, spawn: _Spawner) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await _one(admission)
    await spawn.drain()
    return (time.perf_counter() - start) * 1e6 / n


async def _concurrent(admission: Admission, n: int, width: int, spawn: _Spawner) -> float:
    async def lane(count: int) -> None:
        for _ in range(count):
            await _one(admission)

    start = time.perf_counter()
    await asyncio.gather(*(lane(n // width) for _ in range(width)))
    await spawn.drain()
    return (time.perf_counter() - start) * 1e6 / (n // width * width)


class _DownEvents(logging.Handler):
    """Counts the Redis store's "unreachable" warnings instead of printing them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.first: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if "unreachable" in record.getMessage():
            self.count += 1
            self.first = self.first or record.getMessage()


@contextlib.contextmanager
def _counting_down_events() -> Iterator[_DownEvents]:
    log = logging.getLogger("tokengate.redis")
    handler, propagate = _DownEvents(), log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.propagate = propagate


async def _measure(
    store: LimitStore, n: int, repeats: int, spawn: _Spawner | None = None
) -> dict[str, object]:
    spawn = spawn or _Spawner()
    await store.start()
    row: dict[str, object] = {"n": n}
    try:
        admission = Admission(store, Metrics(CollectorRegistry()), _unopened_ledger())
        await _sequential(admission, max(100, n // 10), spawn)  # warm caches, scripts, pool
        with _counting_down_events() as down:
            row["sequential_us"] = round(
                min([await _sequential(admission, n, spawn) for _ in range(repeats)]), 2
            )
        row["sequential_fallbacks"] = down.count
        for width in WIDTHS:
            with _counting_down_events() as down:
                best = min([await _concurrent(admission, n, width, spawn) for _ in range(repeats)])
            row[f"concurrent{width}_us"] = round(best, 2)
            row[f"concurrent{width}_fallbacks"] = down.count
            if down.first:
                row["fallback_message"] = down.first
    finally:
        await store.close()
    return row


async def _all(redis_url: str | None, repeats: int) -> dict[str, dict[str, object]]:
    out = {
        "none": await _measure(NullStore(), 20_000, repeats),
        "memory": await _measure(MemoryStore(), 20_000, repeats),
    }
    if redis_url:
        spawn = _Spawner()
        cfg = RedisConfig(url=redis_url, key_prefix="bench:")
        store = SharedStore.from_config(cfg, spawn=spawn, on_state=None)
        out["redis"] = await _measure(store, 2_000, repeats, spawn)
    base = out["none"]
    for row in out.values():
        for field in ("sequential", *(f"concurrent{w}" for w in WIDTHS)):
            row[f"{field}_x_none"] = round(_f(row, f"{field}_us") / _f(base, f"{field}_us"), 2)
    return out


def _f(row: dict[str, object], name: str) -> float:
    value = row[name]
    assert isinstance(value, int | float)
    return float(value)


def run(group: Group, repeats: int = 3) -> dict[str, object]:
    """Start redis-server, measure the three stores under uvloop (as the gateway runs)."""
    import uvloop

    redis_url = subjects.redis_server(group)
    rows = uvloop.run(_all(redis_url, repeats))
    for name, row in rows.items():
        print(
            f"    admission {name:6} {_f(row, 'sequential_us'):8.2f} µs sequential "
            f"({row['sequential_x_none']}x none); at 32: {_f(row, 'concurrent32_us'):.2f} µs, "
            f"at 64: {_f(row, 'concurrent64_us'):.2f} µs "
            f"(fallbacks to local buckets: {row.get('concurrent64_fallbacks', 0)})",
            flush=True,
        )
    notes = [] if redis_url else ["redis-server not found: no Redis row"]
    return {"stores": rows, "repeats": repeats, "notes": notes}


def main() -> int:
    sigterm_as_interrupt()
    with (
        tempfile.TemporaryDirectory(prefix="tokengate-bench-adm-") as tmp,
        Group(Path(tmp)) as group,
    ):
        result = run(group)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
