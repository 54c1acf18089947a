"""The lifecycle owner: starts, drains and closes everything a process runs on.

Building it is `app.assembly`'s, applying a reload `app.reload`'s, checking the routes
against the domains' model lists `app.route_check`'s; this class runs them:

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
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Coroutine
from typing import Any

from app.assembly import TransportFactory, assemble, configured_models, key_index
from app.config.problems import ConfigError
from app.db import migrate
from app.db.engine import DatabaseUnavailable
from app.dispatch.domain import Domain
from app.housekeeping import Housekeeping, Step
from app.limits.limit_store import LimitStore
from app.metrics import Metrics
from app.reload import apply_reload, log_reload
from app.route_check import RouteCheck, route_state
from app.runtime import Runtime
from app.upstream.probe import probe

log = logging.getLogger("tokengate.gateway")
SETTLE_WAIT_SEC = 2.0  # longest /admin/usage waits for settles still running
LEDGER_MAINTENANCE_TICKS = 60  # housekeeping ticks (seconds) between ledger roll-ups
TASKS_WAIT_SEC = 5.0  # how long shutdown waits for background tasks before cancelling them
AUDIT_TICKS = 5  # ... between audit upkeeps (expired keys, retention, the recent changes)


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
        self.keys = key_index(runtime)
        # Names this process on the status page and in the shared store's replica list.
        self.replica_id = f"{socket.gethostname()}:{os.getpid()}"
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        parts = assemble(
            runtime,
            metrics,
            replica_id=self.replica_id,
            spawn=self.spawn,
            current=lambda: self.runtime,
            key_by_alias=lambda alias: self.keys.by_alias.get(alias),
            transport_factory=transport_factory,
            store=store,
        )
        self.parts = parts  # what `app.reload` retunes
        self.store, self.db, self.calendar = parts.store, parts.db, parts.calendar
        self.ledger, self.overrides = parts.ledger, parts.overrides
        self.spend_book, self.budget_overrides = parts.spend_book, parts.budget_overrides
        self.spend, self.divisor, self.domains = parts.spend, parts.divisor, parts.domains
        self.admission, self.tracer, self.pipeline = parts.admission, parts.tracer, parts.pipeline
        self.live, self.audit, self.alerts = parts.live, parts.audit, parts.alerts
        self.responses, self.socket_dialer = parts.responses, parts.socket_dialer
        self.socket_counts, self.batch_store = parts.socket_counts, parts.batch_store
        self.batches, self.batch_runner, self.board = parts.batches, parts.batch_runner, parts.board
        self.routes = RouteCheck(metrics)
        self.draining = False
        self.socket_turns = 0  # Responses WebSocket turns in flight (a drain lets them end)
        self._drain_started = 0.0
        self.started_at = time.time()
        self.housekeeping = Housekeeping(self._upkeep(), metrics.record_housekeeping_failure)
        metrics.add_models(configured_models(runtime))

    # -- lifecycle ---------------------------------------------------------------------
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
        models = configured_models(self.runtime) - set(self.runtime.settings.model_aliases)
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
        """Apply a re-read configuration without dropping a request; name every change
        (`app.reload.apply_reload`: what applies live, what needs a restart)."""
        applied = apply_reload(self.parts, self.metrics, self.runtime, new, self.spawn)
        self.runtime, self.keys, self.calendar = applied.runtime, applied.keys, applied.calendar
        self._check_routes()
        self._sync_gauges()
        return applied.notes

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
        await self._finish_tasks()
        await _closing("ledger flush", self.ledger.close())  # every settled request on the books
        await _closing("shared store", self.store.close())
        await _closing("database", self.db.close())
        for domain in self.domains:
            await _closing(f"domain {domain.name} upstream client", domain.client.close())
        if self.socket_dialer is not None:
            await _closing("upstream WebSocket dialer", self.socket_dialer.close())
        if self.tracer is not None:  # the spans still buffered leave now (blocking: a thread)
            await _closing("trace export", asyncio.to_thread(self.tracer.shutdown))

    async def _finish_tasks(self) -> None:
        """Let the background tasks (settles, audit writes) finish, briefly; cancel what is
        left and wait for it to unwind, so that none still holds a database connection
        when the database closes (one that did kept its driver's thread running into a
        closed event loop)."""
        if not self._tasks:
            return
        _, late = await asyncio.wait(set(self._tasks), timeout=TASKS_WAIT_SEC)
        if late:
            log.warning("%d background task(s) still running at shutdown: cancelled", len(late))
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

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

    def route_state(self) -> dict[str, list[str]]:
        """Route and alias targets no domain lists (`app.route_check`)."""
        return route_state(self.runtime, self.domains)

    def _check_routes(self) -> None:
        self.routes.check(self.runtime, self.domains)

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
