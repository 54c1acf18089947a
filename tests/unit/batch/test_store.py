"""The batch store on SQLite and PostgreSQL: files in chunks, items recorded once, leases
on the database's clock that another process takes over once they lapse."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.batch.store import CHUNK, BatchStore, StoredFile
from app.config.schema import DatabaseConfig
from app.db import migrate
from app.db.engine import Database


@pytest.fixture
async def store(database_cfg: DatabaseConfig) -> AsyncIterator[BatchStore]:
    db = Database(database_cfg)
    await migrate.prepare(db)
    yield BatchStore(db)
    await db.close()


def batch(batch_id: str, created_at: int, status: str = "in_progress") -> dict[str, Any]:
    return {"id": batch_id, "status": status, "created_at": created_at, "endpoint": "/v1/x"}


async def test_a_file_larger_than_a_chunk_comes_back_whole(store: BatchStore) -> None:
    content = os.urandom(CHUNK * 2 + 123)
    f = StoredFile("file-1", "alice", "batch", "in.jsonl", len(content), 1)
    await store.add_file(f, content)
    assert await store.get_file("file-1") == f
    assert await store.file_content("file-1") == content
    assert await store.get_file("file-nope") is None


async def test_items_are_recorded_once_and_counted(store: BatchStore) -> None:
    rows: list[tuple[str, dict[str, Any], str, dict[str, Any] | None]]
    rows = [(f"c{i}", {"n": i}, "pending", None) for i in range(3)]
    rows.append(("bad", {}, "failed", {"error": "x"}))
    await store.add_batch(batch("b1", 10), "alice", rows)
    pending = await store.pending("b1")
    assert [i.custom_id for i in pending] == ["c0", "c1", "c2"] and pending[1].request == {"n": 1}
    await store.finish_item(pending[0], "done", {"ok": 1})
    await store.finish_item(pending[0], "failed", {"late": 1})  # already done: ignored
    assert await store.counts("b1") == {"pending": 2, "done": 1, "failed": 1}
    assert await store.results("b1") == [("done", {"ok": 1}), ("failed", {"error": "x"})]
    owner, body = await store.get_batch("b1") or ("", {})
    assert owner == "alice" and body["status"] == "in_progress"


async def test_batches_are_listed_newest_first_page_by_page(store: BatchStore) -> None:
    for n in range(5):
        await store.add_batch(batch(f"b{n}", 100 + n), "alice", [])
    await store.add_batch(batch("other", 200), "bob", [])
    first = await store.list_batches("alice", None, 2)
    second = await store.list_batches("alice", first[-1]["id"], 2)
    rest = await store.list_batches("alice", second[-1]["id"], 10)
    assert [b["id"] for b in first + second + rest] == ["b4", "b3", "b2", "b1", "b0"]


async def test_a_lease_is_held_until_it_lapses_then_taken_over(
    database_cfg: DatabaseConfig, store: BatchStore
) -> None:
    other = BatchStore(Database(database_cfg))  # another replica, its own connections
    await store.add_batch(batch("b1", 1), "alice", [])
    await store.add_batch(batch("done", 2, status="completed"), "alice", [])
    assert await store.claim("replica-a", lease_sec=30) == ["b1"]
    assert await other.claim("replica-b", lease_sec=30) == []  # held
    assert await store.claim("replica-a", lease_sec=0.3) == ["b1"]  # renewed, shorter
    await asyncio.sleep(0.6)  # replica-a stops renewing (it died)
    assert await other.claim("replica-b", lease_sec=30) == ["b1"]
    assert await store.claim("replica-a", lease_sec=30) == []
    await other.release("replica-b")  # a clean stop hands it on at once
    assert await store.claim("replica-a", lease_sec=30) == ["b1"]
    await other.db.close()
