"""The request pipeline: the one domain entry point behind every edge route.

    plan (plan.py): the model (alias, default, key's allowed models)   404 / 403
      └► admission: reserve 1 request + estimated tokens, hold the budgets   429
          └► failover.py: [requested model, *fallbacks] x domains serving each, best first
              └► attempts.py: dispatcher slot, attempts with retries, 429 as flow control
          └► answer: JSON (slot freed now) or stream (slot freed at its end)
      └► accounting.py: settle the reservation with real usage, priced (pricing.py),
         metrics, one log line

Admission also holds what the request may consume against the key's and team's budgets
(allowance.py: the prompt estimate and the whole output allowance, sent upstream as the
output cap); accounting prices what was consumed (`app.billing.prices`) and settles to
that.

Everything after admission ends in `Accounting.finish` exactly once, whatever happens
(error, client disconnect, stream drop). No FastAPI here: handlers translate HTTP to a
`ClientRequest` and an `Answer` back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from app.billing.periods import Calendar
from app.billing.prices import PriceList
from app.billing.spend import SpendGate
from app.billing.timetable import Timetable
from app.dispatch.domain import Domain
from app.errors import GatewayError
from app.limits.admission import Admission
from app.limits.limit_store import Spawn
from app.limits.sessions import SessionBook, raw_session, session_refusal
from app.metrics import Metrics
from app.pipeline.accounting import Accounting, status_of
from app.pipeline.allowance import Allowance
from app.pipeline.answer import Answer, StreamAnswer
from app.pipeline.attempts import Attempts
from app.pipeline.count import TokenCount
from app.pipeline.failover import Failover
from app.pipeline.holds import KeyHolds
from app.pipeline.plan import Planner
from app.pipeline.pricing import Pricing
from app.pipeline.replies import JsonAnswer
from app.pipeline.request import ClientRequest
from app.pipeline.tiers import ServiceTiers
from app.pipeline.toll import Toll
from app.pipeline.trace import Trace
from app.runtime import Runtime
from app.tracing import Tracer
from app.upstream.retry import RetrySpec


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
        self.admission = admission
        self.metrics = metrics
        self.spawn = spawn
        self.clock = clock
        self.tracer = tracer  # None: tracing is off and costs an `is None` per call point
        self.holds = KeyHolds(admission, metrics, spawn)
        self.toll = Toll(admission)  # the routes that reach an upstream but generate nothing
        self.planner = Planner(domains)
        self.allowance = Allowance(self.planner, wall_clock)
        self.allowance.spend = admission.spend
        settings = runtime.settings
        self.session_spend = SessionBook(Calendar(settings.billing.timezone))
        self.tiers = ServiceTiers()
        self.pricing = Pricing(settings.billing, wall_clock)
        self.attempts = Attempts(metrics, self.tiers, _retry_spec(runtime), clock)
        self.failover = Failover(self.planner, self.allowance, self.attempts, self.tiers, metrics)
        self.accounting = Accounting(
            admission, metrics, self.holds, self.pricing, self.session_spend, clock
        )
        self.counter = TokenCount(self.planner, clock)
        self.configure(runtime)

    def configure(self, runtime: Runtime) -> None:
        """Take routes, aliases and retry policy from `runtime` (at start and on reload)."""
        self.runtime = runtime
        settings = runtime.settings
        self.cooperate = settings.retry_policy.client_retries == "cooperate"
        self.attempts.retry = _retry_spec(runtime)
        self.failover.cooperate = self.cooperate
        self.planner.configure(runtime)
        self.default_max_tokens = settings.rate_limit.default_max_tokens
        self.attempts.default_max_tokens = self.default_max_tokens
        self.accounting.default_max_tokens = self.default_max_tokens
        self.holds.configure(settings, runtime.default_model)
        self.failover.affinity = settings.affinity.enabled
        self.failover.sessions.load_factor = settings.affinity.load_factor
        billing = settings.billing
        self.pricing.configure(billing)
        sessions = settings.sessions
        if billing.timezone != self.session_spend.calendar.timezone:
            self.session_spend.calendar = Calendar(billing.timezone)
        self.session_spend.max_per_key = sessions.max_per_key
        self.session_spend.idle_sec = sessions.idle_sec
        sched = settings.token_scheduler
        horizon = (sched.max_queue_wait_ms + runtime.attempts * sched.timeout_ms) / 1000
        self.allowance.configure(
            self.pricing.prices, self.default_max_tokens, self.pricing.timetable, horizon
        )
        self.tiers.configure(sched.max_queue_wait_ms, sched.flex_max_queue_wait_ms)

    # -- what others read -------------------------------------------------------------
    @property
    def prices(self) -> PriceList:
        return self.pricing.prices

    @property
    def timetable(self) -> Timetable:
        return self.pricing.timetable

    @property
    def unpriced_seen(self) -> set[str]:
        """Models answered without a price since the spend alerts last looked."""
        return self.accounting.unpriced_seen

    @unpriced_seen.setter
    def unpriced_seen(self, seen: set[str]) -> None:
        self.accounting.unpriced_seen = seen

    # -- the entry points -------------------------------------------------------------
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
        accounting = self.accounting
        try:
            requested, first = self.planner.plan(call)
            self._session(call)
            cost = self.holds.reservation(call)
            ask, priced = self.allowance.ask(call, requested)
            ticket = await self.admission.admit(call.key, cost, ask, priced=priced)
            self.allowance.cap(call, ticket.hold)
        except GatewayError as exc:
            accounting.log(trace, exc.status, exc)
            raise
        lease = None
        try:
            if self.holds.capped(call):
                lease = await self.holds.slot(call, trace)
            reply, domain, model, slot = await self.failover.execute(call, requested, first, trace)
        except BaseException as exc:
            status = status_of(exc)
            failed = accounting.abandoned(call, trace, status)
            accounting.finish(call, trace, ticket, status, exc=exc, failed=failed, lease=lease)
            raise
        trace.domain, trace.fallback = domain.name, model != requested
        if call.stream:
            finish = partial(accounting.finish, call, trace, ticket, lease=lease)
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
        answer = accounting.json_answer(call, trace, ticket, reply, domain, lease)
        if ticket.hold is not None:  # a budget held in Redis: its settle is in flight
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
            self.accounting.log(trace, exc.status, exc)
            raise
        status = 200
        error: BaseException | None = None
        try:
            answer = await self.counter.count(call, trace, cooperate=self.cooperate)
        except BaseException as exc:
            status, error = status_of(exc), exc
            raise
        finally:
            model = trace.model or call.model
            entry = self.toll.settle(ticket, call.key, model, trace.domain or "-", status)
            self.accounting.log(trace, status, error, entry)
        answer.headers.update(ticket.headers())
        return answer

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
                raise session_refusal(key.alias, label, over, self.pricing.currency)


def _retry_spec(runtime: Runtime) -> RetrySpec:
    policy = runtime.settings.retry_policy
    return RetrySpec(
        attempts=runtime.attempts,
        backoff=policy.backoff_ms / 1000,
        max_backoff=policy.max_backoff_ms / 1000,
        max_retry_after=policy.max_retry_after_ms / 1000,
        retry_unanswered=policy.retry_unanswered,
    )
