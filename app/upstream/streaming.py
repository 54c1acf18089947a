"""SSE relay: forward events as they arrive, read usage on the way.

The relay works on whole events (split at the blank line), so an event the client
must not see can be removed without corrupting the stream, and a partial event is
held only until its end arrives. Each event's data is read by
`sse.event_data` (the one SSE parser); per event it reads, without a JSON parse when it
can: the content delta (to time the first token and estimate an interrupted
stream), and `usage`. When the gateway itself added `stream_options.include_usage`,
the usage-only chunk (empty `choices`) is captured and not forwarded.

Anthropic's Messages stream (`event:` lines) carries usage in `message_start` and
`message_delta`; the same relay reads it. A field `message_delta` sets (not null) wins
over `message_start`'s, and the prompt is input + cache read + cache creation tokens
(see answer_usage.py: each prompt token counted once). The Responses API's typed events are read
too: the response id and model in `response.created`, the usage in the terminal event
(`response.completed`, `response.incomplete` or `response.failed`).

Tool calls count as generated text: OpenAI's `delta.tool_calls[].function.arguments`,
Anthropic's `input_json_delta` (and `thinking_delta`), so the first token is timed
and an interrupted tool call is estimated like text.

Once an OpenAI stream has shown its model and first content, later content events
are not parsed as they pass: their text matters only if the stream ends without
usage (then it is the estimate), and parsing every token's event was most of the
relay's cost. They are kept as bytes, at most `UNREAD_LIMIT` per stream (past it
they are read and dropped), and read only when an estimate is asked for. An event
that names a non-null `usage` is always read at once.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.limits.estimate import TextCounter
from app.upstream.answer_usage import anthropic_cache, cache_writes, cached_tokens
from app.upstream.sse import event_data
from app.upstream.turns import TERMINAL as RESPONSES_TERMINAL
from app.upstream.turns import failed_frame

_SEP = b"\n\n"
# Substrings of an event are looked for with `bytes.find`, never `in`: Python 3.11's
# `bytes.__contains__` first tries its operand as an integer and builds (then drops) a
# TypeError message for a bytes one, about 2,200 instructions an `in`, where `find`
# takes the buffer at once. This runs once or twice per relayed event.
UNREAD_LIMIT = 64 * 1024  # bytes of content events a stream may hold unparsed
# Responses API events whose `delta` is generated output (text, tool arguments, reasoning).
_RESPONSES_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
    }
)
_RESPONSES_START = frozenset({"response.created", "response.queued", "response.in_progress"})


class SseRelay:
    def __init__(self, *, strip_usage_chunk: bool) -> None:
        self.strip = strip_usage_chunk
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens = 0  # of prompt_tokens, read from the upstream's prompt cache
        self.cache_write_tokens = 0  # of prompt_tokens, written to it (Anthropic)
        self._anthropic_input = self._anthropic_output = 0
        self.text = TextCounter()
        self.model: str | None = None
        self.tier: str | None = None  # the `service_tier` the upstream says served it
        self.saw_content = False
        self.done = False
        self.events = 0
        self.response_id: str | None = None  # Responses API
        self._tail = b""
        self._cr = False  # the last chunk ended in a CR: the first half of a CRLF, maybe
        self._skim = False  # an OpenAI stream past its first content: defer content events
        self._skim_deltas = False  # a Responses stream past its first delta: defer deltas
        self._unread: list[bytes] = []
        self._unread_bytes = 0

    def completion_estimate(self) -> int:
        """Completion tokens estimated from the text streamed so far."""
        self._read_unread()
        return self.text.tokens

    def _read_unread(self) -> None:
        unread, self._unread, self._unread_bytes = self._unread, [], 0
        for payload in unread:
            self._parse(payload)

    @property
    def has_usage(self) -> bool:
        return self.completion_tokens is not None

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to forward now (zero or more complete events)."""
        end = len(chunk) - 2  # (a 1-byte chunk: find's -1 would match a -1 here)
        if (
            not self._tail
            and not self._cr
            and end >= 0
            and chunk.find(_SEP) == end
            and chunk.find(b"\r") < 0
            and chunk[:1] != b"\n"
        ):
            # The usual read of a model's stream: exactly one whole event. No split, no
            # copies of the chunk (this runs once per token).
            return chunk if self._inspect(chunk[:-2]) else b""
        if self._cr or chunk.find(b"\r") >= 0:  # CRLF servers
            chunk = self._crlf(chunk)
        data = self._tail + chunk if self._tail else chunk
        if data[:1] == b"\n":  # blank lines between events: SSE ignores them, so do we
            data = data.lstrip(b"\n")
        end = data.rfind(_SEP)
        if end < 0:
            self._tail = data
            return b""
        # An event ends at the first blank line after it; more blank lines wait in the tail
        # (and are dropped there), so what is forwarded does not depend on where the
        # upstream's reads happened to cut a run of them.
        while end and data[end - 1] == 10:  # b"\n"
            end -= 1
        self._tail = data[end + 2 :]
        complete = data[: end + 2]
        if complete.find(b"\n\n\n") >= 0:  # blank lines inside: drop them, one event per separator
            events = [e.strip(b"\n") for e in complete.split(_SEP)]
            events = [e for e in events if e]
            complete = b"".join(e + _SEP for e in events)
            events.append(b"")
        else:
            events = complete.split(_SEP)
        events.pop()  # the empty piece after the last separator
        inspect = self._inspect
        if not self.strip:
            for event in events:
                inspect(event)
            return complete
        kept = [event for event in events if inspect(event)]
        if len(kept) == len(events):  # the usual chunk: nothing to remove, nothing to copy
            return complete
        return b"".join(e + _SEP for e in kept)

    def _crlf(self, chunk: bytes) -> bytes:
        """The chunk with its line ends (CRLF, or CR alone, as SSE allows) as LFs. A CR
        ending it waits for the next chunk (a CRLF may be split across two reads), so
        each byte is normalised exactly once, wherever the reads cut the stream."""
        if self._cr:
            chunk, self._cr = b"\r" + chunk, False
        if chunk[-1:] == b"\r":
            chunk, self._cr = chunk[:-1], True
        return chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def finish(self) -> bytes:
        """What is left when the upstream closed (a last event without its blank line)."""
        if self._cr:  # a CR that never met its LF ends a line all the same
            self._tail, self._cr = self._tail + b"\n", False
        event, self._tail = self._tail.strip(b"\n"), b""
        if event.strip() and self._inspect(event):
            return event + _SEP
        return b""

    def _inspect(self, event: bytes) -> bool:
        """Read one event; False if it must not be forwarded."""
        self.events += 1
        payload = event_data(event)
        if payload is None:
            return True
        if payload == b"[DONE]":
            self.done = True
            return True
        if (
            self._skim or (self._skim_deltas and payload.find(b'.delta"') >= 0)
        ) and not _names_usage(payload):
            # A `.delta"` right before a quote is a type name: in a JSON string that quote
            # would be escaped.
            self._unread.append(payload)
            self._unread_bytes += len(payload)
            if self._unread_bytes > UNREAD_LIMIT:
                self._read_unread()
            return True
        return self._parse(payload)

    def _parse(self, payload: bytes) -> bool:
        """Read one event's JSON; False if it must not be forwarded."""
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return True
        if not isinstance(obj, dict):
            return True
        return self._read(obj)

    def _read(self, obj: dict[str, Any]) -> bool:
        if self.model is None and isinstance(obj.get("model"), str):
            self.model = obj["model"]
            tier = obj.get("service_tier")  # OpenAI says it in every chunk: the first will do
            self.tier = tier if isinstance(tier, str) else None
        kind = obj.get("type")
        if isinstance(kind, str):
            if kind.startswith("response."):
                self._read_responses(kind, obj)
            else:
                self._read_anthropic(kind, obj)
            return True
        choices = obj.get("choices")
        if choices and isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict):
                    self._read_choice(choice)
            self._skim = self.model is not None and self.saw_content
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._take_usage(usage.get("prompt_tokens"), usage.get("completion_tokens"))
            self.cached_tokens = cached_tokens(usage)
            self.cache_write_tokens = cache_writes(usage)
            if self.strip and not choices:
                return False
        return True

    def _read_choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if text and isinstance(text, str):
            self._add_text(text)
        calls = delta.get("tool_calls") if isinstance(delta, dict) else None
        if calls and isinstance(calls, list):
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                args = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(args, str) and args:
                    self._add_text(args)

    def _add_text(self, text: str) -> None:
        self.saw_content = True
        self.text.add(text)

    def _read_anthropic(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "message_start":
            message = obj.get("message") or {}
            if isinstance(message.get("model"), str):
                self.model = message["model"]
            usage = message.get("usage")
            if isinstance(usage, dict):
                self._take_anthropic_usage(usage)
        elif kind == "content_block_delta":
            delta = obj.get("delta") or {}
            for field in ("text", "partial_json", "thinking"):
                text = delta.get(field)
                if isinstance(text, str) and text:
                    self._add_text(text)
                    break
        elif kind == "message_delta":
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self._take_anthropic_usage(usage)
                self.completion_tokens = self._anthropic_output
        elif kind == "message_stop":
            self.done = True

    def _read_responses(self, kind: str, obj: dict[str, Any]) -> None:
        if kind in _RESPONSES_DELTAS:
            delta = obj.get("delta")
            if isinstance(delta, str) and delta:
                self.saw_content = True
                self.text.add(delta)
                self._skim_deltas = True
            return
        if kind not in _RESPONSES_START and kind not in RESPONSES_TERMINAL:
            return
        response = obj.get("response")
        if not isinstance(response, dict):
            return
        if isinstance(response.get("model"), str):
            self.model = response["model"]
        if self.response_id is None and isinstance(response.get("id"), str):
            self.response_id = response["id"]
        if kind in RESPONSES_TERMINAL:
            self.done = True
            tier = response.get("service_tier")
            if isinstance(tier, str):
                self.tier = tier
            usage = response.get("usage")
            if isinstance(usage, dict):
                self._take_usage(usage.get("input_tokens"), usage.get("output_tokens"))
                self.cached_tokens = cached_tokens(usage)

    def _take_anthropic_usage(self, usage: dict[str, Any]) -> None:
        """Merge one usage object: fields present and not null replace earlier ones."""
        if usage.get("input_tokens") is not None:
            self._anthropic_input = _int(usage.get("input_tokens"))
        if usage.get("output_tokens") is not None:
            self._anthropic_output = _int(usage.get("output_tokens"))
        read, write = anthropic_cache(usage)
        if usage.get("cache_read_input_tokens") is not None:
            self.cached_tokens = read
        if usage.get("cache_creation_input_tokens") is not None:
            self.cache_write_tokens = write
        self.prompt_tokens = self._anthropic_input + self.cached_tokens + self.cache_write_tokens

    def _take_usage(self, prompt: Any, completion: Any) -> None:
        self.prompt_tokens = _int(prompt)
        self.completion_tokens = _int(completion)


class FrameReader(SseRelay):
    """The relay's reading of events without its SSE framing: an upstream socket's
    frames, each one event's JSON, read as they came and never rewritten. (Here, beside
    its base: the compiled build compiles this module, and an interpreted class cannot
    inherit a compiled one.)"""

    def __init__(self) -> None:
        super().__init__(strip_usage_chunk=False)

    def see(self, frame: bytes) -> None:
        self.events += 1
        self._parse(frame)


def _names_usage(payload: bytes) -> bool:
    """Does the event carry a `usage` that is not null (OpenAI sends `"usage":null` on
    every chunk once usage was asked for)? A quote inside a JSON string is escaped, so
    `"usage"` in the bytes is a key."""
    at = payload.find(b'"usage"')
    while at >= 0:
        if not payload[at + 7 : at + 16].lstrip(b": \t").startswith(b"null"):
            return True
        at = payload.find(b'"usage"', at + 7)
    return False


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def failed_event(message: str, code: str, response_id: str | None, sequence: int) -> bytes:
    """The Responses API's end of a stream the upstream broke off (`turns.failed_frame`)
    as an SSE event."""
    frame = failed_frame(message, code, response_id, sequence)
    return b"event: response.failed\ndata: " + frame + _SEP


def error_event(message: str, code: str, *, anthropic: bool = False) -> bytes:
    """The event that ends a stream the upstream broke off (the SDKs raise on it)."""
    if anthropic:
        body = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + orjson.dumps(body) + _SEP
    err = {"error": {"message": message, "type": "upstream_error", "param": None, "code": code}}
    return b"data: " + orjson.dumps(err) + _SEP
