"""The one turn model of the WebSocket bridge: what `Recorder` keeps of a response's
events, whichever side (client connection or upstream socket) reads them."""

from __future__ import annotations

import orjson

from app.upstream.turns import TERMINAL, Recorder, Turn

ITEM = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}


def frame(kind: str, **fields: object) -> bytes:
    return orjson.dumps({"type": kind, **fields})


def test_a_completed_response_is_a_turn_of_its_input_and_output_items() -> None:
    rec = Recorder([{"role": "user", "content": "x"}], size=10)
    done = frame("response.output_item.done", item=ITEM)
    for payload in (
        frame("response.created", response={"id": "resp_1", "status": "in_progress"}),
        frame("response.output_text.delta", delta='"response.completed"'),  # text, not a type
        done,
        frame("response.completed", response={"id": "resp_1", "status": "completed"}),
    ):
        assert not rec.ended
        rec.see(payload)
    assert rec.ended
    assert rec.turn() == Turn("resp_1", [{"role": "user", "content": "x"}], [ITEM], 10 + len(done))


def test_only_completed_or_incomplete_responses_with_an_id_can_be_continued() -> None:
    for status, rid, continued in [
        ("incomplete", "resp_2", True),
        ("failed", "resp_3", False),
        ("completed", None, False),
    ]:
        rec = Recorder([])
        kind = "response.failed" if status == "failed" else f"response.{status}"
        rec.see(frame(kind, response={"id": rid, "status": status}))
        assert rec.ended and (rec.turn() is not None) is continued
    assert TERMINAL == {"response.completed", "response.incomplete", "response.failed"}


def test_garbage_and_unfinished_streams_make_no_turn() -> None:
    rec = Recorder([])
    rec.see(b'{"type": "response.completed"')  # cut JSON
    rec.see(b'["response.completed"]')
    assert not rec.ended and rec.turn() is None
