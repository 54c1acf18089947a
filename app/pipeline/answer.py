"""What the pipeline hands back to a route: a JSON body, or a stream that settles itself.

A `StreamAnswer` owns its dispatch slot, its rate-limit ticket and the upstream
response until its body iterator ends, however it ends:

- upstream finished: usage from the stream (the gateway asked for it if the client
  did not), the slot is freed, the reservation settled to that usage;
- upstream broke off mid-stream: the client gets an OpenAI-style error event and the
  key is charged what was streamed (upstream usage if it came, else an estimate);
- client went away (the task is cancelled): the upstream request is closed at once,
  and the key is charged what was streamed.

Settling and the access log are the pipeline's: a stream is handed its `finish` (and
the metrics and clock it reports with), so this module knows nothing of the pipeline.

Two ways out. `body` is the SSE stream of an HTTP answer (the hot path: events relayed
as the upstream's reads cut them). `frames` is the frame mode of a client's Responses
WebSocket: one event's JSON per item. An upstream socket's frames pass through it as
they came, each read directly for usage, the first token and the end of the response
(`FrameReader`), with no SSE on the way; an HTTP upstream's SSE events are cut by the
relay and handed on by their data. Both end alike: the request is settled before its
last bytes go out, and a stream cut before its end is ended by the gateway (an error
event, or `response.failed`) and charged what was streamed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol

from app.billing.spend import SpendGate
from app.dispatch.dispatcher import Slot
from app.dispatch.domain import Domain
from app.limits.admission import Ticket
from app.metrics import Metrics
from app.pipeline.replies import JsonAnswer, Reply
from app.pipeline.request import ClientRequest
from app.pipeline.trace import Trace
from app.upstream.attempt import AttemptFailed
from app.upstream.sse import event_payloads
from app.upstream.streaming import FrameReader, SseRelay, error_event, failed_event
from app.upstream.turns import failed_frame
from app.upstream.websocket import SocketAnswer


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
        self.ending = False  # set as the last chunk is yielded: the answer ends with it

    async def body(self) -> AsyncIterator[bytes]:
        """The events to relay. The last chunk is yielded with `ending` set: bytes that
        arrived together with the end of the upstream body are held (no wait: the end is
        already known) and go out with the end of the answer, in one write."""
        relay, status, outcome = self.relay, 200, None
        response = self._reply.response
        held = b""
        try:
            try:
                out = relay.feed(self._reply.first)
                if self._tell is not None:
                    await self._told()
                if response.complete:
                    held = out
                elif out:
                    self._ttft()
                    yield out
                assert self._reply.rest is not None
                async for chunk in self._reply.rest:
                    out = relay.feed(chunk)
                    if self._tell is not None:
                        await self._told()
                    if response.complete:
                        held += out
                    elif out:
                        if not self._ttft_done:
                            self._ttft()
                        yield out
                held += relay.finish()
                if not relay.done and not relay.has_usage:
                    outcome = "truncated"
                    held += self._error_event("the upstream closed the stream early")
            except AttemptFailed as failure:
                outcome = failure.reason
                held += self._error_event(f"the upstream stream broke off ({failure.reason})")
            self._ttft()
            # settled (and the budgets' hold released in Redis) before the end of the
            # answer reaches the client: its next request never meets this one's hold
            await self._close(200 if outcome is None else 502, outcome)
            if self._ticket.hold is not None:
                await SpendGate.released(self._ticket.hold)
            self.ending = True
            yield held
        except BaseException:
            status, outcome = 499, "client_closed"
            raise
        finally:
            await self._close(status if outcome in (None, "client_closed") else 502, outcome)

    async def frames(self) -> AsyncIterator[bytes]:
        """The answer for a client's WebSocket, one event's JSON per item (frame mode):
        an upstream socket's frames as they came, an HTTP upstream's SSE events by their
        data. Frames that arrive with the end of the response wait until the request is
        settled; a response cut before its terminal event ends with `response.failed`."""
        response = self._reply.response
        reader = FrameReader() if isinstance(response, SocketAnswer) else None
        if reader is not None:
            self.relay = reader
        relay, status, outcome = self.relay, 200, None
        held: list[bytes] = []
        try:
            try:
                chunk: bytes | None = self._reply.first
                assert self._reply.rest is not None
                while chunk is not None:
                    if reader is not None:
                        reader.see(chunk)
                        events = [chunk]
                    else:
                        events = event_payloads(relay.feed(chunk))
                    if self._tell is not None:
                        await self._told()
                    if response.complete:
                        held += events
                    elif events:
                        self._ttft()
                        for event in events:
                            yield event
                    chunk = await anext(self._reply.rest, None)
                held += event_payloads(relay.finish())
                if not relay.done and not relay.has_usage:
                    outcome = "truncated"
                    held.append(self._failed_frame("the upstream closed the stream early"))
            except AttemptFailed as failure:
                outcome = failure.reason
                held.append(self._failed_frame(f"the upstream stream broke off ({failure.reason})"))
            self._ttft()
            await self._close(200 if outcome is None else 502, outcome)
            if self._ticket.hold is not None:
                await SpendGate.released(self._ticket.hold)
            for event in held:
                yield event
        except BaseException:
            status, outcome = 499, "client_closed"
            raise
        finally:
            await self._close(status if outcome in (None, "client_closed") else 502, outcome)

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


Answer = JsonAnswer | StreamAnswer
