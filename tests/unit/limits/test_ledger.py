from __future__ import annotations

from pathlib import Path

from app.limits.ledger import Ledger, UsageEntry


async def test_ledger_accumulates_across_instances_and_restarts(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.sqlite3"
    one, two = Ledger(path), Ledger(path)
    await one.start()
    await two.start()
    one.add(UsageEntry("k", "m", prompt_tokens=3, completion_tokens=5))
    two.add(
        UsageEntry(
            "k", "m", prompt_tokens=1, completion_tokens=1, error=True, failed_completion_tokens=7
        )
    )
    await one.close()
    await two.close()
    again = Ledger(path)
    await again.start()
    (row,) = await again.rows()
    assert (row.requests, row.errors, row.prompt_tokens, row.completion_tokens) == (2, 1, 4, 6)
    assert row.failed_completion_tokens == 7
