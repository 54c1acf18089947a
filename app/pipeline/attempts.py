"""One model on one domain: a dispatch slot, then attempts with retries.

    Attempts.on_domain(call, model, domain, trace)
      dispatcher slot (queue, batch, pace)        503 queue_full/timeout
      └► attempts with retries (retry.py)         backoff, Retry-After, budget
         upstream 429 (throttled): pacer cools down, request back to the head of the
         queue, slot again, attempts again (no retry spent)
         upstream 429 insufficient_quota           429 at once
      └► (Reply, Slot): the slot stays held for a stream, until its end

Each attempt feeds the domain's breaker, latency and failure notes, the pacer (rate
headers the upstream advertised) and the attempt metrics; every attempt after a
request's first is a re-send, counted and logged with its cause.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from app.dispatch.dispatcher import Slot
from app.dispatch.domain import Domain
from app.limits.pacing import RateHeaders, Throttle, rate_headers
from app.metrics import Metrics
from app.pipeline.replies import Reply
from app.pipeline.request import ClientRequest
from app.pipeline.tiers import ServiceTiers
from app.pipeline.trace import Attempt, Trace
from app.tracing import AttemptSpan, RequestSpan
from app.upstream.answer_usage import parse_usage
from app.upstream.attempt import AttemptFailed, Reason, status_failure
from app.upstream.retry import RetrySpec, retry_after
from app.upstream.transport import UpstreamResponse
from app.upstream.websocket import SocketAnswer

# Attempt outcomes that feed neither the breaker nor a verdict on the upstream's health.
_NOT_A_VERDICT = frozenset({Reason.THROTTLED, Reason.INSUFFICIENT_QUOTA})
resend_log = logging.getLogger("tokengate.upstream")


class Attempts:
    def __init__(
        self,
        metrics: Metrics,
        tiers: ServiceTiers,
        retry: RetrySpec,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.metrics = metrics
        self.tiers = tiers
        self.retry = retry
        self.clock = clock
        self.default_max_tokens = 0

    async def on_domain(
        self, call: ClientRequest, model: str, domain: Domain, trace: Trace
    ) -> tuple[Reply, Slot]:
        trace.domain = domain.name  # the domain that answers, or the last one that refused
        queued = self.clock()
        waited = trace.queue_ms / 1000  # the key's line, earlier domains' queues: one budget
        queue_class, serves_tier = call.queue_class, True
        if call.service_tier is not None:
            queue_class, serves_tier, extra = self.tiers.place(call, domain.spec)
            waited -= extra  # a flex request may wait longer than max_queue_wait_ms
        wait = domain.dispatcher.acquire(
            call.key.alias, queue_class, call.cost(self.default_max_tokens), waited
        )
        slot = await (wait if trace.span is None else _traced(trace.span, domain, wait))
        trace.queue_ms += (self.clock() - queued) * 1000
        body = call.body_for(model, serves_tier)
        domain.budget.record_request()
        while True:
            try:
                # call_with_retries, its first attempt run here (retry.retry_after)
                started = time.monotonic()
                failed: BaseException | None = None
                try:
                    reply = await self._attempt(call, model, domain, body, 1, trace)
                except BaseException as exc:  # tenacity's to judge, cancellation included
                    failed = exc
                if failed is not None:  # (outside the handler, as call_with_retries does)
                    reply = await retry_after(
                        failed,
                        started,
                        lambda n: self._attempt(call, model, domain, body, n, trace),
                        self.retry,
                        domain.budget,
                        lambda f: self.metrics.record_retry(domain.name, f.reason),
                    )
            except AttemptFailed as failure:
                if failure.reason is not Reason.THROTTLED:
                    slot.release()
                    raise
                if serves_tier and call.service_tier is not None:
                    refused = self.tiers.upstream_refused(call, failure)
                    if refused is not None:  # the upstream has no flex capacity: no cool-down
                        slot.release()
                        raise refused from None
                slot = await self._throttled(domain, slot, failure, trace)
                continue
            except BaseException:
                slot.release()
                raise
            return reply, slot

    async def _throttled(
        self, domain: Domain, slot: Slot, failure: AttemptFailed, trace: Trace
    ) -> Slot:
        """An upstream 429 is flow control: cool the domain down and queue again, at the
        head, until the cool-down ends or max_queue_wait_ms runs out (503 then)."""
        pacer = domain.dispatcher.pacer
        try:
            cooled = await pacer.throttled(Throttle(failure.retry_after, slot.sent_at))
        except BaseException:  # cancelled while telling Redis: the slot is still ours
            slot.release()
            raise
        self.metrics.record_throttled(domain.name, cooled)
        queued = self.clock()
        try:
            wait = domain.dispatcher.requeue(slot)
            return await (wait if trace.span is None else _traced(trace.span, domain, wait))
        finally:
            trace.queue_ms += (self.clock() - queued) * 1000

    async def _attempt(
        self, call: ClientRequest, model: str, domain: Domain, body: bytes, n: int, trace: Trace
    ) -> Reply:
        if not domain.breaker.allows():
            raise AttemptFailed(Reason.CIRCUIT_OPEN, retryable=False, detail=domain.why())
        if trace.attempts:
            self._resending(call, domain, trace)
        t0 = self.clock()
        span = None
        if trace.span is not None:
            span = trace.span.attempt(n, domain.name, model, domain.spec.api_base)
        try:
            reply = await self._send(call, domain, body, span)
        except AttemptFailed as failure:
            self._record_attempt(domain, trace, n, model, failure.reason, t0, span, failure.status)
            trace.unanswered += failure.ambiguous
            if failure.reason in _NOT_A_VERDICT:
                domain.breaker.release_probe()  # says nothing of the upstream's health
                if failure.reason is Reason.INSUFFICIENT_QUOTA:
                    domain.note_quota(True)
            else:
                domain.breaker.record(not failure.upstream_fault)
            domain.note_failure(failure)
            raise
        except BaseException:
            self._record_attempt(domain, trace, n, model, "cancelled", t0, span)
            domain.breaker.release_probe()
            raise
        self._record_attempt(domain, trace, n, model, "ok", t0, span, reply.response.status)
        domain.breaker.record(True)
        if domain.quota_exhausted:
            domain.note_quota(False)
        domain.observe_latency(self.clock() - t0)
        return reply

    def _resending(self, call: ClientRequest, domain: Domain, trace: Trace) -> None:
        """Every attempt after a request's first (a retry, another domain, a fallback
        model, a requeue after a 429) is a re-send: counted and logged with its cause."""
        previous = trace.attempts[-1]
        self.metrics.record_resend(domain.name, previous.outcome)
        resend_log.info(
            "re-sending request %s to %s (attempt %d; the last one on %s: %s)",
            call.request_id,
            domain.name,
            len(trace.attempts) + 1,
            previous.domain,
            previous.outcome,
        )

    async def _send(
        self, call: ClientRequest, domain: Domain, body: bytes, span: AttemptSpan | None = None
    ) -> Reply:
        resp: UpstreamResponse | None = None
        if call.sockets is not None and domain.spec.responses_websocket:
            resp = await call.sockets.send(domain.spec, body)  # None: the upstream said no
        if resp is None:
            resp = await domain.client.send(
                call.endpoint.path,
                body,
                stream=call.stream,
                request_id=call.request_id,
                client_headers=call.client_headers
                if span is None
                else span.outgoing(call.client_headers),
            )
        advertised = rate_headers(resp.headers)
        if resp.status != 429:
            domain.dispatcher.pacer.answered()
        if advertised is not None:
            if resp.status == 429:  # the wait is the throttle's; keep only the limits
                advertised = RateHeaders(advertised.limit_requests, advertised.limit_tokens)
            try:
                await self._advertised(domain, advertised)
            except BaseException:  # the answer is still open: let its connection go
                await resp.close()
                raise
        if resp.status >= 300:
            data = await resp.read()
            raise _status_failure(resp.status, data, resp.headers)
        if call.stream:
            chunks = resp.chunks().__aiter__()
            try:
                first = await _first_event(resp, chunks)
            except BaseException:
                await resp.close()
                raise
            return Reply(resp, first, chunks, None)
        data = await resp.read()
        usage = parse_usage(
            data, anthropic=call.endpoint.anthropic, responses=call.endpoint.responses
        )
        return Reply(resp, data, None, usage)

    async def _advertised(self, domain: Domain, advertised: RateHeaders) -> None:
        cooled = await domain.dispatcher.pacer.observe(advertised)
        self.metrics.record_cooldown(domain.name, cooled)

    def _record_attempt(
        self,
        domain: Domain,
        trace: Trace,
        n: int,
        model: str,
        outcome: str,
        t0: float,
        span: AttemptSpan | None = None,
        status: int | None = None,
    ) -> None:
        ms = (self.clock() - t0) * 1000
        trace.upstream_ms += ms
        trace.attempts.append(Attempt(n, domain.name, model, outcome, ms))
        self.metrics.record_attempt(domain.name, outcome)
        if span is not None:
            span.end(outcome, status)


async def _traced(span: RequestSpan, domain: Domain, wait: Awaitable[Slot]) -> Slot:
    """A wait for a dispatch slot, in a span of its own (tracing on only: off, the wait
    is awaited directly, without this extra frame)."""
    with span.queue(domain.name):
        return await wait


def _status_failure(status: int, body: bytes, headers: Mapping[str, str]) -> AttemptFailed:
    return status_failure(status, body, headers.get("content-type", "application/json"), headers)


async def _first_event(resp: UpstreamResponse, chunks: AsyncIterator[bytes]) -> bytes:
    """Read up to the first complete SSE event inside the attempt: until then nothing has
    reached the client, so a drop is still an attempt failure (an ambiguous one: the
    upstream had begun to answer, so it is not re-sent by default). An upstream socket's
    chunk is one whole event (a frame)."""
    if isinstance(resp, SocketAnswer):
        return await anext(chunks)
    data = b""
    while data.find(b"\n\n") < 0 and data.find(b"\r\n\r\n") < 0:  # not `in`: streaming.py
        chunk = await anext(chunks, None)
        if chunk is None:
            break
        data += chunk
    return data
