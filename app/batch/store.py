"""Persistent state of the files and batches API (SQLite).

    files    uploaded JSONL inputs and generated outputs, with their owner (key alias)
    batches  one row per batch: status, timestamps, counts, output/error file ids, lease
    items    one row per input line: pending -> done | failed, with the upstream's answer

An item is marked `done` in the same transaction that stores its answer, so after a crash
(even `kill -9`) a resumed batch re-sends only items that were never recorded done. A batch
is run by the process holding its lease (`lease_owner`, `lease_until`); a process that dies
stops renewing it and the next one takes over. All calls run on one worker thread that owns
the connection, so the event loop never blocks on disk.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, content BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, body TEXT NOT NULL, status TEXT NOT NULL,
    created_at INTEGER NOT NULL, lease_owner TEXT, lease_until REAL NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS items (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL,
    request TEXT NOT NULL, state TEXT NOT NULL, result TEXT,
    PRIMARY KEY (batch_id, idx));
CREATE INDEX IF NOT EXISTS items_pending ON items (batch_id, state);
"""


@dataclass(frozen=True)
class StoredFile:
    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


@dataclass(frozen=True)
class Item:
    batch_id: str
    idx: int
    custom_id: str
    request: dict[str, Any]


class BatchStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-db")
        self._db: sqlite3.Connection | None = None

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(self._conn()))

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, timeout=10, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        return self._db

    async def start(self) -> None:
        await self._run(lambda db: None)

    async def close(self) -> None:
        def shut(db: sqlite3.Connection) -> None:
            db.close()
            self._db = None

        if self._db is not None:
            await self._run(shut)
        self._pool.shutdown(wait=True)

    # -- files ---------------------------------------------------------------------
    async def add_file(self, f: StoredFile, content: bytes) -> None:
        await self._run(
            lambda db: db.execute(
                "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)",
                (f.id, f.owner, f.purpose, f.filename, f.bytes, f.created_at, content),
            )
        )

    async def get_file(self, file_id: str) -> StoredFile | None:
        def read(db: sqlite3.Connection) -> StoredFile | None:
            row = db.execute(
                "SELECT id, owner, purpose, filename, bytes, created_at FROM files WHERE id = ?",
                (file_id,),
            ).fetchone()
            return StoredFile(*row) if row else None

        return await self._run(read)

    async def file_content(self, file_id: str) -> bytes:
        def read(db: sqlite3.Connection) -> bytes:
            row = db.execute("SELECT content FROM files WHERE id = ?", (file_id,)).fetchone()
            return bytes(row[0]) if row else b""

        return await self._run(read)

    # -- batches -----------------------------------------------------------------------
    async def add_batch(
        self,
        batch: dict[str, Any],
        owner: str,
        items: list[tuple[str, dict[str, Any], str, dict[str, Any] | None]],
    ) -> None:
        """Insert a batch and its items (custom_id, request, state, result) atomically."""

        def insert(db: sqlite3.Connection) -> None:
            with db:
                db.execute("BEGIN")
                db.execute(
                    "INSERT INTO batches (id, owner, body, status, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (batch["id"], owner, json.dumps(batch), batch["status"], batch["created_at"]),
                )
                db.executemany(
                    "INSERT INTO items VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (
                            batch["id"],
                            i,
                            cid,
                            json.dumps(req),
                            state,
                            json.dumps(res) if res is not None else None,
                        )
                        for i, (cid, req, state, res) in enumerate(items)
                    ],
                )

        await self._run(insert)

    async def get_batch(self, batch_id: str) -> tuple[str, dict[str, Any]] | None:
        def read(db: sqlite3.Connection) -> tuple[str, dict[str, Any]] | None:
            row = db.execute("SELECT owner, body FROM batches WHERE id = ?", (batch_id,)).fetchone()
            return (row[0], json.loads(row[1])) if row else None

        return await self._run(read)

    async def save_batch(self, batch: dict[str, Any]) -> None:
        await self._run(
            lambda db: db.execute(
                "UPDATE batches SET body = ?, status = ? WHERE id = ?",
                (json.dumps(batch), batch["status"], batch["id"]),
            )
        )

    async def list_batches(self, owner: str, after: str | None, limit: int) -> list[dict[str, Any]]:
        def read(db: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = db.execute(
                "SELECT id, body FROM batches WHERE owner = ? ORDER BY created_at DESC, id DESC",
                (owner,),
            ).fetchall()
            ids = [r[0] for r in rows]
            start = ids.index(after) + 1 if after in ids else 0
            return [json.loads(r[1]) for r in rows[start : start + limit]]

        return await self._run(read)

    async def claim(self, owner: str, lease_sec: float) -> list[str]:
        """Take (or renew) the lease of every unfinished batch nobody else holds."""

        def grab(db: sqlite3.Connection) -> list[str]:
            now = time.time()
            db.execute(
                "UPDATE batches SET lease_owner = ?, lease_until = ? WHERE status IN "
                "('in_progress', 'cancelling', 'finalizing') AND (lease_owner IS NULL OR "
                "lease_owner = ? OR lease_until < ?)",
                (owner, now + lease_sec, owner, now),
            )
            rows = db.execute(
                "SELECT id FROM batches WHERE lease_owner = ? AND status IN "
                "('in_progress', 'cancelling', 'finalizing') ORDER BY created_at",
                (owner,),
            ).fetchall()
            return [r[0] for r in rows]

        return await self._run(grab)

    async def release(self, owner: str) -> None:
        await self._run(
            lambda db: db.execute(
                "UPDATE batches SET lease_until = 0 WHERE lease_owner = ?", (owner,)
            )
        )

    # -- items --------------------------------------------------------------------------
    async def pending(self, batch_id: str) -> list[Item]:
        def read(db: sqlite3.Connection) -> list[Item]:
            rows = db.execute(
                "SELECT idx, custom_id, request FROM items WHERE batch_id = ? AND "
                "state = 'pending' ORDER BY idx",
                (batch_id,),
            ).fetchall()
            return [Item(batch_id, r[0], r[1], json.loads(r[2])) for r in rows]

        return await self._run(read)

    async def finish_item(self, item: Item, state: str, result: dict[str, Any]) -> None:
        await self._run(
            lambda db: db.execute(
                "UPDATE items SET state = ?, result = ? WHERE batch_id = ? AND idx = ? AND "
                "state = 'pending'",
                (state, json.dumps(result), item.batch_id, item.idx),
            )
        )

    async def counts(self, batch_id: str) -> dict[str, int]:
        def read(db: sqlite3.Connection) -> dict[str, int]:
            rows = db.execute(
                "SELECT state, COUNT(*) FROM items WHERE batch_id = ? GROUP BY state", (batch_id,)
            ).fetchall()
            return {state: n for state, n in rows}

        return await self._run(read)

    async def results(self, batch_id: str) -> list[tuple[str, dict[str, Any]]]:
        def read(db: sqlite3.Connection) -> list[tuple[str, dict[str, Any]]]:
            rows = db.execute(
                "SELECT state, result FROM items WHERE batch_id = ? AND "
                "state != 'pending' ORDER BY idx",
                (batch_id,),
            ).fetchall()
            return [(r[0], json.loads(r[1])) for r in rows]

        return await self._run(read)
