"""The usage ledger: per key and model, requests, errors and tokens, persisted.

Failures are recorded with what they consumed (docs/design.md, "What the second
article adds"), so a row keeps the tokens of failed attempts apart from billed usage.
In-process, totals accumulate in memory and pending deltas are added to SQLite every
`flush_interval_sec` and at shutdown (`INSERT ... ON CONFLICT DO UPDATE SET n = n +
excluded.n`), so several workers and successive restarts add up in one file instead
of overwriting it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

COUNTERS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "failed_prompt_tokens",
    "failed_completion_tokens",
)


class UsageEntry(NamedTuple):
    """One answered request's usage (a NamedTuple: one is built per request)."""

    key: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: bool = False
    failed_prompt_tokens: int = 0
    failed_completion_tokens: int = 0

    def counters(self) -> tuple[int, ...]:
        return (
            1,
            1 if self.error else 0,
            self.prompt_tokens,
            self.completion_tokens,
            self.failed_prompt_tokens,
            self.failed_completion_tokens,
        )


@dataclass
class LedgerRow:
    key: str
    model: str
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failed_prompt_tokens: int = 0
    failed_completion_tokens: int = 0

    def add(self, values: tuple[int, ...]) -> None:
        # Spelled out, not a loop over COUNTERS with getattr/setattr: once per request.
        requests, errors, prompt, completion, failed_prompt, failed_completion = values
        self.requests += requests
        self.errors += errors
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.failed_prompt_tokens += failed_prompt
        self.failed_completion_tokens += failed_completion

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    key TEXT NOT NULL, model TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
    failed_prompt_tokens INTEGER NOT NULL DEFAULT 0,
    failed_completion_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, model))
"""
_UPSERT = (
    f"INSERT INTO usage (key, model, {', '.join(COUNTERS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (key, model) DO UPDATE SET "
    + ", ".join(f"{c} = {c} + excluded.{c}" for c in COUNTERS)
)


@dataclass
class Ledger:
    path: Path | None
    flush_interval: float = 1.0
    _pending: dict[tuple[str, str], LedgerRow] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def start(self) -> None:
        if self.path is not None:
            await asyncio.to_thread(self._init_db)

    def _init_db(self) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        assert self.path is not None
        return sqlite3.connect(self.path, timeout=10)

    def add(self, entry: UsageEntry) -> None:
        key = (entry.key, entry.model)
        row = self._pending.get(key)
        if row is None:
            row = self._pending[key] = LedgerRow(entry.key, entry.model)
        row.add(entry.counters())

    async def flush(self) -> None:
        if self.path is None or not self._pending:
            return
        async with self._lock:
            pending, self._pending = self._pending, {}
            try:
                await asyncio.to_thread(self._write, list(pending.values()))
            except Exception:
                for row in pending.values():  # keep them for the next flush
                    self.merge(row)
                raise

    def merge(self, row: LedgerRow) -> None:
        mine = self._pending.setdefault((row.key, row.model), LedgerRow(row.key, row.model))
        mine.add(tuple(getattr(row, c) for c in COUNTERS))

    def _write(self, rows: list[LedgerRow]) -> None:
        with self._connect() as db:
            db.executemany(
                _UPSERT, [(r.key, r.model, *(getattr(r, c) for c in COUNTERS)) for r in rows]
            )

    async def rows(self) -> list[LedgerRow]:
        if self.path is None:
            return sorted(self._pending.values(), key=lambda r: (r.key, r.model))
        await self.flush()
        return await asyncio.to_thread(self._read)

    def _read(self) -> list[LedgerRow]:
        with self._connect() as db:
            cur = db.execute(f"SELECT key, model, {', '.join(COUNTERS)} FROM usage ORDER BY 1, 2")
            return [LedgerRow(*row) for row in cur.fetchall()]

    def drain_pending(self) -> list[LedgerRow]:
        """Hand over unflushed rows (the Redis store replays them once Redis is back)."""
        pending, self._pending = self._pending, {}
        return list(pending.values())

    async def close(self) -> None:
        await self.flush()

    def describe(self) -> str:
        return str(self.path) if self.path is not None else "memory"
