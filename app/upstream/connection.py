"""One HTTP/1.1 keep-alive connection to an upstream, on asyncio's Protocol API.

Why not a client library: in `make bench` a client library's CPU per proxied request
was several times this connection's, enough to make the upstream client a large share
of the gateway's CPU (the figures: deploy/BENCHMARKS.md, "Figures behind the design").
Parsing is httptools' (llhttp, the parser uvicorn serves with); what lives here is only
the exchange's state machine, one exchange at a time:

    send() ──► waiting for the head ──► body arriving ──► complete ──► back to the pool
                      │                      │                          (keep-alive)
                      └── error, timeout, EOF, cancel ──► connection closed

A `Response` is handed out at its head; its body is read whole (`read`) or as it
arrives (`chunks`). Past `BUFFER_LIMIT` unread bytes reading pauses, so a slow client
slows its upstream instead of growing the gateway's memory; whoever takes buffered bytes
(`read` as it goes, `chunks`) resumes it, and a connection going back to the pool is
always resumed first. The read timeout is the longest silence while an answer is owed
(paused reading is not silence); the total deadline bounds a whole non-streamed
exchange. Both share one lazily re-armed timer.

A head is bounded (`HEAD_LIMIT` bytes, `MAX_HEADERS` fields, interim 1xx heads
included): past either the answer is refused as a reset, so a header flood costs at most
one read's worth of memory. An answer to HEAD ends with its head whatever its
content-length says.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import cast

import httptools

from app.upstream.attempt import AttemptFailed, Reason

BUFFER_LIMIT = 256 * 1024
HEAD_LIMIT = 64 * 1024  # bytes of status line and headers (interim heads included)
MAX_HEADERS = 128  # fields in one head; aiohttp's default too
_NO_BODY = frozenset({204, 304})


def _reset(detail: str) -> AttemptFailed:
    return AttemptFailed(Reason.RESET, retryable=True, detail=detail)


class Response:
    """One exchange's answer; whoever receives it must `close()` it (or read it whole)."""

    __slots__ = (
        "_body",
        "_buffered",
        "_conn",
        "_error",
        "_head",
        "_waiter",
        "complete",
        "headers",
        "status",
    )

    def __init__(self, conn: Connection, head: asyncio.Future[None]) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False
        self._conn = conn
        self._head = head
        self._body: list[bytes] = []
        self._buffered = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- caller side ---------------------------------------------------------------------
    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool when it was complete.

        Buffered parts are taken as they come: taking is what resumes a paused reading,
        so waiting for the end with the buffer full would wait forever."""
        parts: list[bytes] = []
        try:
            while True:
                if self._body:
                    parts.append(self._take())
                if self.complete:
                    return parts[0] if len(parts) == 1 else b"".join(parts)
                await self._next()
        finally:
            self._conn.release(self)

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            if self._body:
                yield self._take()
            elif self.complete:
                return
            else:
                await self._next()

    async def close(self) -> None:
        self._conn.release(self)

    def _take(self) -> bytes:
        body = self._body
        data = body[0] if len(body) == 1 else b"".join(body)
        self._body, self._buffered = [], 0
        self._conn.resume()
        return data

    async def _next(self) -> None:
        if self._error is not None:
            raise self._error
        waiter = self._waiter = self._conn.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None and not self._body:
            raise self._error

    # -- connection side -------------------------------------------------------------------
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _got_head(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers
        if not self._head.done():
            self._head.set_result(None)

    def _got_body(self, data: bytes) -> bool:
        """Buffer `data`; True when the reader is far enough behind to pause reading."""
        self._body.append(data)
        self._buffered += len(data)
        self._wake()
        return self._buffered > BUFFER_LIMIT

    def _got_end(self) -> None:
        self.complete = True
        self._wake()

    def _failed(self, exc: BaseException) -> None:
        if self.complete or self._error is not None:
            return
        self._error = exc
        if not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # delivered by `send`; never "unretrieved" if it is gone
        self._wake()


class Connection(asyncio.Protocol):
    """The protocol of one upstream socket; `Pool` creates, lends and retires these."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_idle: Callable[[Connection], None],
        on_lost: Callable[[Connection], None],
    ) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.exchanges = 0
        self._on_idle = on_idle
        self._on_lost = on_lost
        self._parser = httptools.HttpResponseParser(self)
        self._response: Response | None = None
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._head_only = False
        self._keep_alive = False
        self._until_eof = False
        self._paused = False
        self._got_bytes = False
        self._read_timeout = 0.0
        self._deadline: float | None = None
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None

    @property
    def answered(self) -> bool:
        """Whether any byte of the current answer arrived (a retry could duplicate work)."""
        return self._got_bytes

    # -- the exchange --------------------------------------------------------------------
    async def send(
        self, data: bytes, read_timeout: float, deadline: float | None, *, head_only: bool = False
    ) -> Response:
        """Write one request and wait for its head; on any failure the socket is closed.
        `head_only`: the request was HEAD, so its answer has no body."""
        assert self.transport is not None and self._response is None
        head: asyncio.Future[None] = self.loop.create_future()
        response = self._response = Response(self, head)
        self._raw_headers = []
        self._head_bytes = 0
        self._head_only = head_only
        self._got_bytes = False
        self._keep_alive = False
        self.exchanges += 1
        self.transport.write(data)
        self._read_timeout, self._deadline = read_timeout, deadline
        self._last_read = now = self.loop.time()
        self._timer = self.loop.call_at(_first_due(now, read_timeout, deadline), self._on_timer)
        try:
            await head
        except BaseException:
            self.close()
            raise
        return response

    def release(self, response: Response) -> None:
        """The caller is done with `response`: reuse the socket if the exchange ended
        cleanly, else close it (an unread answer must not reach the next caller, and a
        closed socket is how the upstream learns its answer is no longer wanted)."""
        if self._response is not response:
            return
        self._response = None
        self._cancel_timer()
        if response.complete and self._keep_alive and not self.closed:
            # Reading may have paused on bytes the caller never took (a client that left
            # at the end of a stream): the next exchange must find the socket read.
            self.resume()
            self.idle_since = self.loop.time()
            self._on_idle(self)
        else:
            self.close()

    def close(self) -> None:
        if self._response is not None:
            self._response._failed(_reset("connection closed"))
        self._cancel_timer()
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self._last_read = self.loop.time()
            self.transport.resume_reading()

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._response is None or self._response.complete:
            self.close()  # bytes nobody asked for: this socket can no longer be trusted
            return
        self._got_bytes = True
        self._last_read = self.loop.time()
        in_head = not self._response._head.done()
        if in_head:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            own = exc.__context__  # raised by a callback of ours (a head limit)
            if isinstance(own, AttemptFailed):
                self._fail(own)
            else:
                self._fail(_reset(f"malformed upstream response ({type(exc).__name__})"))
            return
        if in_head and self._head_bytes > HEAD_LIMIT and not self._response._head.done():
            self._fail(_reset(f"upstream response head over {HEAD_LIMIT} bytes"))

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        response = self._response
        if response is not None and not response.complete:
            ended = exc is None and response._error is None  # not closed by a failure of ours
            if self._until_eof and response._head.done() and ended:
                response._got_end()  # a body delimited by the end of the connection
            else:
                response._failed(_reset("the upstream closed the connection"))
        self._on_lost(self)

    # -- httptools callbacks ---------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))
        if len(self._raw_headers) > MAX_HEADERS:
            raise _reset(f"upstream response head over {MAX_HEADERS} fields")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            self._raw_headers = []  # an interim answer; the final head follows
            return
        headers: dict[str, str] = {}
        for raw_name, raw_value in self._raw_headers:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self._until_eof = status not in _NO_BODY and not (
            self._head_only or "content-length" in headers or "transfer-encoding" in headers
        )
        if self._response is None or self._response.complete:
            self._fail(_reset("an answer nobody asked for"))
            return
        self._response._got_head(status, headers)
        if self._head_only:
            # llhttp would wait for the content-length the head announces: end the answer
            # here and give the next exchange a parser that expects a new head.
            self._end(self._parser.should_keep_alive())
            self._parser = httptools.HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        response = self._response
        if response is None or response.complete or response._error is not None:
            # The parser runs on through a buffer this connection already gave up, or
            # past the end of a HEAD answer: bytes nobody asked for.
            self._keep_alive = False
            return
        if response._got_body(body) and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        response = self._response
        if response is None or response.complete or response._error is not None:
            return  # the parser runs on past an end already taken (HEAD) or a failure
        if 100 <= self._parser.get_status_code() < 200:
            return
        self._end(self._parser.should_keep_alive() and not self._until_eof)

    def _end(self, keep_alive: bool) -> None:
        self._keep_alive = keep_alive
        self._cancel_timer()
        assert self._response is not None
        self._response._got_end()

    # -- timeouts ----------------------------------------------------------------------------
    def _on_timer(self) -> None:
        self._timer = None
        response = self._response
        if response is None or response.complete or self.closed:
            return
        now = self.loop.time()
        # Paused reading is the gateway waiting on its client, not upstream silence.
        due = (now if self._paused else self._last_read) + self._read_timeout
        if self._deadline is not None:
            due = min(due, self._deadline)
        if now >= due:
            self._fail(AttemptFailed(Reason.TIMEOUT, retryable=True, detail="no answer in time"))
            return
        self._timer = self.loop.call_at(due, self._on_timer)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, exc: AttemptFailed) -> None:
        if self._response is not None:
            self._response._failed(exc)
        self.close()


def _first_due(now: float, read_timeout: float, deadline: float | None) -> float:
    due = now + read_timeout
    return due if deadline is None else min(due, deadline)
