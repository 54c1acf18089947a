"""What goes over an upstream's own WebSocket: only the items its cache does not hold."""

from __future__ import annotations

from typing import Any

from app.upstream.websocket import Turn, incremental

SYSTEM = {"role": "developer", "content": "be brief"}
USER = {"role": "user", "content": "hi"}
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}


def body(*items: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": list(items), "stream": True, "store": False, **extra}


def test_a_continued_conversation_sends_only_its_new_items() -> None:
    last = Turn("resp_1", [SYSTEM, USER], [CALL])
    message = incremental(last, body(SYSTEM, USER, CALL, OUTPUT))
    assert message == {
        "type": "response.create",
        "model": "m",
        "store": False,
        "input": [OUTPUT],
        "previous_response_id": "resp_1",
    }  # and no `stream`: the socket implies it


def test_anything_else_is_sent_whole() -> None:
    last = Turn("resp_1", [SYSTEM, USER], [CALL])
    edited = {**USER, "content": "hello"}
    for fresh in (
        incremental(None, body(SYSTEM, USER)),  # a new socket holds nothing
        incremental(last, body(SYSTEM, edited, CALL, OUTPUT)),  # history rewritten
        incremental(last, body(SYSTEM, USER, CALL)),  # nothing new to add
        incremental(last, body(OUTPUT, previous_response_id="resp_0")),  # the client's own id
    ):
        assert fresh.get("previous_response_id") in (None, "resp_0")
        assert len(fresh["input"]) >= 1 and "stream" not in fresh
