"""The lifecycle owner: builds, starts, drains and closes everything.

    Gateway.start()                      Gateway.close()
      store.start (Redis ping)             readiness -> 503 (draining)
      database: schema at head, overrides  wait for queued + in-flight work (drain timeout)
      first health probe of each domain    stop loops, await spawned settle tasks
      dispatcher loop per domain           flush ledger, close store, database, upstreams
      health loop per domain
      housekeeping loop (1 s; ledger roll-up every minute)
      budgets: spend of the current periods read back, then refreshed after each flush

Every task the gateway runs is created here (or by a dispatcher it owns) and awaited
on close; `spawn` is how other code hands over work that must outlive a cancelled
request (settling a reservation after the client left). What the admin API changes while
it runs (limits, max_concurrent, budgets) is `live` (`app/live.py`), read back here every
second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
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
from app.config.effects import pin_restart
from app.config.problems import ConfigError
from app.config.schema import Settings
from app.db import migrate
from app.db.alertbook import AlertBook
from app.db.engine import Database, DatabaseUnavailable
from app.db.overrides import OverrideBook
from app.db.owners import ResponseOwners
from app.db.trail import AuditBook
from app.db.usage import UsageBook
from app.dispatch.dispatcher import Dispatcher
from app.dispatch.domain import Domain
from app.dispatch.homes import LocalHomes, ResponseHomes
from app.housekeeping import Housekeeping, Step
from app.limits.admission import Admission
from app.limits.limit_store import LimitStore, MemoryStore
from app.limits.pacing import PaceState
from app.limits.shared_store import SharedStore
from app.limits.sockets import SocketCounts
from app.live import LiveControls
from app.metrics import Metrics
from app.pipeline.core import Pipeline
from app.pipeline.responses_api import ResponsesService
from app.reload import describe_reload, log_reload
from app.runtime import DomainSpec, KeySpec, Runtime
from app.status.board import StatusBoard
from app.upstream.breaker import Breaker
from app.upstream.budget import RetryBudget
from app.upstream.client import UpstreamClient, make_transport
from app.upstream.probe import probe
from app.upstream.transport import Timeouts, Transport
from app.upstream.websocket import SocketDialer

log = logging.getLogger("tokengate.gateway")
SETTLE_WAIT_SEC = 2.0  # longest /admin/usage waits for settles still running
LEDGER_MAINTENANCE_TICKS = 60  # housekeeping ticks (seconds) between ledger roll-ups
AUDIT_TICKS = 5  # ... between audit upkeeps (expired keys, retention, the recent changes)
TransportFactory = Callable[[DomainSpec], Transport]


class Gateway:
    def __init__(
        self,
        runtime: Runtime,
        metrics: Metrics,
        *,
        transport_factory: TransportFactory | None = None,
        store: LimitStore | None = None,
    ) -> None:
        self.runtime = runtime
        self.metrics = metrics
        s = runtime.settings
        self.keys = KeyIndex(runtime.keys, enabled=runtime.auth_enabled, anonymous=_anonymous(s))
        self._transport_factory = transport_factory or self._default_transport
        # Names this process on the status page and in the shared store's replica list.
        self.replica_id = f"{socket.gethostname()}:{os.getpid()}"
        self.store = store or self._build_store()
        self.db = Database(s.database, on_state=metrics.set_database_up)
        self.calendar = Calendar(s.billing.timezone)
        self.ledger = Ledger(UsageBook(self.db), s.ledger, metrics=metrics, calendar=self.calendar)
        self.overrides = OverrideBook(self.db)
        self.spend_book = SpendBook(self.db)
        self.budget_overrides = BudgetOverrideBook(self.db)
        self.spend = SpendGate(runtime, self.calendar, metrics=metrics, spawn=self.spawn)
        if self.store.shared:  # budgets decided in Redis, exact across replicas
            prefix = s.redis.key_prefix
            self.spend.shared = SharedSpend(
                self.store.budget, prefix=prefix, replica=self.replica_id
            )
        # Without Redis each of N workers enforces 1/N of every limit and every domain
        # quota: a limit never silently becomes N times larger.
        self.divisor = 1 if self.store.shared else max(1, runtime.workers)
        self.domains = [self._build_domain(spec) for spec in runtime.domains]
        self.admission = Admission(
            self.store, metrics, self.ledger, divisor=self.divisor, spend=self.spend
        )
        self.tracer = tracing.build(s.tracing, runtime.source)  # None unless tracing.enabled
        self.pipeline = Pipeline(
            runtime, self.domains, self.admission, metrics, self.spawn, tracer=self.tracer
        )
        # What the admin API changes live (limits, max_concurrent, budgets).
        self.live = LiveControls(
            lambda: self.runtime,
            self.admission,
            self.pipeline.holds.gate,
            self.overrides,
            self.budget_overrides,
            self.spend,
            self.spend_book,
            self.ledger,
            self.calendar,
        )
        self.audit = AuditTrail(AuditBook(self.db), self.replica_id)
        self.alerts = AlertCenter(
            AlertBook(self.db), self.spend, self.replica_id, self._unpriced_since
        )
        self.alerts.configure(runtime)
        self.responses = ResponsesService(self.pipeline, self._response_homes(), metrics)
        self.socket_dialer = self._socket_dialer()
        self.socket_counts = SocketCounts()  # client WebSocket connections open per key
        self.batch_store = BatchStore(self.db)
        self.batches = BatchService(self.batch_store, s.batch, wake=self._wake_batches)
        self.batch_runner = BatchRunner(
            self.batch_store, s.batch, self.pipeline, lambda alias: self.keys.by_alias.get(alias)
        )
        self.responses.deferrer = HeldResponses(self.batch_store, self.pipeline, self._wake_batches)
        # The status page's recent traffic, fed by the metrics verbs (None: page disabled).
        self.board = StatusBoard(step_sec=s.ui.step_sec) if s.ui.enabled else None
        metrics.watch(self.board)
        self.draining = False
        self.socket_turns = 0  # Responses WebSocket turns in flight (a drain lets them end)
        self._unresolved: set[str] = set()
        self._drain_started = 0.0
        self.started_at = time.time()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self.housekeeping = Housekeeping(self._upkeep(), metrics.record_housekeeping_failure)
        metrics.add_models(self._configured_models())

    # -- construction -------------------------------------------------------------
    def _default_transport(self, spec: DomainSpec) -> Transport:
        sched = self.runtime.settings.token_scheduler
        timeouts = Timeouts(connect=sched.connect_timeout_ms / 1000, read=sched.timeout_ms / 1000)
        pool = spec.max_inflight + 8  # headroom: health probes, answers being released
        # base: the transport logs how it reaches the upstream (direct or which proxy)
        return make_transport(timeouts, sched.timeout_ms / 1000, pool, base=spec.api_base)

    def _pace_state(self, spec: DomainSpec) -> PaceState:
        rpm, tpm = spec.requests_per_minute, spec.tokens_per_minute
        return PaceState(
            None if rpm is None else rpm / self.divisor,
            None if tpm is None else tpm / self.divisor,
            spec.quota_window_sec,
        )

    def _build_domain(self, spec: DomainSpec) -> Domain:
        s = self.runtime.settings
        self.metrics.add_domain(spec.name)
        sched, policy = s.token_scheduler, s.retry_policy
        dispatcher = Dispatcher(
            spec.name,
            group_size=sched.batch_size,
            group_window_ms=sched.batch_window_ms,
            queue_capacity=sched.queue_capacity,
            max_queue_wait_ms=sched.max_queue_wait_ms,
            max_inflight=spec.max_inflight,
            pacer=self.store.pacer(spec.name, self._pace_state(spec)),
            metrics=self.metrics,
            batch_share=s.batch.share,
        )
        return Domain(
            spec=spec,
            client=UpstreamClient(
                spec, self._transport_factory(spec), self.metrics.record_header_refused
            ),
            dispatcher=dispatcher,
            breaker=Breaker(s.breaker),
            budget=RetryBudget(
                policy.budget_ratio, policy.budget_window_sec, policy.budget_min_retries
            ),
        )

    def _build_store(self) -> LimitStore:
        s = self.runtime.settings
        if s.redis.enabled:
            return SharedStore.from_config(
                s.redis,
                spawn=self.spawn,
                on_state=self.metrics.record_redis_state,
                replica=self.replica_id,
            )
        return MemoryStore()

    def _socket_dialer(self) -> SocketDialer | None:
        """Upstream WebSocket connections, if a domain's upstream has that mode."""
        if not any(d.responses_websocket for d in self.runtime.domains):
            return None
        sched = self.runtime.settings.token_scheduler
        timeouts = sched.connect_timeout_ms / 1000, sched.timeout_ms / 1000
        return SocketDialer(*timeouts, os.environ)

    def _response_homes(self) -> ResponseHomes:
        """Who owns each stored response, and where it lives: the database decides (every
        replica shares it), each process caches what it learned."""
        cfg = self.runtime.settings.responses
        local = LocalHomes(cfg.max_local_ids, cfg.id_ttl_sec)
        return ResponseHomes(local, ResponseOwners(self.db, cfg.id_ttl_sec))

    def _configured_models(self) -> set[str]:
        s = self.runtime.settings
        models = {m for d in self.runtime.domains for m in (d.models or ())}
        models |= set(s.model_aliases) | set(s.model_aliases.values())
        models |= set(self.runtime.fallbacks)
        if s.model_route.default:
            models.add(s.model_route.default)
        return models

    def _unpriced_since(self) -> set[str]:
        seen, self.pipeline.unpriced_seen = self.pipeline.unpriced_seen, set()
        return seen

    # -- lifecycle ---------------------------------------------------------------------
    def _wake_batches(self) -> None:
        self.batch_runner.wake.set()

    async def start(self) -> None:
        await self.store.start()
        await migrate.prepare(self.db)  # `serve` checked it already; in-process callers too
        try:  # rows an earlier shutdown could not write (ledger.spill_dir)
            await self.ledger.recover()
        except Exception as exc:
            log.error("ledger spill files not recovered (kept for the next start): %r", exc)
        await self.live.load()
        await self.live.refresh_spend()  # a spent budget stays spent across restarts
        self._describe_limits()
        log.info("durable state (ledger, batches, live limits) in %s", self.db.where)
        if self.runtime.settings.health_check.enabled:
            await asyncio.gather(*(self._probe(d) for d in self.domains))
        for domain in self.domains:
            domain.dispatcher.start()
            if self.runtime.settings.health_check.enabled:
                self._loops.append(asyncio.create_task(self._health_loop(domain)))
        self._loops.append(asyncio.create_task(self.housekeeping.run()))
        self._loops.append(asyncio.create_task(self._flush_ledger()))
        self._loops.append(asyncio.create_task(self.batch_runner.run()))
        self._loops.append(asyncio.create_task(self.alerts.run()))
        self._sync_gauges()
        self._warn_unpriced()

    def unpriced_models(self) -> list[str]:
        """Models some request may be served by (configured, routed, aliased or listed by
        a domain) that have no price: their cost is recorded as unknown."""
        models = self._configured_models() - set(self.runtime.settings.model_aliases)
        for domain in self.domains:
            models |= set(domain.models() or ())
        return self.pipeline.prices.unpriced(models)

    def _warn_unpriced(self) -> None:
        missing = self.unpriced_models()
        if missing:
            log.warning(
                "billing: no price for %d model(s), their cost is recorded as unknown: %s "
                "(add them to billing.prices)",
                len(missing),
                ", ".join(missing),
            )

    def _describe_limits(self) -> None:
        if self.store.shared:
            mode = "shared through Redis by every replica and worker"  # where: logged by it
        elif self.divisor > 1:
            mode = (
                f"split per worker: each of {self.divisor} workers enforces 1/{self.divisor} "
                "of every limit (set TOKENGATE_REDIS_URL to share)"
            )
        else:
            mode = "in-process"
        log.info("per-key limits and domain quotas: %s", mode)

    # -- live reconfiguration ----------------------------------------------------------
    def reload(self, new: Runtime) -> list[str]:
        """Apply a re-read configuration without dropping a request; name every change.

        Requests already admitted finish with the objects they hold; new ones see the new
        keys, limits, routes, aliases, retry policy, breaker thresholds, per-domain quotas,
        upstream keys and dispatcher settings (`Effect.LIVE` in `app.config.effects`). What
        a running process can not change (adding, removing or re-pointing a domain, the
        listener, log file, stores, timeouts of open pools...) keeps its running value and
        is named as needing a restart.
        """
        notes = describe_reload(self.runtime, new)
        # what only a restart applies keeps its running value (`app.config.effects`)
        new = dataclasses.replace(new, settings=pin_restart(self.runtime.settings, new.settings))
        self.spawn(self.audit.reloaded(self.runtime, new))
        old = {d.name: d for d in self.domains}
        new_specs = {d.name: d for d in new.domains}
        for name in sorted(set(old) ^ set(new_specs)):
            notes.append(f"restart needed: domain {name!r} added or removed")
        for name, domain in old.items():
            spec = new_specs.get(name)
            if spec is None:
                continue
            if spec.api_base != domain.spec.api_base:
                notes.append(f"restart needed: domain {name!r} api_base changed")
                spec = dataclasses.replace(spec, api_base=domain.spec.api_base)
            if spec.api_key.get_secret_value() != domain.spec.api_key.get_secret_value():
                notes.append(f"applied: domain {name!r} upstream key rotated")
            self._retune(domain, spec, new.settings)
        keep = {d.name for d in self.domains}
        self.runtime = dataclasses.replace(
            new, domains=tuple(d.spec for d in self.domains if d.name in keep)
        )
        self.keys = KeyIndex(new.keys, enabled=new.auth_enabled, anonymous=_anonymous(new.settings))
        self.pipeline.configure(self.runtime)
        self.spend.configure(self.runtime)
        self.alerts.configure(self.runtime)
        if new.settings.billing.timezone != self.calendar.timezone:
            notes.append("billing.timezone changed: periods from now on are in the new zone")
            self.calendar = Calendar(new.settings.billing.timezone)
            self.ledger.calendar = self.spend.calendar = self.calendar
            self.spend.windows_changed()
        self.metrics.add_models(self._configured_models())
        logging.getLogger("tokengate").setLevel(new.settings.logging.level.upper())
        self._check_routes()
        self._sync_gauges()
        return notes + self.live.shadowing(self.keys.by_alias)

    def _retune(self, domain: Domain, spec: DomainSpec, settings: Settings) -> None:
        sched = settings.token_scheduler
        domain.spec = spec
        domain.client.rekey(spec)
        domain.dispatcher.retune(
            group_size=sched.batch_size,
            group_window_ms=sched.batch_window_ms,
            queue_capacity=sched.queue_capacity,
            max_queue_wait_ms=sched.max_queue_wait_ms,
            max_inflight=spec.max_inflight,
            batch_share=settings.batch.share,
        )
        domain.breaker.cfg = settings.breaker  # thresholds; its window keeps its length
        domain.budget.ratio = settings.retry_policy.budget_ratio
        domain.budget.min_retries = settings.retry_policy.budget_min_retries
        state, new = domain.dispatcher.pacer.state, self._pace_state(spec)
        if (new.configured, new.window) != (state.configured, state.window):
            domain.dispatcher.pacer = self.store.pacer(spec.name, new)

    def request_reload(self) -> None:
        """SIGHUP: re-read the files; an invalid configuration is refused, the old one stays."""
        self.spawn(self._reload_from_files())

    async def _reload_from_files(self) -> None:
        from app.bootstrap import reload_runtime

        try:
            new = await asyncio.to_thread(reload_runtime, self.runtime)
        except ConfigError as exc:
            log.error("reload refused, keeping the running configuration:\n%s", exc.render())
            return
        notes = self.reload(new)
        log_reload(notes)

    def begin_drain(self) -> None:
        if not self.draining:
            self.draining = True
            self._drain_started = time.monotonic()
            log.info("draining: readiness now 503; finishing queued and in-flight work")

    async def close(self) -> None:
        self.begin_drain()
        # One drain budget in all: uvicorn may already have spent part of it waiting
        # for open connections before the lifespan shutdown got here.
        budget = self.runtime.settings.server.drain_timeout_sec
        timeout = max(0.0, budget - (time.monotonic() - self._drain_started))
        waits = [d.dispatcher.wait_idle() for d in self.domains]
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*waits)
        except TimeoutError:
            log.warning("drain timeout (%.0fs) reached with work still in flight", timeout)
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        # Each part closes on its own: one that fails is logged and the others still close.
        # another replica (or a restart) resumes the batches at once
        await _closing("batch leases release", self.batch_runner.release())
        await _closing("alert delivery", self.alerts.close())
        for domain in self.domains:
            await _closing(f"domain {domain.name} dispatcher", domain.dispatcher.stop())
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        await _closing("ledger flush", self.ledger.close())  # every settled request on the books
        await _closing("shared store", self.store.close())
        await _closing("database", self.db.close())
        for domain in self.domains:
            await _closing(f"domain {domain.name} upstream client", domain.client.close())
        if self.socket_dialer is not None:
            await _closing("upstream WebSocket dialer", self.socket_dialer.close())
        if self.tracer is not None:  # the spans still buffered leave now (blocking: a thread)
            await _closing("trace export", asyncio.to_thread(self.tracer.shutdown))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    async def settled(self) -> None:
        """Wait, briefly, for the settles already handed over: with Redis they are tasks
        that may still be running when the client has its answer, and `/admin/usage` must
        include every answer already sent."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=SETTLE_WAIT_SEC)

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed: %r", task.exception())

    # -- background loops --------------------------------------------------------------------
    async def _probe(self, domain: Domain) -> None:
        hc = self.runtime.settings.health_check
        try:
            async with asyncio.timeout(hc.timeout_ms / 1000):
                result = await probe(domain.client, hc.endpoint, f"probe-{uuid.uuid4().hex[:12]}")
        except TimeoutError:
            domain.healthy = False
            log.warning("health probe of domain %s timed out", domain.name)
            return
        domain.record_probe(result)
        if not result.ok:
            log.warning("health probe of domain %s failed: %s", domain.name, result.detail)
        if domain.discovered:
            self.metrics.add_models(domain.discovered)
        self._check_routes()
        self._sync_gauges()

    def route_targets(self) -> set[str]:
        s = self.runtime.settings
        aliases = s.model_aliases
        named = [s.model_route.default, *self.runtime.fallbacks]
        return {aliases.get(m, m) for m in named if m} | set(aliases.values())

    def route_state(self) -> dict[str, list[str]]:
        """Route and alias targets no domain lists (`unverified`: a list is still unknown)."""
        known = [d.models() for d in self.domains]
        listed = set().union(*(m for m in known if m is not None))
        missing = sorted(self.route_targets() - listed)
        if any(m is None for m in known):
            return {"unresolved": [], "unverified": missing}
        return {"unresolved": missing, "unverified": []}

    def _check_routes(self) -> None:
        unresolved = set(self.route_state()["unresolved"])
        for model in sorted(self.route_targets()):
            self.metrics.set_route_unresolved(model, model in unresolved)
        for model in sorted(unresolved - self._unresolved):
            log.warning(
                "model route target %r is listed by no domain's /v1/models: fix model_route / "
                "model_aliases in settings.json or that domain's `models`",
                model,
            )
        self._unresolved = unresolved

    async def _health_loop(self, domain: Domain) -> None:
        while True:  # the interval is read each time: a reload may change it
            await asyncio.sleep(self.runtime.settings.health_check.interval_sec)
            await self._probe(domain)

    def _upkeep(self) -> list[Step]:
        """The housekeeping steps, in order (`app.housekeeping` runs each on its own)."""
        return [
            # At once, so a shared store sends them all in one round trip: what other
            # replicas learned of each domain's pace, and the heartbeat.
            Step("shared_state", self._sync_shared),
            Step("gauges", self._sync_gauges),
            Step("live_limits", self.live.load_limits),
            Step("leases", self.pipeline.holds.gate.housekeeping),  # shared leases, live caps
            Step("budget_overrides", self.live.load_budget_overrides),
            Step("spend_holds", self.spend.renew),  # with Redis: holds of requests running
            Step("ledger_rollup", self._maintain_ledger, every=LEDGER_MAINTENANCE_TICKS),
            Step("audit", lambda: self.audit.housekeeping(self.runtime), AUDIT_TICKS, 1),
        ]

    async def _sync_shared(self) -> None:
        syncs = asyncio.gather(*(d.dispatcher.pacer.sync() for d in self.domains))
        await asyncio.gather(syncs, self.store.housekeeping())

    async def _maintain_ledger(self) -> None:
        try:
            await self.spend_book.prune()
            await self.responses.homes.owners.prune()  # stored responses past id_ttl_sec
            moved = await self.ledger.maintain()
        except DatabaseUnavailable:
            return  # `Database` logs the outage
        if moved:
            log.info("ledger: %d minute rows rolled up into hours", moved)

    async def _flush_ledger(self) -> None:
        """Settled requests reach the database every `ledger.flush_interval_sec`: a
        `kill -9` loses at most that much; a clean stop loses nothing (`close`). While the
        database is unreachable they are kept and retried (`Database` logs the outage)."""
        while True:
            await asyncio.sleep(self.ledger.flush_interval)
            try:
                await self.ledger.flush()
            except DatabaseUnavailable:
                pass
            except Exception as exc:
                log.error("ledger flush failed (kept for the next flush): %r", exc)
            await self.live.refresh_spend()

    def render_metrics(self) -> bytes:
        """The exposition, with this process's gauges read at this instant."""
        self._sync_gauges()
        return self.metrics.render()

    def _sync_gauges(self) -> None:
        for d in self.domains:
            self.metrics.set_domain_state(d.name, d.healthy is not False, d.breaker.is_open)
            self.metrics.set_queue_depth(d.name, len(d.dispatcher.queue))
            self.metrics.set_queue_capacity(d.name, d.dispatcher.queue.capacity)
            self.metrics.set_inflight(d.name, d.dispatcher.inflight)
            self.metrics.set_pace(d.name, d.dispatcher.pacer.rate())

    # -- what the views read -------------------------------------------------------------
    @property
    def background_tasks(self) -> int:
        return len(self._tasks)

    @property
    def limits_shared(self) -> bool:
        return self.store.shared

    async def replicas(self) -> dict[str, float]:
        """Every replica known to be alive and when it was last seen (unix seconds): this
        one, now, and those the shared store has heard from."""
        seen = await self.store.replicas()
        seen[self.replica_id] = time.time()
        return seen

    def database_health(self) -> dict[str, object]:
        """The database's part of `/health/ready` (informational: the gateway serves without
        it, buffering the ledger, so it never makes a replica unready)."""
        return {
            "backend": self.db.dialect,
            "where": self.db.where,
            "up": self.db.up,
            "error": self.db.last_error,
            "ledger_backlog_rows": self.ledger.backlog,
        }


async def _closing(what: str, closed: Awaitable[object]) -> None:
    try:
        await closed
    except Exception as exc:
        log.error("%s at shutdown failed: %r", what, exc)


def _anonymous(settings: Any) -> KeySpec:
    return KeySpec(
        alias="anonymous",
        digests=(),
        tokens_per_minute=settings.rate_limit.tokens_per_minute,
        requests_per_minute=settings.rate_limit.requests_per_minute,
        max_concurrent=settings.rate_limit.max_concurrent,
    )
