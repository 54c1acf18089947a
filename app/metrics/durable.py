"""Durable and shared state: the database, the usage ledger, the shared-state Redis and
the gateway's once-a-second housekeeping."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.metrics.base import QUEUE, RedisStateLike
from app.metrics.costs import CostFamilies


class DurableFamilies(CostFamilies):
    def _add_durable_state(self, r: CollectorRegistry) -> None:
        self.redis_up: Gauge | None = None  # these four only when Redis is configured
        self.redis_degraded: Gauge | None = None
        self.redis_misconfigured: Gauge | None = None
        self.redis_replicas: Gauge | None = None
        self.database_up = Gauge(
            "tokengate_database_up",
            "1 when the database (SQLite file or PostgreSQL) answered the last call.",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.ledger_flush = Histogram(
            "tokengate_ledger_flush_seconds",
            "Time to write one ledger flush (one transaction) to the database.",
            buckets=QUEUE,
            registry=r,
        )
        self.ledger_flush_failures = Counter(
            "tokengate_ledger_flush_failures",
            "Ledger flushes that failed (kept in memory and retried).",
            registry=r,
        )
        self.ledger_backlog = Gauge(
            "tokengate_ledger_backlog_rows",
            "Ledger rows settled but not yet written to the database.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.housekeeping_failures = Counter(
            "tokengate_housekeeping_failures",
            "Steps of the once-a-second housekeeping that raised (logged with the step's "
            "name; the other steps still ran).",
            ["step"],
            registry=r,
        )
        self.ledger_dropped = Counter(
            "tokengate_ledger_dropped",
            "Ledger entries dropped because the buffer was full (ledger.max_buffered_rows) "
            "while the database was unreachable.",
            registry=r,
        )

    def set_database_up(self, up: bool) -> None:
        self.database_up.set(1 if up else 0)

    def record_ledger_flush(self, seconds: float, rows: int, ok: bool) -> None:
        if ok:
            self.ledger_flush.observe(seconds)
        else:
            self.ledger_flush_failures.inc()

    def set_ledger_backlog(self, rows: int) -> None:
        self.ledger_backlog.set(rows)

    def record_housekeeping_failure(self, step: str) -> None:
        self._child(self.housekeeping_failures, step).inc()

    def record_ledger_dropped(self) -> None:
        self.ledger_dropped.inc()

    def record_redis_state(self, state: RedisStateLike) -> None:
        """The shared-state Redis as this process sees it (the gauges exist only with
        Redis configured, so a scrape without them means "not configured")."""
        if self.redis_up is None:
            r = self.registry
            self.redis_up = Gauge(
                "tokengate_redis_up",
                "1 when the shared-state Redis answers (absent without Redis).",
                registry=r,
                multiprocess_mode="livemin",
            )
            self.redis_degraded = Gauge(
                "tokengate_redis_degraded",
                "1 while limits and domain quotas are enforced per replica, each its share "
                "(Redis unreachable or misconfigured, fail open).",
                registry=r,
                multiprocess_mode="livemax",
            )
            self.redis_misconfigured = Gauge(
                "tokengate_redis_misconfigured",
                "1 when Redis answered MOVED/ASK/CROSSSLOT: a Cluster configured as one "
                "server; fixed only by a restart with the right configuration.",
                registry=r,
                multiprocess_mode="livemax",
            )
            self.redis_replicas = Gauge(
                "tokengate_redis_replicas",
                "Gateway processes seen alive in the last minute (heartbeats in Redis); what "
                "a limit is divided by while Redis is unreachable.",
                registry=r,
                multiprocess_mode="livemax",
            )
        assert self.redis_degraded and self.redis_misconfigured and self.redis_replicas
        self.redis_up.set(1 if state.up else 0)
        self.redis_degraded.set(1 if state.degraded else 0)
        self.redis_misconfigured.set(1 if state.misconfigured else 0)
        self.redis_replicas.set(state.replicas)
