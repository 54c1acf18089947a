"""The recent-errors list: bounded, newest first, messages flattened and shortened."""

from __future__ import annotations

from typing import Any

from app.status.recent import MAX_MESSAGE, RecentErrors, RecentFailure


def test_keeps_the_newest_entries_and_counts_them_all() -> None:
    errors = RecentErrors(size=3, wall=lambda: 1_700_000_000.0)
    for i in range(5):
        errors.add(
            RecentFailure(f"req_{i}", "alice", "gpt-4o", "domain-a", 502, "upstream_error", "boom")
        )
    snap: dict[str, Any] = errors.snapshot()
    assert snap["total"] == 5
    assert [e["request_id"] for e in snap["recent"]] == ["req_4", "req_3", "req_2"]
    assert snap["recent"][0] == {
        "at": 1_700_000_000.0,
        "request_id": "req_4",
        "key": "alice",
        "model": "gpt-4o",
        "domain": "domain-a",
        "status": 502,
        "code": "upstream_error",
        "message": "boom",
    }


def test_long_messages_are_flattened_and_shortened() -> None:
    errors = RecentErrors()
    errors.add(
        RecentFailure("r", "k", None, None, 400, None, "line one\n\n  line two " + "x" * 500)
    )
    snap: dict[str, Any] = errors.snapshot()
    (entry,) = snap["recent"]
    assert entry["message"].startswith("line one line two x")
    assert len(entry["message"]) == MAX_MESSAGE and entry["message"].endswith("…")
