"""The request pipeline: the one domain entry point behind every edge route.

    plan (plan.py): the model (alias, default, key's allowed models)   404 / 403
      └► [requested model, *fallbacks] x domains serving each
          └► admission: reserve 1 request + estimated tokens   429
              └► for each model, for each available domain (best first):
                    dispatcher slot (queue, batch, pace)        503 queue_full/timeout
                    └► attempts with retries (retry.py)         backoff, Retry-After, budget
                       upstream 429 (throttled): pacer cools down, request back to the
                       head of the queue, slot again, attempts again (no retry spent)
                       upstream 429 insufficient_quota           429 at once
              └► answer: JSON (slot freed now) or stream (slot freed at its end)
          └► finish: settle the reservation with real usage, price it, metrics, one log line

Admission also holds what the request may consume against the key's and team's budgets
(allowance.py: the prompt estimate and the whole output allowance, sent upstream as the
output cap); `finish` prices what was consumed (`app.billing.prices`) and settles to that.

Everything after admission ends in `finish` exactly once, whatever happens (error,
client disconnect, stream drop). No FastAPI here: handlers translate HTTP to a
`ClientRequest` and an `Answer` back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from functools import partial
from itertools import chain

from app.billing.ledger import UsageEntry
from app.billing.periods import Calendar
from app.billing.prices import PriceList, Tokens, render
from app.billing.spend import SpendGate
from app.billing.timetable import NO_WINDOW, Timetable
from app.dispatch.affinity import SessionTable
from app.dispatch.dispatcher import Slot
from app.dispatch.domain import Domain
from app.dispatch.routing import rank
from app.errors import GatewayError, ServiceUnavailable
from app.limits.admission import Admission, Ticket
from app.limits.concurrency import Lease
from app.limits.limit_store import Spawn
from app.limits.pacing import RateHeaders, Throttle, rate_headers
from app.limits.sessions import SessionBook, raw_session, session_refusal
from app.metrics import Metrics
from app.pipeline.allowance import Allowance
from app.pipeline.answer import Answer, JsonAnswer, Reply, StreamAnswer
from app.pipeline.count import count_tokens
from app.pipeline.failure import client_error
from app.pipeline.holds import KeyHolds
from app.pipeline.plan import Planner
from app.pipeline.request import ClientRequest
from app.pipeline.tiers import ServiceTiers
from app.pipeline.toll import Toll
from app.pipeline.trace import Attempt, Trace
from app.runtime import Runtime
from app.status.recent import Failure
from app.tracing import AttemptSpan, RequestSpan, Tracer
from app.upstream.attempt import AttemptFailed, Reason, status_failure
from app.upstream.delivered import delivered_tokens
from app.upstream.retry import RetrySpec, call_with_retries
from app.upstream.transport import UpstreamResponse
from app.upstream.usage import Usage, parse_usage

# Attempt outcomes that feed neither the breaker nor a verdict on the upstream's health.
_NOT_A_VERDICT = frozenset({Reason.THROTTLED, Reason.INSUFFICIENT_QUOTA})
access_log = logging.getLogger("tokengate.access")
resend_log = logging.getLogger("tokengate.upstream")
MAX_DOMAINS_PER_MODEL = 2
NO_DOMAIN = "none"  # the `domain` of a request refused before any domain was chosen


class Pipeline:
    def __init__(
        self,
        runtime: Runtime,
        domains: list[Domain],
        admission: Admission,
        metrics: Metrics,
        spawn: Spawn,
        clock: Callable[[], float] = time.perf_counter,
        tracer: Tracer | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.domains = domains
        self.wall_clock = wall_clock  # billing windows are read on it
        self.admission = admission
        self.metrics = metrics
        self.spawn = spawn
        self.clock = clock
        self.tracer = tracer  # None: tracing is off and costs an `is None` per call point
        self.holds = KeyHolds(admission, metrics, spawn)
        self.toll = Toll(admission)  # the routes that reach an upstream but generate nothing
        self.sessions = SessionTable()
        self.planner = Planner(domains)
        self.allowance = Allowance(self.planner)
        self.allowance.spend = admission.spend
        self.session_spend = SessionBook(Calendar(runtime.settings.billing.timezone))
        self.tiers = ServiceTiers()
        self.unpriced_seen: set[str] = set()
        self.configure(runtime)

    def configure(self, runtime: Runtime) -> None:
        """Take routes, aliases and retry policy from `runtime` (at start and on reload)."""
        self.runtime = runtime
        policy = runtime.settings.retry_policy
        self.cooperate = policy.client_retries == "cooperate"
        self.retry = RetrySpec(
            attempts=runtime.attempts,
            backoff=policy.backoff_ms / 1000,
            max_backoff=policy.max_backoff_ms / 1000,
            max_retry_after=policy.max_retry_after_ms / 1000,
            retry_unanswered=policy.retry_unanswered,
        )
        self.planner.configure(runtime)
        self.default_max_tokens = runtime.settings.rate_limit.default_max_tokens
        self.holds.configure(runtime.settings, runtime.default_model)
        self.affinity = runtime.settings.affinity.enabled
        self.sessions.load_factor = runtime.settings.affinity.load_factor
        billing = runtime.settings.billing
        self.prices = PriceList(billing.prices, billing.currency)
        self.allowance.configure(self.prices, self.default_max_tokens)
        sessions = runtime.settings.sessions
        if billing.timezone != self.session_spend.calendar.timezone:
            self.session_spend.calendar = Calendar(billing.timezone)
        self.session_spend.max_per_key = sessions.max_per_key
        self.session_spend.idle_sec = sessions.idle_sec
        self.timetable = Timetable(billing.windows, billing.timezone)
        sched = runtime.settings.token_scheduler
        self.tiers.configure(sched.max_queue_wait_ms, sched.flex_max_queue_wait_ms)

    # -- the entry point ----------------------------------------------------------
    def _trace(self, call: ClientRequest) -> Trace:
        call.in_pipeline = True  # every way out from here writes the request's log line
        return Trace(
            call.request_id,
            call.key.alias,
            call.endpoint.name,
            call.model,
            call.stream,
            call.started or self.clock(),
        )

    async def handle(self, call: ClientRequest) -> Answer:
        trace = self._trace(call)
        if self.tracer is not None:
            model = call.model or self.runtime.default_model
            trace.span = self.tracer.request(
                call.endpoint.name,
                call.endpoint.path,
                self.metrics.model_label(model) if model else None,  # bounded: served or `other`
                call.request_id,
                call.max_tokens,
                call.stream,
                call.trace_context,
            )
        try:
            requested, first = self.planner.plan(call)
            self._session(call)
            cost = self.holds.reservation(call)
            ask, priced = self.allowance.ask(call, requested)
            ticket = await self.admission.admit(call.key, cost, ask, priced=priced)
            self.allowance.cap(call, ticket.hold)
        except GatewayError as exc:
            self._log(trace, exc.status, exc)
            raise
        lease = None
        try:
            lease = await self.holds.slot(call, trace)
            reply, domain, model, slot = await self._execute(call, requested, first, trace)
        except BaseException as exc:
            status = _status_of(exc)
            failed = self._abandoned(call, trace, status)
            self._finish(call, trace, ticket, status, exc=exc, failed=failed, lease=lease)
            raise
        trace.domain, trace.fallback = domain.name, model != requested
        if call.stream:
            finish = partial(self._finish, call, trace, ticket, lease=lease)
            return StreamAnswer(
                call,
                trace,
                ticket,
                reply,
                slot,
                domain,
                finish=finish,
                metrics=self.metrics,
                clock=self.clock,
            )
        slot.release()
        answer = self._json_answer(call, trace, ticket, reply, domain, lease)
        await SpendGate.released(ticket.hold)
        if call.on_response is not None and reply.usage is not None and reply.usage.response_id:
            await call.on_response(reply.usage.response_id, domain.name)
        return answer

    async def count_tokens(self, call: ClientRequest) -> JsonAnswer:
        """`POST /v1/messages/count_tokens` (count.py): admitted like a request with its
        prompt (`Toll`), no queue, no slot; charged a request and no tokens."""
        trace = self._trace(call)
        try:
            ticket = await self.toll.admit(call.key, call.prompt_tokens)
        except GatewayError as exc:
            self._log(trace, exc.status, exc)
            raise
        status, error = 200, None
        try:
            answer = await count_tokens(self, call, trace)
        except BaseException as exc:
            status, error = _status_of(exc), exc
            raise
        finally:
            model = trace.model or call.model
            entry = self.toll.settle(ticket, call.key, model, trace.domain or "-", status)
            self._log(trace, status, error, entry)
        answer.headers.update(ticket.headers())
        return answer

    # -- spend ------------------------------------------------------------------------
    def _session(self, call: ClientRequest) -> None:
        """Name the agent session the request is accounted under; refuse it if that
        session spent its key's `session_budget` (sessions.py)."""
        raw = raw_session(call.session_header, call.body)
        if raw is None:
            return
        key = call.key
        call.session_label = label = self.session_spend.label(key.alias, raw)
        if key.session_budgets:
            over = self.session_spend.over(key.alias, label, key.session_budgets)
            if over is not None:
                raise session_refusal(key.alias, label, over, self.prices.currency)

    def _window(self) -> str:
        """The billing window in force now (`-`: none, or no windows configured)."""
        timetable = self.timetable
        return timetable.name_at(self.wall_clock()) if timetable else NO_WINDOW

    @staticmethod
    def _abandoned(call: ClientRequest, trace: Trace, status: int) -> tuple[int, int]:
        """The client left while the upstream had its (non-streamed) request: the upstream
        read the prompt and charges for it, and nothing of the answer was delivered, so
        the prompt estimate is what was consumed (flagged estimated)."""
        if status == 499 and trace.attempts and trace.attempts[-1].outcome == "cancelled":
            trace.estimated = True
            return call.prompt_tokens, 0
        return 0, 0

    def _priced(
        self, call: ClientRequest, trace: Trace, failed: tuple[int, int], window: str
    ) -> int | None:
        """The cost of what the request consumed (failed attempts' tokens included), at
        the price of the model the gateway sent, else the one the upstream named, in the
        billing window in force as it finished."""
        tokens = Tokens(
            trace.prompt_tokens + failed[0],
            trace.completion_tokens + failed[1],
            trace.cached_tokens,
            trace.cache_write_tokens,
        )
        if not (tokens.prompt or tokens.completion):
            return 0  # nothing consumed costs nothing, priced or not
        sent = trace.attempts[-1].model if trace.attempts else None
        return self.prices.cost(tokens, sent, trace.model, window=window, tier=trace.service_tier)

    def spend_text(self, nanos: int | None) -> str:
        """`x-tokengate-cost`: `0.000123 USD`, or `unknown` for a model without a price."""
        return "unknown" if nanos is None else f"{render(nanos)} {self.prices.currency}"

    # -- execution --------------------------------------------------------------------
    async def _execute(
        self, call: ClientRequest, target: str, first: list[Domain], trace: Trace
    ) -> tuple[Reply, Domain, str, Slot]:
        last: BaseException | None = None
        congested: set[str] = set()  # full or slow queues: a fallback there would wait again
        plan = chain([(target, first)], self.planner.fallbacks(call, target))
        for i, (model, candidates) in enumerate(plan):
            if i:
                if not self.allowance.serves(call, model):
                    continue  # unpriced, and the key has a cost budget
                self.metrics.record_fallback(target, model)
            ranked = self._order(call, candidates)
            if congested:
                ranked = [d for d in ranked if d.name not in congested]
            if not ranked and last is None:
                last = self._no_domain(model, candidates)
            for domain in ranked[:MAX_DOMAINS_PER_MODEL]:
                try:
                    reply, slot = await self._on_domain(call, model, domain, trace)
                    return reply, domain, model, slot
                except AttemptFailed as failure:
                    last = failure
                    # Another domain or model is a re-send too: the same rule as a retry.
                    if not failure.moves_on or not self.retry.may_resend(failure):
                        raise self._final_error(failure, trace) from None
                except ServiceUnavailable as exc:
                    last = exc
                    congested.add(domain.name)
        raise self.tiers.refusal(call, self._final_error(last, trace))

    def _order(self, call: ClientRequest, candidates: list[Domain]) -> list[Domain]:
        """Best first: the conversation's domain (affinity), else the least wait."""
        if len(candidates) < 2 or not self.affinity:
            return rank(candidates)
        ranked, placed = self.sessions.order(candidates, call.session)
        if placed is not None:
            self.metrics.record_affinity(ranked[0].name, placed)
        return ranked

    async def _on_domain(
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
                reply = await call_with_retries(
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
                first = await _first_event(chunks)
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

    # -- errors --------------------------------------------------------------------------
    def _no_domain(self, model: str, candidates: list[Domain]) -> ServiceUnavailable:
        states = ", ".join(
            f"{d.name}: {d.state()}" + (f" after {d.why()}" if d.why() else "") for d in candidates
        )
        wait = min((d.breaker.cfg.open_sec for d in candidates if d.breaker.is_open), default=5.0)
        return ServiceUnavailable(
            f"no healthy domain serves model '{model}' ({states})",
            code="no_healthy_domain",
            retry_after=wait,
            should_retry=False if self.cooperate else None,
        )

    def _final_error(self, last: BaseException | None, trace: Trace) -> GatewayError:
        if last is None or isinstance(last, GatewayError):
            return last or ServiceUnavailable("no domain available", code="no_healthy_domain")
        assert isinstance(last, AttemptFailed)
        resent = self.retry.may_resend(last)
        return client_error(last, trace, cooperate=self.cooperate, resent=resent)

    # -- answers and accounting -------------------------------------------------------------
    def _json_answer(
        self,
        call: ClientRequest,
        trace: Trace,
        ticket: Ticket,
        reply: Reply,
        domain: Domain,
        lease: Lease | None = None,
    ) -> JsonAnswer:
        usage = reply.usage
        assert usage is not None
        trace.model = usage.model or trace.attempts[-1].model
        trace.prompt_tokens, trace.completion_tokens = usage.prompt, usage.completion
        trace.cached_tokens, trace.cache_write_tokens = usage.cached, usage.cache_write
        trace.service_tier = usage.tier
        if call.endpoint.responses:
            self._responses_answer(call, trace, usage)
        elif not usage.reported:  # a 200 without usage: count what it delivered
            trace.prompt_tokens, trace.estimated = call.prompt_tokens, True
            trace.completion_tokens = delivered_tokens(reply.first)
        entry = self._finish(call, trace, ticket, 200, lease=lease)
        headers = {
            **ticket.headers(),
            "x-tokengate-domain": domain.name,
            "x-tokengate-cost": self.spend_text(entry.cost_nanos),
        }
        ctype = reply.response.headers.get("content-type", "application/json")
        return JsonAnswer(200, reply.first, ctype, headers)

    def _responses_answer(self, call: ClientRequest, trace: Trace, usage: Usage) -> None:
        """A background response answers `queued`, without usage: it is charged what
        was reserved, as its usage is only known once it is done. (The id it names is
        recorded by `handle`, once the answer is settled.)"""
        if not usage.reported:
            trace.prompt_tokens = call.prompt_tokens
            trace.completion_tokens = call.cost(self.default_max_tokens) - call.prompt_tokens
            trace.estimated = True

    def _finish(
        self,
        call: ClientRequest,
        trace: Trace,
        ticket: Ticket,
        status: int,
        *,
        exc: BaseException | None = None,
        failed: tuple[int, int] = (0, 0),
        lease: Lease | None = None,
    ) -> UsageEntry:
        """Settle, count and log; exactly once per admitted request."""
        if lease is not None:
            lease.release()
        if trace.unanswered:  # each may have been billed its prompt (see `Trace.unanswered`)
            failed = (failed[0] + trace.unanswered * call.prompt_tokens, failed[1])
            trace.estimated = True
        self.holds.learn(call, trace, status)
        if trace.cached_tokens or trace.cache_write_tokens:
            self.metrics.record_prompt_cache(
                trace.domain or "-", trace.cached_tokens, trace.cache_write_tokens
            )
        model = trace.model or (trace.attempts[-1].model if trace.attempts else call.model) or "-"
        window = self._window()
        entry = UsageEntry(
            key=call.key.alias,
            model=model,
            prompt_tokens=trace.prompt_tokens,
            completion_tokens=trace.completion_tokens,
            error=status != 200,
            failed_prompt_tokens=failed[0],
            failed_completion_tokens=failed[1],
            domain=trace.domain or "-",
            cached_tokens=trace.cached_tokens,
            status=status,
            team=call.key.team or "-",
            cache_write_tokens=trace.cache_write_tokens,
            estimated=trace.estimated,
            cost_nanos=self._priced(call, trace, failed, window),
            session=call.session_label,
            window=window,
        )
        if entry.session != "-":
            periods = self.session_spend.periods_now(call.key.session_budgets)
            self.session_spend.add(
                entry.key, entry.session, entry.tokens, entry.cost_nanos, periods
            )
        self.admission.settle(ticket, entry, dispatched=trace.dispatched)
        self.metrics.record_spend(entry.key, entry.model, entry.cost_nanos)
        if entry.cost_nanos is None:
            self.unpriced_seen.add(entry.model)  # spend alerts' `unpriced_model`
        self._log(trace, status, exc, entry)
        return entry

    def _log(
        self,
        trace: Trace,
        status: int,
        exc: BaseException | None,
        usage: UsageEntry | None = None,
    ) -> None:
        trace.status = status
        if isinstance(exc, GatewayError):
            trace.error = exc.code or exc.type
        elif exc is not None:
            trace.error = type(exc).__name__
        seconds = self.clock() - trace.started
        domain, model = trace.domain or NO_DOMAIN, trace.model or trace.requested_model
        if usage is None:  # refused before admission: no tokens, no ledger entry
            self.metrics.record_request(domain, model, status, seconds)
        else:
            self.metrics.record_answer(domain, model, usage, status, seconds)
        if status >= 400:
            self.metrics.record_error(
                Failure(
                    trace.request_id,
                    trace.key,
                    model,
                    trace.domain,
                    status,
                    trace.error,
                    _error_message(status, exc),
                )
            )
        if access_log.isEnabledFor(logging.INFO):
            fields = trace.fields(seconds * 1000)
            # cost: a decimal string in `currency`, null when the model has no price; a
            # request refused before admission consumed nothing
            cost = 0 if usage is None else usage.cost_nanos
            fields["cost"] = None if cost is None else render(cost)
            fields["currency"] = self.prices.currency
            fields["team"] = call_team(usage)
            fields["window"] = None if usage is None or usage.window == NO_WINDOW else usage.window
            access_log.info("request", extra={"fields": fields})
        if trace.span is not None:
            trace.span.end(trace, status)


def call_team(usage: UsageEntry | None) -> str | None:
    return None if usage is None or usage.team == "-" else usage.team


async def _traced(span: RequestSpan, domain: Domain, wait: Awaitable[Slot]) -> Slot:
    """A wait for a dispatch slot, in a span of its own (tracing on only: off, the wait
    is awaited directly, without this extra frame)."""
    with span.queue(domain.name):
        return await wait


def _status_failure(status: int, body: bytes, headers: Mapping[str, str]) -> AttemptFailed:
    return status_failure(status, body, headers.get("content-type", "application/json"), headers)


async def _first_event(chunks: AsyncIterator[bytes]) -> bytes:
    """Read up to the first complete SSE event inside the attempt: until then nothing has
    reached the client, so a drop is still an attempt failure (an ambiguous one: the
    upstream had begun to answer, so it is not re-sent by default)."""
    data = b""
    while b"\n\n" not in data and b"\r\n\r\n" not in data:
        chunk = await anext(chunks, None)
        if chunk is None:
            break
        data += chunk
    return data


def _error_message(status: int, exc: BaseException | None) -> str:
    """What the status page says of an error answer: the client's own message for a
    `GatewayError` (written to be shown), a fixed sentence otherwise (never an
    exception's text, which could carry anything)."""
    if isinstance(exc, GatewayError):
        return exc.message
    if status == 499:
        return "the client closed the connection before the answer ended"
    if exc is None:
        return "the upstream stream broke off after it started"
    return "internal error; see the gateway log"


def _status_of(exc: BaseException) -> int:
    if isinstance(exc, GatewayError):
        return exc.status
    return 499 if isinstance(exc, BaseException) and not isinstance(exc, Exception) else 500
