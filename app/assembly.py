"""Construction: the stores and services one gateway process runs on, built from a runtime.

    assemble(runtime, metrics, ...) -> Parts
      shared or in-process limit store     database and its books (ledger, overrides, spend)
      one Domain per configured domain     admission, pipeline, live controls
      (dispatcher, upstream client,        audit, alerts, Responses service, batches,
       breaker, retry budget, pacer)       the status page's board

Only building lives here; `Gateway` (`app.gateway`) starts, drains and closes what this
returns, and `app.reload` retunes it when the configuration is re-read. The callbacks
(`spawn`, `current`, `key_by_alias`) are the lifecycle owner's: what is built here hands
work over to it and reads the configuration it holds now, not the one it was built from.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from app import tracing
from app.alerts import AlertCenter
from app.audit import AuditTrail
from app.auth import KeyIndex
from app.batch.held import HeldResponses
from app.batch.runner import BatchRunner
from app.batch.service import BatchService
from app.batch.store import BatchStore
from app.billing.books import BudgetOverrideBook, SpendBook
from app.billing.ledger import Ledger
from app.billing.periods import Calendar
from app.billing.shared_spend import SharedSpend
from app.billing.spend import SpendGate
from app.config.schema import Settings
from app.db.alertbook import AlertBook
from app.db.engine import Database
from app.db.overrides import OverrideBook
from app.db.owners import ResponseOwners
from app.db.trail import AuditBook
from app.db.usage import UsageBook
from app.dispatch.dispatcher import Dispatcher
from app.dispatch.domain import Domain
from app.dispatch.homes import LocalHomes, ResponseHomes
from app.limits.admission import Admission
from app.limits.limit_store import LimitStore, MemoryStore
from app.limits.pacing import PaceState
from app.limits.shared_store import SharedStore
from app.limits.sockets import SocketCounts
from app.live import LiveControls
from app.metrics import Metrics
from app.pipeline.core import Pipeline
from app.pipeline.responses_api import ResponsesService
from app.runtime import DomainSpec, KeySpec, Runtime
from app.status.board import StatusBoard
from app.upstream.breaker import Breaker
from app.upstream.budget import RetryBudget
from app.upstream.client import UpstreamClient, make_transport
from app.upstream.transport import Timeouts, Transport
from app.upstream.websocket import SocketDialer

TransportFactory = Callable[[DomainSpec], Transport]
Spawn = Callable[[Coroutine[Any, Any, None]], None]


@dataclass
class Parts:
    """Everything a gateway process runs on, built once (a reload retunes, never rebuilds)."""

    store: LimitStore
    db: Database
    calendar: Calendar
    ledger: Ledger
    overrides: OverrideBook
    spend_book: SpendBook
    budget_overrides: BudgetOverrideBook
    spend: SpendGate
    divisor: int  # each of N workers without Redis enforces 1/N of every limit
    domains: list[Domain]
    admission: Admission
    tracer: tracing.Tracer | None
    pipeline: Pipeline
    live: LiveControls
    audit: AuditTrail
    alerts: AlertCenter
    responses: ResponsesService
    socket_dialer: SocketDialer | None
    socket_counts: SocketCounts
    batch_store: BatchStore
    batches: BatchService
    batch_runner: BatchRunner
    board: StatusBoard | None


def assemble(
    runtime: Runtime,
    metrics: Metrics,
    *,
    replica_id: str,
    spawn: Spawn,
    current: Callable[[], Runtime],
    key_by_alias: Callable[[str], KeySpec | None],
    transport_factory: TransportFactory | None = None,
    store: LimitStore | None = None,
) -> Parts:
    s = runtime.settings
    store = store or build_store(s, metrics, spawn, replica_id)
    db = Database(s.database, on_state=metrics.set_database_up)
    calendar = Calendar(s.billing.timezone)
    ledger = Ledger(UsageBook(db), s.ledger, metrics=metrics, calendar=calendar)
    overrides, spend_book = OverrideBook(db), SpendBook(db)
    budget_overrides = BudgetOverrideBook(db)
    spend = SpendGate(runtime, calendar, metrics=metrics, spawn=spawn)
    if store.shared:  # budgets decided in Redis, exact across replicas
        spend.shared = SharedSpend(store.budget, prefix=s.redis.key_prefix, replica=replica_id)
    # Without Redis each of N workers enforces 1/N of every limit and every domain
    # quota: a limit never silently becomes N times larger.
    divisor = 1 if store.shared else max(1, runtime.workers)
    transports = transport_factory or (lambda spec: default_transport(s, spec))
    domains = [
        build_domain(s, spec, metrics, store, divisor, transports) for spec in runtime.domains
    ]
    admission = Admission(store, metrics, ledger, divisor=divisor, spend=spend)
    tracer = tracing.build(s.tracing, runtime.source)  # None unless tracing.enabled
    pipeline = Pipeline(runtime, domains, admission, metrics, spawn, tracer=tracer)
    # What the admin API changes live (limits, max_concurrent, budgets).
    live = LiveControls(
        current,
        admission,
        pipeline.holds.gate,
        overrides,
        budget_overrides,
        spend,
        spend_book,
        ledger,
        calendar,
    )

    def unpriced_since() -> set[str]:
        seen, pipeline.unpriced_seen = pipeline.unpriced_seen, set()
        return seen

    alerts = AlertCenter(AlertBook(db), spend, replica_id, unpriced_since)
    alerts.configure(runtime)
    responses = ResponsesService(pipeline, response_homes(s, db), metrics)
    batch_store = BatchStore(db)

    def wake_batches() -> None:
        batch_runner.wake.set()

    batches = BatchService(batch_store, s.batch, wake=wake_batches)
    batch_runner = BatchRunner(batch_store, s.batch, pipeline, key_by_alias)
    responses.deferrer = HeldResponses(batch_store, pipeline, wake_batches)
    # The status page's recent traffic, fed by the metrics verbs (None: page disabled).
    board = StatusBoard(step_sec=s.ui.step_sec) if s.ui.enabled else None
    metrics.watch(board)
    return Parts(
        store=store,
        db=db,
        calendar=calendar,
        ledger=ledger,
        overrides=overrides,
        spend_book=spend_book,
        budget_overrides=budget_overrides,
        spend=spend,
        divisor=divisor,
        domains=domains,
        admission=admission,
        tracer=tracer,
        pipeline=pipeline,
        live=live,
        audit=AuditTrail(AuditBook(db), replica_id),
        alerts=alerts,
        responses=responses,
        socket_dialer=socket_dialer(runtime),
        socket_counts=SocketCounts(),  # client WebSocket connections open per key
        batch_store=batch_store,
        batches=batches,
        batch_runner=batch_runner,
        board=board,
    )


def key_index(runtime: Runtime) -> KeyIndex:
    """The tenants' keys; with auth off, everyone is `anonymous` under the default limits."""
    limits = runtime.settings.rate_limit
    anonymous = KeySpec(
        alias="anonymous",
        digests=(),
        tokens_per_minute=limits.tokens_per_minute,
        requests_per_minute=limits.requests_per_minute,
        max_concurrent=limits.max_concurrent,
    )
    return KeyIndex(runtime.keys, enabled=runtime.auth_enabled, anonymous=anonymous)


def build_store(s: Settings, metrics: Metrics, spawn: Spawn, replica_id: str) -> LimitStore:
    if s.redis.enabled:
        return SharedStore.from_config(
            s.redis, spawn=spawn, on_state=metrics.record_redis_state, replica=replica_id
        )
    return MemoryStore()


def default_transport(s: Settings, spec: DomainSpec) -> Transport:
    sched = s.token_scheduler
    timeouts = Timeouts(connect=sched.connect_timeout_ms / 1000, read=sched.timeout_ms / 1000)
    pool = spec.max_inflight + 8  # headroom: health probes, answers being released
    # base: the transport logs how it reaches the upstream (direct or which proxy)
    return make_transport(timeouts, sched.timeout_ms / 1000, pool, base=spec.api_base)


def pace_state(spec: DomainSpec, divisor: int) -> PaceState:
    rpm, tpm = spec.requests_per_minute, spec.tokens_per_minute
    return PaceState(
        None if rpm is None else rpm / divisor,
        None if tpm is None else tpm / divisor,
        spec.quota_window_sec,
    )


def build_domain(
    s: Settings,
    spec: DomainSpec,
    metrics: Metrics,
    store: LimitStore,
    divisor: int,
    transports: TransportFactory,
) -> Domain:
    metrics.add_domain(spec.name)
    sched, policy = s.token_scheduler, s.retry_policy
    dispatcher = Dispatcher(
        spec.name,
        group_size=sched.batch_size,
        group_window_ms=sched.batch_window_ms,
        queue_capacity=sched.queue_capacity,
        max_queue_wait_ms=sched.max_queue_wait_ms,
        max_inflight=spec.max_inflight,
        pacer=store.pacer(spec.name, pace_state(spec, divisor)),
        metrics=metrics,
        batch_share=s.batch.share,
    )
    return Domain(
        spec=spec,
        client=UpstreamClient(spec, transports(spec), metrics.record_header_refused),
        dispatcher=dispatcher,
        breaker=Breaker(s.breaker),
        budget=RetryBudget(
            policy.budget_ratio, policy.budget_window_sec, policy.budget_min_retries
        ),
    )


def socket_dialer(runtime: Runtime) -> SocketDialer | None:
    """Upstream WebSocket connections, if a domain's upstream has that mode."""
    if not any(d.responses_websocket for d in runtime.domains):
        return None
    sched = runtime.settings.token_scheduler
    return SocketDialer(sched.connect_timeout_ms / 1000, sched.timeout_ms / 1000, os.environ)


def response_homes(s: Settings, db: Database) -> ResponseHomes:
    """Who owns each stored response, and where it lives: the database decides (every
    replica shares it), each process caches what it learned."""
    cfg = s.responses
    local = LocalHomes(cfg.max_local_ids, cfg.id_ttl_sec)
    return ResponseHomes(local, ResponseOwners(db, cfg.id_ttl_sec))


def configured_models(runtime: Runtime) -> set[str]:
    """Every model the configuration names: domains' lists, aliases, fallbacks, the route."""
    s = runtime.settings
    models = {m for d in runtime.domains for m in (d.models or ())}
    models |= set(s.model_aliases) | set(s.model_aliases.values())
    models |= set(runtime.fallbacks)
    if s.model_route.default:
        models.add(s.model_route.default)
    return models
