"""The batch statuses and item states are the plain words OpenAI clients read."""

from __future__ import annotations

import json

from app.kinds import RUNNING_BATCH, BatchStatus, ItemState


def test_statuses_are_openais_words_in_json() -> None:
    body = {"status": BatchStatus.IN_PROGRESS}
    assert json.dumps(body) == '{"status": "in_progress"}'
    assert json.loads(json.dumps(body))["status"] == BatchStatus.IN_PROGRESS
    assert {s.value for s in BatchStatus} == {
        "validating",
        "failed",
        "in_progress",
        "finalizing",
        "completed",
        "expired",
        "cancelling",
        "cancelled",
    }


def test_running_statuses_are_the_unfinished_ones() -> None:
    assert set(RUNNING_BATCH) == {"in_progress", "cancelling", "finalizing"}
    assert [s.value for s in ItemState] == ["pending", "done", "failed"]
