"""The one SSE parser (`app/upstream/sse.py`) against the WHATWG standard's examples
(HTML §9.2.6) and, with hypothesis, against streams written from random events with
random line ends, comments, optional spaces and chunk cuts. The relay's `event_data`
must answer what the full parser answers for every event block."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.upstream.sse import Event, EventReader, event_data, event_payloads, parse

# The standard's examples, verbatim.
STOCKS = b"data: YHOO\ndata: +2\ndata: 10\n\n"
FOUR = b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n"
EMPTY = b"data\n\ndata\ndata\n\ndata:"
SPACE = b"data:test\n\ndata: test\n\n"


def test_the_standards_examples() -> None:
    assert parse(STOCKS) == [Event("YHOO\n+2\n10")]
    # the third event has no blank line after it: at the end of the stream it is dropped
    assert parse(FOUR) == [Event("first event", id="1"), Event("second event", id="")]
    assert parse(FOUR + b"\n")[2] == Event(" third event")  # one space only is stripped
    assert parse(EMPTY) == [Event(""), Event("\n")]
    assert parse(SPACE) == [Event("test"), Event("test")]


def test_event_types_ids_retry_bom_and_unknown_fields() -> None:
    stream = (
        b"\xef\xbb\xbfevent: add\nid: 7\nretry: 150\nfoo: bar\ndata: x\n\nretry: 1s\ndata: y\n\n"
    )
    reader = EventReader()
    assert reader.feed(stream) == [Event("x", "add", "7"), Event("y", "message", "7")]
    assert reader.retry == 150  # "1s" is not all digits: ignored
    assert parse(b"event: ping\n\n") == []  # no data: nothing dispatched
    assert parse(b"id: a\x00b\ndata: z\n\n") == [Event("z")]  # an id with NUL is ignored


@pytest.mark.parametrize(
    ("block", "data"),
    [
        (b"data: {}", b"{}"),
        (b"data:{}", b"{}"),
        (b"data:  {}", b" {}"),
        (b"event: response.completed\ndata: {}", b"{}"),
        (b"data: a\ndata: b", b"a\nb"),
        (b"data: a\ndata: b\ndata: c", b"a\nb\nc"),
        (b": keep-alive", None),
        (b"event: ping", None),
        (b"data", b""),
        (b"datum: x", None),
        (b"data: [DONE]", b"[DONE]"),
    ],
)
def test_event_data_of_one_block(block: bytes, data: bytes | None) -> None:
    assert event_data(block) == data


def test_an_overlong_line_is_dropped_whole_not_parsed_from_its_middle() -> None:
    reader = EventReader(limit=16)
    assert reader.feed(b"data: " + b"x" * 40) == []
    assert reader.feed(b"data: injected\n\ndata: ok\n\n") == [Event("ok")]


def test_a_cr_inside_a_chunk_does_not_swallow_the_next_chunks_lf() -> None:
    """Only a CR that ends a chunk may pair with a LF opening the next (found by the
    chunk-cut property below)."""
    reader = EventReader()
    assert reader.feed(b"data: a\rda") == []
    assert reader.feed(b"\n\n") == [Event("a")]


# Values of fields: any text without a line end (the standard's "any char" less CR, LF).
_VALUE = st.text(st.characters(exclude_characters="\r\n", exclude_categories=["Cs"]))
_NAME = _VALUE.filter(lambda v: ":" not in v and v != "")
_EOL = st.sampled_from(["\n", "\r", "\r\n"])


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[Event]]:
    """A stream written from random events, and the events a reader must find in it."""
    out: list[str] = []
    events: list[Event] = []
    last_id = ""
    for _ in range(draw(st.integers(0, 5))):
        lines = draw(st.lists(_VALUE, min_size=1, max_size=4))
        kind = draw(st.none() | _NAME)
        ident = draw(st.none() | _VALUE.filter(lambda v: "\0" not in v))
        fields: list[str] = []
        if draw(st.booleans()):
            fields.append(":" + draw(_VALUE))  # a comment
        if kind is not None:
            fields.append(f"event: {kind}")
        for line in lines:
            space = " " if line.startswith(" ") or draw(st.booleans()) else ""
            fields.append(f"data:{space}{line}")
        if ident is not None:
            fields.append(f"id: {ident}")
            last_id = ident
        eols = [draw(_EOL) for _ in range(len(fields) + 1)]
        for i in range(1, len(eols)):  # a CR then a LF would be one CRLF: one line end
            if eols[i - 1] == "\r" and eols[i] == "\n":
                eols[i] = "\r"
        out.append("".join(f + e for f, e in zip(fields, eols, strict=False)) + eols[-1])
        events.append(Event("\n".join(lines), kind or "message", last_id))
    return "".join(out).encode(), events


@given(streams())
def test_a_written_stream_reads_back(case: tuple[bytes, list[Event]]) -> None:
    stream, events = case
    assert parse(stream) == events


@given(streams(), st.lists(st.integers(0, 10_000), max_size=8))
def test_where_the_chunks_are_cut_changes_nothing(
    case: tuple[bytes, list[Event]], cuts: list[int]
) -> None:
    stream, events = case
    reader = EventReader()
    got: list[Event] = []
    start = 0
    for cut in [*sorted({c % (len(stream) + 1) for c in cuts}), len(stream)]:
        got += reader.feed(stream[start:cut])
        start = cut
    assert got + reader.close() == events


@given(streams())
def test_the_relays_reading_agrees_with_the_parser(case: tuple[bytes, list[Event]]) -> None:
    """The relay cuts at blank lines after CRLF became LF; each block's data is what
    the full parser dispatched for it (`event_payloads`: the events it hands on, one a
    WebSocket frame)."""
    stream, events = case
    found = event_payloads(stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n"))
    assert [d.decode() for d in found] == [e.data for e in events]
