"""Server-sent events, read as the WHATWG HTML standard says (§9.2.6, "Interpreting an
event stream"): the one parser of the gateway and the sim's tests.

    stream ─► lines (each ends at CRLF, LF or CR; a BOM opening the stream is dropped)
          ─► a blank line dispatches the event read so far
          ─► ":..."          a comment: ignored
             "name:value"    a field; one space after the colon is dropped
             "name"          a field with the empty value
             data  ─► its value and a LF appended to the data (the last LF removed
                      at dispatch); an event without any data line is not dispatched
             event ─► the event's type ("message" when none)
             id    ─► the last event id (kept across events; a value with NUL ignored)
             retry ─► the reconnection time, if all ASCII digits
             other ─► ignored

Two ways in. `EventReader` is the full parser (chunks cut anywhere, the `event`, `id`
and `retry` fields), for the gateway's own streams that are not relayed byte for byte.
`event_data` reads one event block the relay has already cut at its blank line and
answers only its data, with no copy for the usual one-line `data:` event (the relay
runs it once per token, and relays the bytes it did not rewrite as they came);
`event_payloads` reads each of the whole events the relay hands on (an HTTP upstream's
answer going out over a client's WebSocket, one event a frame). Nothing writes SSE to
read it back: an upstream WebSocket's frames are relayed as frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_BOM = "\ufeff".encode()


@dataclass(frozen=True, slots=True)
class Event:
    data: str
    type: str = "message"
    id: str = ""  # the last event id when it was dispatched (the spec's lastEventId)


def event_data(block: bytes) -> bytes | None:
    """The data of one event block (its lines, without the blank line that ends it):
    the `data` fields' values joined by LF; None when it has no `data` field (the spec
    dispatches nothing then). Its lines end in LF: the relay makes every CRLF and CR a
    LF before it cuts events (one scan of the block less per token)."""
    if b"\n" not in block:  # one line: most events (one slice, no other copy)
        if block.startswith(b"data: "):
            return block[6:]
        if block.startswith(b"data:"):
            return block[5:]
    data: bytes | None = None
    more: list[bytes] | None = None
    for line in block.splitlines():  # bytes.splitlines: CRLF, LF and CR only, as SSE
        if not line.startswith(b"data") or (len(line) > 4 and line[4] != 58):  # b":"
            continue
        value = line[6:] if line[5:6] == b" " else line[5:]
        if data is None:
            data = value
        elif more is None:
            more = [data, value]
        else:
            more.append(value)
    return b"\n".join(more) if more is not None else data


def event_payloads(events: bytes) -> list[bytes]:
    """The data of each event in `events`, whole events as the relay forwards them (each
    ended by its blank line, every line end a LF); an event without data is left out."""
    out = []
    for block in events.split(b"\n\n"):
        data = event_data(block)
        if data is not None:
            out.append(data)
    return out


@dataclass(slots=True)
class EventReader:
    """The events of a stream fed in chunks cut anywhere (`feed`, then `close`).

    `limit` bounds the bytes held for one unfinished line or event: past it, what was
    held is dropped (an upstream that never ends its event cannot grow the gateway's
    memory)."""

    limit: int = 1 << 20
    last_id: str = ""
    retry: int | None = None  # milliseconds, the last valid `retry` field
    _buffer: bytes = b""
    _started: bool = False
    _cr: bool = False  # the last chunk ended in CR: a LF opening the next one is its pair
    _data: list[str] = field(default_factory=list)
    _type: str = ""
    _held: int = 0
    _skip: bool = False  # the rest of an overlong line is dropped up to its end

    def feed(self, chunk: bytes) -> list[Event]:
        if self._cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._cr = False
        if self._skip:
            chunk = self._skipped(chunk)
        if not chunk:
            return []
        data = self._buffer + chunk if self._buffer else chunk
        if not self._started:
            if len(data) < len(_BOM) and _BOM.startswith(data):
                self._buffer = data  # maybe the BOM, cut
                return []
            self._started = True
            if data.startswith(_BOM):
                data = data[len(_BOM) :]
        lines = data.splitlines(keepends=True)
        self._buffer = b""
        if lines and not lines[-1].endswith((b"\n", b"\r")):
            self._buffer = lines.pop()  # a line without its end yet
            if len(self._buffer) > self.limit:
                self._buffer, self._skip = b"", True
                self._reset()
        if data.endswith(b"\r"):
            self._cr = True  # its LF may open the next chunk
        out: list[Event] = []
        for line in lines:
            event = self._line(line.rstrip(b"\r\n").decode("utf-8", "replace"))
            if event is not None:
                out.append(event)
        return out

    def _skipped(self, chunk: bytes) -> bytes:
        """What follows the end of the overlong line being dropped ("" if not in sight)."""
        ends = [at for at in (chunk.find(b"\n"), chunk.find(b"\r")) if at >= 0]
        if not ends:
            return b""
        self._skip = False
        cut = min(ends)
        if chunk[cut] == 13:  # CR: with the LF after it, if that is in this chunk too
            if cut + 1 == len(chunk):
                self._cr = True
            elif chunk[cut + 1] == 10:
                cut += 1
        return chunk[cut + 1 :]

    def close(self) -> list[Event]:
        """The end of the stream: an event without its blank line is discarded (spec)."""
        self._buffer, self._cr, self._skip = b"", False, False
        self._reset()
        return []

    def _line(self, line: str) -> Event | None:
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return None
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._held += len(value) + 1
            if self._held > self.limit:
                self._reset()
            else:
                self._data.append(value)
        elif name == "event":
            self._type = value
        elif name == "id":
            if "\0" not in value:
                self.last_id = value
        elif name == "retry":
            if value and value.isascii() and value.isdigit():
                self.retry = int(value)
        return None

    def _dispatch(self) -> Event | None:
        if not self._data:
            self._type = ""
            return None
        event = Event("\n".join(self._data), self._type or "message", self.last_id)
        self._reset()
        return event

    def _reset(self) -> None:
        self._data, self._type, self._held = [], "", 0


def parse(stream: bytes) -> list[Event]:
    """The events of a whole stream."""
    reader = EventReader(limit=len(stream) + 1)
    return reader.feed(stream) + reader.close()
