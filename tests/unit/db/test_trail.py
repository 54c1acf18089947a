"""The audit trail's table on SQLite and PostgreSQL: newest first, filtered, deduplicated
by `once` across writers, pruned by age."""

from __future__ import annotations

from app.config.schema import DatabaseConfig
from app.db import migrate
from app.db.engine import Database
from app.db.trail import AuditBook, AuditQuery, AuditRow


async def test_rows_read_back_newest_first_with_filters_and_once_dedupes(
    database_cfg: DatabaseConfig,
) -> None:
    db = Database(database_cfg)
    await migrate.prepare(db)
    book = AuditBook(db)
    await book.write(
        [
            AuditRow(100.0, "admin", "r1", "key_limits.set", "key:alice", {"rpm": 1}, {"rpm": 2}),
            AuditRow(200.0, "reload", "r1", "key.added", "key:bob", None, {"alias": "bob"}),
            AuditRow(300.0, "reload", "r2", "price.changed", "model:m", {"input": "1"}, None),
        ]
    )
    expiry = AuditRow(400.0, "expiry", "r1", "key.expired", "key:bob", once="key.expired:bob:x")
    await book.write([expiry])
    await book.write([expiry._replace(replica="r2", at=401.0)])  # another replica: nothing
    rows = await book.read(AuditQuery())
    assert [r["action"] for r in rows] == [
        "key.expired",
        "price.changed",
        "key.added",
        "key_limits.set",
    ]
    assert rows[-1]["before"] == {"rpm": 1} and rows[-1]["after"] == {"rpm": 2}
    assert rows[1]["after"] is None
    assert [r["target"] for r in await book.read(AuditQuery(actor="reload"))] == [
        "model:m",
        "key:bob",
    ]
    assert len(await book.read(AuditQuery(action="key."))) == 2  # a prefix
    assert len(await book.read(AuditQuery(action="key"))) == 0  # exact
    assert len(await book.read(AuditQuery(action="%."))) == 0  # LIKE wildcards are escaped
    assert len(await book.read(AuditQuery(target="key:bob", since=150, until=400))) == 1
    assert len(await book.read(AuditQuery(limit=2))) == 2
    assert await book.prune(250.0) == 2
    assert [r["at"] for r in await book.read(AuditQuery())] == [400.0, 300.0]
    await db.close()
