"""The Responses API's WebSocket mode, one connection: `response.create` in, events out.

As Codex CLI and OpenAI's docs use it (research: docs/contract.md, docs/agents.md "Responses
API"): every client message is a JSON text frame; a `response.create` carries the body of
a `POST /v1/responses` (without `stream`, which is implied) and is answered with the
same events an SSE stream has, one per text frame, ending with `response.completed`,
`response.incomplete` or `response.failed`. Requests on one connection are served one
after the other.

    every message ─► the key again (no longer valid: an error event, then the end of the
          │          connection); at most server.max_body_bytes, conversation included
    response.create ─► generate: false ─► an id, nothing generated upstream; admitted
          │               and charged one request, no tokens (a warm-up: later requests
          │               may continue from it)
          └► previous_response_id known to this connection?
               yes: input = its input + its output items + the new items (the upstream is
                    stateless HTTP, so the whole conversation is sent; `store: false`
                    works, as OpenAI's connection-local cache makes it work)
               no:  passed on as it came (a stored response: pinned to its domain)
             └► one request through the pipeline (limits, queue, retries before the first
                byte, fallback, metrics, ledger, access log), streamed back one event a
                frame (`app.pipeline.answer.frames`); a domain with `responses_websocket` gets it
                over this connection's own upstream socket, as only the items its
                upstream does not hold yet (`app/upstream/websocket.py`), and its frames
                come back as the upstream sent them

A refusal before the stream starts (rate limit, queue full, upstream 4xx...) is an error
event with the HTTP status the same request would have got: `{"type": "error", "status":
429, "error": {...}, "headers": {"retry-after": ...}}` (Codex acts on `status` and
`headers`; an error event without `status` it would ignore until its idle timeout).

Per connection the session keeps the last few responses (`websocket_cached_responses`),
each a `Turn` (`app/upstream/turns.py`, the model the upstream socket keeps too):
their input and output item lists share the items of the ones before, so the memory of
a connection grows with its conversation, not with the number of its turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from app.errors import (
    AuthenticationFailed,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    RateLimited,
    UpstreamRejected,
)
from app.metrics import Metrics
from app.pipeline.answer import StreamAnswer, frames
from app.pipeline.request import RESPONSES_SOCKET
from app.pipeline.responses_api import ResponsesService
from app.pipeline.wire import parse_call
from app.runtime import KeySpec
from app.upstream.turns import Recorder, Turn, failed_frame
from app.upstream.websocket import UpstreamSockets

Send = Callable[[str], Awaitable[None]]
# Client events that need no answer (Codex's acknowledgement, behind a feature flag).
_QUIET = frozenset({"response.processed"})
# Fields of `response.create` that are the socket's, not a Responses API body's.
_SOCKET_ONLY = ("type", "generate", "stream_id")


class SocketSession:
    """`authenticate` is asked again for every message, so a key that expires, or is
    removed by a reload, stops working on a connection opened before (`handle` says the
    connection must end). Every message is at most `max_body`, and so is the conversation
    it continues; a warm-up is admitted and charged a request like any other."""

    def __init__(
        self,
        service: ResponsesService,
        authenticate: Callable[[], KeySpec],
        headers: Mapping[str, str],
        metrics: Metrics,
        *,
        cached: int,
        max_body: int,
        new_request_id: Callable[[], str],
        sockets: UpstreamSockets | None = None,
        clock: Callable[[], float] = time.perf_counter,
        session_header: str | None = None,
        max_wait: float = 0.0,
    ) -> None:
        self.max_wait = max_wait  # how long a turn may wait for its key's limit to free
        self.session_header = session_header  # the upgrade's agent session id, if any
        self.service = service
        self.sockets = sockets
        self.authenticate = authenticate
        self.max_body = max_body
        self.headers = headers
        self.metrics = metrics
        self.turns: OrderedDict[str, Turn] = OrderedDict()
        self.cached = cached
        self.new_request_id = new_request_id
        self.clock = clock
        self.busy = False  # a message is being answered (the connection is not idle)
        self.kept_bytes = 0  # the sizes of `turns`

    async def handle(self, text: str, send: Send) -> bool:
        """Answer one client message (all its events are sent before this returns);
        False: the key is no longer valid, and the connection must end."""
        started = self.clock()
        self.busy = True
        try:
            try:
                key = self.authenticate()  # every message, of every kind
            except AuthenticationFailed as exc:
                self.metrics.record_socket_message("refused")
                await send(_error_frame(exc))
                return False
            try:
                await self._answer(key, text, started, send)
            except GatewayError as exc:
                self.metrics.record_socket_message("refused")
                await send(_error_frame(exc))
            return True
        finally:
            self.busy = False

    async def _answer(self, key: KeySpec, text: str, started: float, send: Send) -> None:
        if len(text) > self.max_body:  # a reload may have lowered it below ws_max_size
            raise self._too_large(len(text))
        message = _message(text)
        kind = message.get("type")
        if kind in _QUIET:
            self.metrics.record_socket_message("ignored")
            return
        if kind != "response.create":
            raise InvalidRequest(
                f"unsupported event type {str(kind)[:64]!r}; send 'response.create'",
                param="type",
                code="unknown_event_type",
            )
        if message.get("background") is True:
            raise InvalidRequest(
                "background responses are not supported in WebSocket mode",
                param="background",
            )
        body, items = self._body(message)
        # The whole conversation, as the upstream would get it: what a warm-up makes the
        # connection keep, so it is bounded like a request body.
        raw = orjson.dumps(body)
        if len(raw) > self.max_body:
            raise self._too_large(len(raw))
        if message.get("generate") is False:
            self.metrics.record_socket_message("warmup")
            await self.service.warm_up(key, body.get("model"), self.new_request_id())
            await self._warm_up(body, items, len(raw), send)
            return
        self.metrics.record_socket_message("create")
        await self._create(key, raw, items, started, send)

    def _too_large(self, size: int) -> PayloadTooLarge:
        """What the same request over HTTP would get."""
        return PayloadTooLarge(
            f"the conversation is {size} bytes, over the gateway's limit of "
            f"{self.max_body} bytes (server.max_body_bytes)",
            should_retry=False,
        )

    async def close(self) -> None:
        """The client connection ended: its upstream sockets end with it."""
        if self.sockets is not None:
            await self.sockets.close()

    def _body(self, message: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        """The HTTP body of a `response.create`, with the conversation expanded when it
        continues a response of this connection; and that whole input."""
        body = {k: v for k, v in message.items() if k not in _SOCKET_ONLY}
        items = _items(body.get("input"))
        previous = body.get("previous_response_id")
        turn = self.turns.get(previous) if isinstance(previous, str) else None
        if turn is not None:
            items = [*turn.items, *turn.output, *items]
            del body["previous_response_id"]
        body["input"] = items
        body["stream"] = True
        return body, items

    def _keep(self, turn: Turn) -> None:
        """The latest turn always; older ones while they are at most `cached`, and their
        sizes add up to at most `max_body` (turns of one conversation share their items,
        but turns of different branches do not: this bounds the items a connection holds
        to one request body's worth)."""
        self.turns[turn.response_id] = turn
        self.kept_bytes += turn.size
        while len(self.turns) > 1 and (
            len(self.turns) > self.cached or self.kept_bytes > self.max_body
        ):
            _, dropped = self.turns.popitem(last=False)
            self.kept_bytes -= dropped.size

    async def _warm_up(self, body: dict[str, Any], items: list[Any], size: int, send: Send) -> None:
        """`generate: false`: nothing goes upstream; the id lets the next request send only
        what is new."""
        response_id = f"resp_{uuid.uuid4().hex}"
        self._keep(Turn(response_id, items, [], size))
        response: dict[str, Any] = {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "model": body.get("model"),
            "output": [],
            "usage": None,
        }
        await send(_frame({"type": "response.created", "response": response, "sequence_number": 0}))
        done = {**response, "status": "completed"}
        await send(_frame({"type": "response.completed", "response": done, "sequence_number": 1}))

    async def _admitted(self, raw: bytes, key: KeySpec, started: float) -> StreamAnswer:
        """The turn's answer, once the pipeline takes it. A 429 of the key's own limits
        before any output is waited out when its `Retry-After` falls within the queue
        wait (`max_queue_wait_ms`, from the turn's start), as a queued request would
        be: Codex would otherwise fail the turn. Upstream 429s are queued again by the
        pipeline itself."""
        while True:
            call = parse_call(
                RESPONSES_SOCKET, raw, key, self.new_request_id(), self.headers, started
            )
            call.sockets = self.sockets
            call.session_header = self.session_header
            try:
                answer = await self.service.create(call)
            except RateLimited as exc:
                wait = exc.retry_after
                if wait is None or self.clock() + wait > started + self.max_wait:
                    raise
                self.metrics.record_socket_message("waited")
                await asyncio.sleep(wait)
                continue
            if not isinstance(answer, StreamAnswer):  # stream is always set: a bug if not
                raise InvalidRequest("the upstream did not stream the response")
            return answer

    async def _create(
        self, key: KeySpec, raw: bytes, items: list[Any], started: float, send: Send
    ) -> None:
        answer = await self._admitted(raw, key, started)
        turn = Recorder(items, len(raw))
        try:
            async for frame in frames(answer):  # one event's JSON each, as it came
                turn.see(frame)
                await send(frame.decode("utf-8", "replace"))
        except BaseException:
            if not turn.ended:  # the turn must still end with a terminal event
                await _failed(send, "the gateway stopped this response before it ended", turn)
            raise
        finally:
            await answer.aclose()  # settles as a client disconnect if the body did not end
        if not turn.ended:
            await _failed(send, "the response stream ended before its terminal event", turn)
        done = turn.turn()
        if done is not None:
            self._keep(done)


async def _failed(send: Send, message: str, turn: Recorder) -> None:
    """`response.failed` for a turn that could not end otherwise (best effort: the
    client may be gone, and a drain that cancels the turn must not wait on it)."""
    frame = failed_frame(message, "stream_interrupted", None, turn.events).decode()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        async with asyncio.timeout(1.0):
            await send(frame)


def _message(text: str) -> dict[str, Any]:
    try:
        message = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise InvalidRequest("the message is not valid JSON", code="invalid_json") from None
    if not isinstance(message, dict):
        raise InvalidRequest("the message must be a JSON object", code="invalid_json")
    return message


def _items(value: Any) -> list[Any]:
    """`input` as a list of items (a string is one user message)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return value
    raise InvalidRequest(
        "'input' must be a string or an array of input items", param="input", code="invalid_type"
    )


def _frame(event: dict[str, Any]) -> str:
    return orjson.dumps(event).decode()


def _error_frame(exc: GatewayError) -> str:
    """OpenAI's WebSocket error event, with the status and headers of the HTTP answer the
    same request would have had."""
    error: Any = exc.body()["error"]
    if isinstance(exc, UpstreamRejected):
        try:
            relayed = orjson.loads(exc.raw_body)
        except orjson.JSONDecodeError:
            relayed = None
        if isinstance(relayed, dict) and isinstance(relayed.get("error"), dict):
            error = relayed["error"]
    frame = {
        "type": "error",
        "status": exc.status,
        "error": error,
        "headers": exc.response_headers(),
    }
    return orjson.dumps(frame).decode()
