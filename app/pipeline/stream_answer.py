"""A streamed answer: `StreamAnswer` and the SSE body it relays (`SseBody`).

A `StreamAnswer` owns its dispatch slot, its rate-limit ticket and the upstream
response until its body ends, however it ends:

- upstream finished: usage from the stream (the gateway asked for it if the client
  did not), the slot is freed, the reservation settled to that usage;
- upstream broke off mid-stream: the client gets an OpenAI-style error event and the
  key is charged what was streamed (upstream usage if it came, else an estimate);
- client went away (the task is cancelled): the upstream request is closed at once,
  and the key is charged what was streamed.

Settling and the access log are the pipeline's: a stream is handed its `finish` (and
the metrics and clock it reports with), so this module knows nothing of the pipeline.

Two ways out. `body` is the SSE stream of an HTTP answer (the hot path: events relayed
as the upstream's reads cut them), here and compiled in the compiled build. `frames` is
the frame mode of a client's Responses WebSocket (`app.pipeline.answer.frames`, an async
generator, interpreted). Both end alike: the request is settled before its last bytes go
out, and a stream cut before its end is ended by the gateway (an error event, or
`response.failed`) and charged what was streamed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from app.billing.spend import SpendGate
from app.dispatch.dispatcher import Slot
from app.dispatch.domain import Domain
from app.limits.admission import Ticket
from app.metrics import Metrics
from app.pipeline.replies import Reply
from app.pipeline.request import ClientRequest
from app.pipeline.trace import Trace
from app.upstream.attempt import AttemptFailed
from app.upstream.streaming import SseRelay, error_event, failed_event
from app.upstream.turns import failed_frame


class Finish(Protocol):
    """Settle the request's reservation and log it, exactly once; `failed` is the
    (prompt, completion) tokens of an interrupted stream."""

    def __call__(self, status: int, *, failed: tuple[int, int]) -> object: ...


class StreamAnswer:
    status = 200
    content_type = "text/event-stream"

    def __init__(
        self,
        call: ClientRequest,
        trace: Trace,
        ticket: Ticket,
        reply: Reply,
        slot: Slot,
        domain: Domain,
        *,
        finish: Finish,
        metrics: Metrics,
        clock: Callable[[], float],
    ) -> None:
        self._finish_request = finish
        self._metrics = metrics
        self._clock = clock
        self._call = call
        self._trace = trace
        self._ticket = ticket
        self._reply = reply
        self._slot = slot
        self._domain = domain
        self.relay = SseRelay(strip_usage_chunk=call.strip_usage)
        self.headers = {
            **ticket.headers(),
            "x-tokengate-domain": domain.name,
            "cache-control": "no-cache",
        }
        self._finished = False
        self._ttft_done = False
        self._tell = call.on_response  # told the response id once the stream names it
        self.ending = False  # set as the last chunk is handed on: the answer ends with it

    def body(self) -> SseBody:
        """The events to relay (`SseBody`). The last chunk comes with `ending` set: bytes
        that arrived together with the end of the upstream body are held (no wait: the end
        is already known) and go out with the end of the answer, in one write."""
        return SseBody(self)

    def _failed_frame(self, message: str) -> bytes:
        relay = self.relay
        return failed_frame(message, "stream_interrupted", relay.response_id, relay.events)

    def _error_event(self, message: str) -> bytes:
        endpoint = self._call.endpoint
        if endpoint.responses:
            relay = self.relay
            return failed_event(message, "stream_interrupted", relay.response_id, relay.events)
        return error_event(message, "stream_interrupted", anthropic=endpoint.anthropic)

    async def _told(self) -> None:
        """The id is recorded before the event naming it is relayed."""
        tell = self._tell
        if self.relay.response_id is not None and tell is not None:
            self._tell = None
            await tell(self.relay.response_id, self._domain.name)

    def _ttft(self) -> None:
        if self.relay.saw_content and not self._ttft_done:
            self._ttft_done = True
            seconds = self._clock() - self._trace.started
            model = self.relay.model or self._trace.attempts[-1].model
            self._metrics.record_ttft(self._domain.name, model, seconds)

    async def _ended(self, outcome: str | None) -> None:
        """The upstream's body ended (`outcome`: how, if badly): settled, and the budgets'
        hold released in Redis, before the end of the answer reaches the client, so that
        its next request never meets this one's hold."""
        self._ttft()
        await self._close(200 if outcome is None else 502, outcome)
        if self._ticket.hold is not None:
            await SpendGate.released(self._ticket.hold)

    async def _close(self, status: int, outcome: str | None) -> None:
        if self._finished:
            return
        self._finished = True
        self._slot.release()
        try:
            await self._reply.response.close()
        finally:
            self._settle(status, outcome)

    def _settle(self, status: int, outcome: str | None) -> None:
        relay, trace = self.relay, self._trace
        trace.model = relay.model or trace.attempts[-1].model
        trace.service_tier = relay.tier
        prompt = (
            relay.prompt_tokens if relay.prompt_tokens is not None else self._call.prompt_tokens
        )
        if relay.has_usage:
            completion = relay.completion_tokens or 0
        else:
            completion, trace.estimated = relay.completion_estimate(), True
        failed = (0, 0)
        trace.cached_tokens, trace.cache_write_tokens = (
            relay.cached_tokens,
            relay.cache_write_tokens,
        )
        if outcome is None:
            trace.prompt_tokens, trace.completion_tokens = prompt, completion
        else:
            self._metrics.record_stream_error(self._domain.name, outcome)
            failed = (prompt, completion)
        if outcome is not None and outcome != "client_closed":
            trace.error = "stream_interrupted"
        self._finish_request(status, failed=failed)

    async def aclose(self) -> None:
        """Called if the body was never iterated (the client left before the first byte)."""
        await self._close(499, "client_closed")


class SseBody:
    """`StreamAnswer.body`: the SSE stream of an HTTP answer, as an iterator object rather
    than an async generator, which the compiled build cannot compile (each event of every
    stream passes here: deploy/BENCHMARKS.md, issue #32's sixth pass).

    However it ends, the request is settled once: the upstream's end (or a broken or
    truncated stream, ended with an error event) settles it before the last chunk goes
    out; anything raised on the way (the client gone: the task cancelled) settles it as
    `client_closed` and is raised on; a client gone between chunks is settled by the
    answer's `aclose`, which its response calls whatever happens."""

    def __init__(self, answer: StreamAnswer) -> None:
        self._answer = answer
        self._relay = answer.relay
        self._response = answer._reply.response
        self._first: bytes | None = answer._reply.first
        self._rest = answer._reply.rest
        self._held = b""  # what arrived with the end of the upstream body
        self._outcome: str | None = None  # how the upstream's stream ended, if badly
        self._done = False

    def __aiter__(self) -> SseBody:
        return self

    async def __anext__(self) -> bytes:
        # One coroutine per event, its steps written out: each further call (a helper
        # coroutine per read) costs the source more per event than the async generator
        # did (the cost guard's chat_stream_event).
        if self._done:
            raise StopAsyncIteration
        answer, relay, response = self._answer, self._relay, self._response
        try:
            try:
                first = self._first
                if first is not None:
                    self._first = None
                    out = relay.feed(first)
                    if answer._tell is not None:
                        await answer._told()
                    if response.complete:
                        self._held = out
                    elif out:
                        answer._ttft()
                        return out
                rest = self._rest
                assert rest is not None
                while True:
                    try:
                        chunk = await rest.__anext__()
                    except StopAsyncIteration:
                        break
                    out = relay.feed(chunk)
                    if answer._tell is not None:
                        await answer._told()
                    if response.complete:
                        self._held += out
                    elif out:
                        if not answer._ttft_done:
                            answer._ttft()
                        return out
                self._held += relay.finish()
                if not relay.done and not relay.has_usage:
                    self._outcome = "truncated"
                    self._held += answer._error_event("the upstream closed the stream early")
            except AttemptFailed as failure:
                self._outcome = failure.reason
                broke = f"the upstream stream broke off ({failure.reason})"
                self._held += answer._error_event(broke)
            self._done = True
            await answer._ended(self._outcome)
            answer.ending = True
            return self._held
        except BaseException:
            self._done = True
            await answer._close(499, "client_closed")
            raise
