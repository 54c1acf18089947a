"""A chat completions stream retold as the Responses API's typed events (`responses =
"chat"` domains; the request side is `responses_chat.py`).

    response.created, response.in_progress                       at the first chunk
    text deltas      ► output_item.added (message), content_part.added,
                       output_text.delta ...; closed by output_text.done,
                       content_part.done, output_item.done
    tool-call deltas ► per call index: output_item.added, then
                       function:     function_call_arguments.delta ... .done
                       custom:       custom_tool_call_input.delta/.done (whole, at the end:
                                     its input is a JSON string the arguments encode)
                       tool_search:  (no deltas) the item with its arguments
                       and output_item.done with the item as the client declared its tool
    [DONE] / the usage chunk after finish_reason ► response.completed (or .incomplete on
                       `length`) with every output item and the usage

A stream that ends before `[DONE]` gets no terminal event here: the relay's own
`response.failed` (stream_interrupted) ends it, as for a Responses upstream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.upstream.responses_chat import (
    Flat,
    Tools,
    call_item,
    message_item,
    new_id,
    response,
    to_response,
    usage_of,
)
from app.upstream.sse import EventReader
from app.upstream.transport import UpstreamResponse

MAX_EVENT = 4 * 1024 * 1024  # bytes of one upstream event held while it is incomplete


@dataclass
class _Call:
    index: int  # output_index
    call_id: str
    flat: Flat
    item_id: str
    arguments: str = ""


@dataclass
class ChatStream:
    """The event rewriter for one stream."""

    body: dict[str, Any]
    tools: Tools
    response_id: str = field(default_factory=lambda: new_id("resp"))
    model: str = ""
    seq: int = 0
    started: bool = False
    ended: bool = False
    output: list[dict[str, Any]] = field(default_factory=list)
    _text_id: str | None = None
    _text: str = ""
    _text_index: int = 0
    _calls: dict[int, _Call] = field(default_factory=dict)
    _opened: int = 0  # output items opened so far: the next one's output_index
    _finish: str | None = None
    _usage: dict[str, Any] | None = None
    _reader: EventReader = field(default_factory=lambda: EventReader(limit=MAX_EVENT))

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _response(self, status: str) -> dict[str, Any]:
        model = self.model or str(self.body.get("model") or "")
        usage = self._usage if status != "in_progress" else None
        return response(self.body, self.response_id, model, self.output, usage, status)

    def feed(self, chunk: bytes) -> bytes:
        """The Responses events for this piece of the chat stream (maybe none yet)."""
        out = bytearray()
        # an upstream that never ends its event: the reader drops it past MAX_EVENT
        for event in self._reader.feed(chunk):
            out += self._data(event.data)
        return bytes(out)

    def _data(self, payload: str) -> bytes:
        if self.ended or not payload.strip():
            return b""
        if payload.startswith("[DONE]"):
            return self.end()
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(chunk, dict):
            return b""
        out = bytearray()
        if not self.started:
            self.started = True
            self.model = str(chunk.get("model") or "")
            out += self._event("response.created", response=self._response("in_progress"))
            out += self._event("response.in_progress", response=self._response("in_progress"))
        if chunk.get("usage"):
            self._usage = usage_of(chunk["usage"])
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out += self._choice(choice)
        return bytes(out)

    def _choice(self, choice: dict[str, Any]) -> bytes:
        out = bytearray()
        delta = choice.get("delta") or {}
        text = delta.get("content")
        if isinstance(text, str) and text:
            out += self._text_delta(text)
        for call in delta.get("tool_calls") or []:
            if isinstance(call, dict):
                out += self._call_delta(call)
        if choice.get("finish_reason"):
            self._finish = str(choice["finish_reason"])
        return bytes(out)

    def _text_delta(self, text: str) -> bytes:
        out = bytearray()
        if self._text_id is None:
            self._text_id, self._text_index = new_id("msg"), self._next_index()
            item = {**message_item("", self._text_id), "status": "in_progress", "content": []}
            out += self._event(
                "response.output_item.added", output_index=self._text_index, item=item
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._event(
                "response.content_part.added",
                item_id=self._text_id,
                output_index=self._text_index,
                content_index=0,
                part=part,
            )
        self._text += text
        out += self._event(
            "response.output_text.delta",
            item_id=self._text_id,
            output_index=self._text_index,
            content_index=0,
            delta=text,
            logprobs=[],
        )
        return bytes(out)

    def _next_index(self) -> int:
        self._opened += 1
        return self._opened - 1

    def _call_delta(self, delta: dict[str, Any]) -> bytes:
        out = bytearray()
        index = int(delta.get("index") or 0)
        fn = delta.get("function") or {}
        call = self._calls.get(index)
        if call is None:
            flat = self.tools.restore(str(fn.get("name") or ""))
            call_id = str(delta.get("id") or new_id("call"))
            call = _Call(self._next_index(), call_id, flat, "")
            item = call_item(flat, call_id, "")
            call.item_id = item["id"]
            self._calls[index] = call
            if flat.kind == "function":
                item["status"] = "in_progress"
                out += self._event("response.output_item.added", output_index=call.index, item=item)
        piece = fn.get("arguments")
        if isinstance(piece, str) and piece:
            call.arguments += piece
            if call.flat.kind == "function":
                out += self._event(
                    "response.function_call_arguments.delta",
                    item_id=call.item_id,
                    output_index=call.index,
                    delta=piece,
                )
        return bytes(out)

    @property
    def finished(self) -> bool:
        """The upstream said why it stopped (a stream that then ends without `[DONE]`
        is still whole)."""
        return self._finish is not None

    def end(self) -> bytes:
        self.ended = True
        out = bytearray()
        done: list[tuple[int, dict[str, Any]]] = []
        if self._text_id is not None:
            item = message_item(self._text, self._text_id)
            ids = {"item_id": self._text_id, "output_index": self._text_index}
            out += self._event(
                "response.output_text.done", **ids, content_index=0, text=self._text, logprobs=[]
            )
            out += self._event(
                "response.content_part.done", **ids, content_index=0, part=item["content"][0]
            )
            out += self._event(
                "response.output_item.done", output_index=self._text_index, item=item
            )
            done.append((self._text_index, item))
        for call in self._calls.values():
            item = {**call_item(call.flat, call.call_id, call.arguments), "id": call.item_id}
            ids = {"item_id": call.item_id, "output_index": call.index}
            if call.flat.kind == "function":
                out += self._event(
                    "response.function_call_arguments.done", **ids, arguments=call.arguments
                )
            else:
                added = {**item, "status": "in_progress"}
                out += self._event(
                    "response.output_item.added", output_index=call.index, item=added
                )
                if call.flat.kind == "custom":
                    out += self._event(
                        "response.custom_tool_call_input.delta", **ids, delta=item["input"]
                    )
                    out += self._event(
                        "response.custom_tool_call_input.done", **ids, input=item["input"]
                    )
            out += self._event("response.output_item.done", output_index=call.index, item=item)
            done.append((call.index, item))
        self.output = [item for _, item in sorted(done, key=lambda pair: pair[0])]
        status = "incomplete" if self._finish == "length" else "completed"
        out += self._event(f"response.{status}", response=self._response(status))
        return bytes(out)


class ChatAnswer:
    """An upstream chat answer read as a Responses one (the `UpstreamResponse` the
    pipeline relays): a JSON body rewritten whole, a stream event by event. Error
    answers pass as they came (OpenAI's error body is the same for both APIs)."""

    def __init__(self, resp: UpstreamResponse, body: dict[str, Any], tools: Tools) -> None:
        self._resp, self._body, self._tools = resp, body, tools
        self.status = resp.status
        self._stream = ChatStream(body, tools)

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    @property
    def complete(self) -> bool:
        return False  # events may still be held back for the end

    async def read(self) -> bytes:
        data = await self._resp.read()
        if self.status != 200:
            return data
        try:
            chat = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        if not isinstance(chat, dict):
            return data
        return orjson.dumps(to_response(self._body, self._tools, chat))

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._resp.chunks():
            out = self._stream.feed(chunk)
            if out:
                yield out
        if not self._stream.ended and self._stream._finish is not None:
            # a stream that ended after its finish_reason but without [DONE]
            yield self._stream.end()

    async def close(self) -> None:
        await self._resp.close()
