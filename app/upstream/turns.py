"""A Responses API conversation, turn by turn: the one model both sides of the WebSocket
bridge keep (the client's connection, `app/pipeline/socket_session.py`, and the
upstream's, `websocket.py`).

A turn is a response that a later `response.create` may continue from
(`previous_response_id`): the whole input it was generated from and the output items it
produced. `Recorder` reads them off the events of a response as they pass: only an
`response.output_item.done` or a terminal event is parsed, found by its type name in the
bytes (the quotes make it a type name: a quote inside a JSON string is escaped). The
terminal events are `TERMINAL`, the one set the relay (`streaming.py`) reads too, and
`failed_frame` is the one the gateway writes itself when a response cannot end otherwise.

An event here is one event's JSON, as bytes: a WebSocket frame as the upstream sent it,
or the data of an SSE event. The bridge relays frames as they came (never as SSE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_DONE_ITEM = "response.output_item.done"
_MARKS = tuple(f'"{t}"'.encode() for t in (_DONE_ITEM, *TERMINAL))
_CONTINUABLE = ("completed", "incomplete")


def failed_frame(message: str, code: str, response_id: str | None, sequence: int) -> bytes:
    """`response.failed`, the end of a response the gateway had to cut (clients such as
    Codex act on it; an `error` event they ignore)."""
    response: dict[str, Any] = {
        "id": response_id or "resp_failed",
        "object": "response",
        "status": "failed",
        "error": {"code": code, "message": message},
        "incomplete_details": None,
        "output": [],
        "usage": None,
    }
    return orjson.dumps(
        {"type": "response.failed", "response": response, "sequence_number": sequence}
    )


@dataclass(frozen=True, slots=True)
class Turn:
    """A response a later request on the same connection may continue from."""

    response_id: str
    items: list[Any]  # the whole input it was generated from
    output: list[Any]  # the items it produced (`response.output_item.done`)
    size: int = 0  # bytes of its JSON (input and output): what it makes a connection keep


class Recorder:
    """The turn a response makes, read from its events (`see` each, in order)."""

    __slots__ = ("ended", "events", "final", "items", "output", "size")

    def __init__(self, items: list[Any], size: int = 0) -> None:
        self.items = items
        self.output: list[Any] = []
        self.size = size
        self.ended = False  # a terminal event was seen
        self.final: dict[str, Any] = {}  # its `response`
        self.events = 0  # seen so far: the sequence number of the next

    def see(self, payload: bytes) -> None:
        """One event's JSON (an SSE event's data, or a WebSocket frame)."""
        self.events += 1
        if not any(mark in payload for mark in _MARKS):
            return
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == _DONE_ITEM:
            self.output.append(event.get("item"))
            self.size += len(payload)
        elif kind in TERMINAL:
            response = event.get("response")
            self.ended = True
            self.final = response if isinstance(response, dict) else {}

    def turn(self) -> Turn | None:
        """The turn, if the response ended in a state a later request may continue."""
        final = self.final
        if final.get("status") not in _CONTINUABLE:
            return None
        response_id = final.get("id")
        if not isinstance(response_id, str):
            return None
        return Turn(response_id, self.items, self.output, self.size)
