"""The ledger's cost: `add` on the request path, and a flush off it.

    .venv/bin/python -m tests.bench.ledger [--rows 20000] [--postgres]

`add` is compared with a bare dict update in the same run (the floor for any in-memory
aggregation); a flush writes `--rows` distinct bucket rows in one transaction to SQLite
(and, with --postgres, to a throwaway PostgreSQL from Debian's package).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import timeit
from pathlib import Path

from app.billing.ledger import Ledger, UsageEntry
from app.config.schema import DatabaseConfig, LedgerConfig
from app.db import migrate
from app.db.engine import Database
from app.db.usage import UsageBook


def _add_cost() -> tuple[float, float]:
    ledger = Ledger(UsageBook(Database(DatabaseConfig(path="/nonexistent/x"))), LedgerConfig())
    entry = UsageEntry("alice", "gpt-4o", 120, 40, domain="a")
    n = 200_000
    per_add = timeit.timeit(lambda: ledger.add(entry), number=n) / n
    plain: dict[tuple[str, str], list[int]] = {("alice", "gpt-4o"): [0]}

    def bare() -> None:
        plain[("alice", "gpt-4o")][0] += 1

    per_dict = timeit.timeit(bare, number=n) / n
    return per_add, per_dict


async def _flush(cfg: DatabaseConfig, rows: int) -> float:
    db = Database(cfg)
    await migrate.prepare(db)
    ledger = Ledger(UsageBook(db), LedgerConfig(max_buffered_rows=rows + 1))
    for i in range(rows):
        ledger.add(UsageEntry(f"key-{i % 500}", f"model-{i // 500}", 100, 20))
    started = time.perf_counter()
    await ledger.flush()
    seconds = time.perf_counter() - started
    await db.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    per_add, per_dict = _add_cost()
    print(f"add: {per_add * 1e9:.0f} ns ({per_add / per_dict:.1f}x a bare dict update)")
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = DatabaseConfig(path=str(Path(tmp) / "bench.sqlite3"))
        s = asyncio.run(_flush(sqlite, args.rows))
        print(f"sqlite flush of {args.rows} rows: {s * 1000:.0f} ms ({args.rows / s:,.0f} rows/s)")
    if args.postgres:
        from tests.support.postgres import postgres_server

        with postgres_server() as pg:
            cfg = DatabaseConfig.model_validate({"url": pg.url(pg.fresh_database())})
            s = asyncio.run(_flush(cfg, args.rows))
            print(
                f"postgresql flush of {args.rows} rows: {s * 1000:.0f} ms "
                f"({args.rows / s:,.0f} rows/s)"
            )


if __name__ == "__main__":
    main()
