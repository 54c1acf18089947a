"""Persistent state of the files and batches API, in the shared database (app/db).

    files / file_chunks  uploaded JSONL inputs and generated outputs, with their owner (key
                         alias); content in 1 MiB rows, so no single value is huge
    batches              one row per batch: its OpenAI body, status, lease (and one per
                         deferred background response, kept as a one-item batch: held.py)
    items                one row per input line: pending -> done | failed, with the answer

Every replica reads and writes the same rows, so any replica answers for any batch. An
item is marked `done` in the same statement that stores its answer, so after a crash (even
`kill -9`) whoever resumes the batch re-sends only items never recorded done. A batch is
run by the process holding its lease (`lease_owner`, `lease_until`); the lease is measured
on the database's clock, so replicas need not agree on the time: a process that dies stops
renewing it and another takes over once it lapses (`batch.lease_sec`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select, update

from app.db.engine import Database
from app.db.tables import batches, file_chunks, files, items
from app.kinds import RUNNING_BATCH, ItemState

CHUNK = 1024 * 1024
BATCH_PREFIX = "batch_"  # the id of every Batch API job (service.py)
_INSERT_ROWS = 1000  # items per INSERT statement when a batch is created


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
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- files ---------------------------------------------------------------------
    async def add_file(self, f: StoredFile, content: bytes) -> None:
        chunks = [
            {"file_id": f.id, "seq": i, "data": content[at : at + CHUNK]}
            for i, at in enumerate(range(0, len(content), CHUNK))
        ]
        async with self.db.begin() as conn:
            await conn.execute(
                files.insert().values(
                    id=f.id,
                    owner=f.owner,
                    purpose=f.purpose,
                    filename=f.filename,
                    bytes=f.bytes,
                    created_at=f.created_at,
                )
            )
            for chunk in chunks:  # one at a time: a statement never holds the whole file twice
                await conn.execute(file_chunks.insert(), chunk)

    async def get_file(self, file_id: str) -> StoredFile | None:
        cols = (files.c.id, files.c.owner, files.c.purpose, files.c.filename)
        stmt = select(*cols, files.c.bytes, files.c.created_at).where(files.c.id == file_id)
        async with self.db.connect() as conn:
            row = (await conn.execute(stmt)).first()
        return StoredFile(*row) if row else None

    async def file_content(self, file_id: str) -> bytes:
        stmt = (
            select(file_chunks.c.data)
            .where(file_chunks.c.file_id == file_id)
            .order_by(file_chunks.c.seq)
        )
        async with self.db.connect() as conn:
            return b"".join(bytes(r[0]) for r in await conn.execute(stmt))

    # -- batches -----------------------------------------------------------------------
    async def add_batch(
        self,
        batch: dict[str, Any],
        owner: str,
        rows: list[tuple[str, dict[str, Any], str, dict[str, Any] | None]],
    ) -> None:
        """Insert a batch and its items (custom_id, request, state, result) atomically."""
        params = [
            {
                "batch_id": batch["id"],
                "idx": i,
                "custom_id": cid,
                "request": json.dumps(req),
                "state": state,
                "result": json.dumps(res) if res is not None else None,
            }
            for i, (cid, req, state, res) in enumerate(rows)
        ]
        async with self.db.begin() as conn:
            await conn.execute(
                batches.insert().values(
                    id=batch["id"],
                    owner=owner,
                    body=json.dumps(batch),
                    status=batch["status"],
                    created_at=batch["created_at"],
                )
            )
            for at in range(0, len(params), _INSERT_ROWS):
                await conn.execute(items.insert(), params[at : at + _INSERT_ROWS])

    async def get_batch(self, batch_id: str) -> tuple[str, dict[str, Any]] | None:
        stmt = select(batches.c.owner, batches.c.body).where(batches.c.id == batch_id)
        async with self.db.connect() as conn:
            row = (await conn.execute(stmt)).first()
        return (row[0], json.loads(row[1])) if row else None

    async def save_batch(self, batch: dict[str, Any]) -> None:
        async with self.db.begin() as conn:
            await conn.execute(
                update(batches)
                .where(batches.c.id == batch["id"])
                .values(body=json.dumps(batch), status=batch["status"])
            )

    async def list_batches(self, owner: str, after: str | None, limit: int) -> list[dict[str, Any]]:
        """Newest first; `after` is the last id of the previous page (keyset pagination)."""
        stmt = select(batches.c.body).where(
            batches.c.owner == owner, batches.c.id.startswith(BATCH_PREFIX)
        )  # not the held responses (held.py) kept in the same table
        order = (batches.c.created_at.desc(), batches.c.id.desc())
        async with self.db.connect() as conn:
            if after is not None:
                mark = (
                    await conn.execute(
                        select(batches.c.created_at, batches.c.id).where(
                            batches.c.id == after, batches.c.owner == owner
                        )
                    )
                ).first()
                if mark is not None:
                    stmt = stmt.where(
                        or_(
                            batches.c.created_at < mark[0],
                            and_(batches.c.created_at == mark[0], batches.c.id < mark[1]),
                        )
                    )
            rows = await conn.execute(stmt.order_by(*order).limit(limit))
            return [json.loads(r[0]) for r in rows]

    async def delete_batch(self, batch_id: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(items.delete().where(items.c.batch_id == batch_id))
            await conn.execute(batches.delete().where(batches.c.id == batch_id))

    async def held_count(self, owner: str, prefix: str) -> int:
        """Unfinished rows of `owner` whose id starts with `prefix` (held responses)."""
        stmt = select(func.count()).where(
            batches.c.owner == owner,
            batches.c.id.startswith(prefix),
            batches.c.status.in_(RUNNING_BATCH),
        )
        async with self.db.connect() as conn:
            return int((await conn.execute(stmt)).scalar_one())

    async def first_request(self, batch_id: str) -> dict[str, Any] | None:
        stmt = (
            select(items.c.request)
            .where(items.c.batch_id == batch_id)
            .order_by(items.c.idx)
            .limit(1)
        )
        async with self.db.connect() as conn:
            row = (await conn.execute(stmt)).first()
        return json.loads(row[0]) if row else None

    async def claim(self, owner: str, lease_sec: float) -> list[str]:
        """Take (or renew) the lease of every unfinished batch nobody else holds."""
        now = self.db.now()
        free = or_(
            batches.c.lease_owner.is_(None),
            batches.c.lease_owner == owner,
            batches.c.lease_until < now,
        )
        async with self.db.begin() as conn:
            await conn.execute(
                update(batches)
                .where(and_(batches.c.status.in_(RUNNING_BATCH), free))
                .values(lease_owner=owner, lease_until=now + lease_sec)
            )
            rows = await conn.execute(
                select(batches.c.id)
                .where(batches.c.lease_owner == owner, batches.c.status.in_(RUNNING_BATCH))
                .order_by(batches.c.created_at)
            )
            return [r[0] for r in rows]

    async def release(self, owner: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(
                update(batches).where(batches.c.lease_owner == owner).values(lease_until=0)
            )

    # -- items --------------------------------------------------------------------------
    async def pending(self, batch_id: str) -> list[Item]:
        stmt = (
            select(items.c.idx, items.c.custom_id, items.c.request)
            .where(items.c.batch_id == batch_id, items.c.state == ItemState.PENDING)
            .order_by(items.c.idx)
        )
        async with self.db.connect() as conn:
            rows = await conn.execute(stmt)
            return [Item(batch_id, r[0], r[1], json.loads(r[2])) for r in rows]

    async def finish_item(self, item: Item, state: str, result: dict[str, Any]) -> None:
        async with self.db.begin() as conn:
            await conn.execute(
                update(items)
                .where(
                    items.c.batch_id == item.batch_id,
                    items.c.idx == item.idx,
                    items.c.state == ItemState.PENDING,
                )
                .values(state=state, result=json.dumps(result))
            )

    async def counts(self, batch_id: str) -> dict[str, int]:
        stmt = (
            select(items.c.state, func.count())
            .where(items.c.batch_id == batch_id)
            .group_by(items.c.state)
        )
        async with self.db.connect() as conn:
            return {state: int(n) for state, n in await conn.execute(stmt)}

    async def results(self, batch_id: str) -> list[tuple[str, dict[str, Any]]]:
        stmt = (
            select(items.c.state, items.c.result)
            .where(items.c.batch_id == batch_id, items.c.state != ItemState.PENDING)
            .order_by(items.c.idx)
        )
        async with self.db.connect() as conn:
            return [(r[0], json.loads(r[1])) for r in await conn.execute(stmt)]
