"""Every Prometheus metric, defined once and recorded through verbs.

Nothing else imports prometheus_client. Instruments live on an explicitly passed
`CollectorRegistry` (tests get a fresh one). With `--workers N` the CLI sets
`PROMETHEUS_MULTIPROC_DIR` before any worker imports this module, values go to
per-process files and `render()` aggregates them, so one scrape sums all workers.

The verbs also feed the status page's ring of recent traffic (`app.status`), when the
gateway attached one with `watch`: the page and Prometheus count the same events.

Label values are bounded: `key` is the alias, `model` is one of the configured or
discovered models (else `other`), `domain` comes from the config. Label children are
cached per label tuple because `.labels()` takes a lock and builds a tuple each call.

The instruments every request touches (requests, durations, tokens, attempts, dispatch
groups and queue waits, time to first token, cost) are recorded through tally cells
(`app.tally`) that prometheus_client reads when the registry is collected, not per call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as _mp

from app.kinds import TokenKind
from app.status.board import StatusBoard
from app.status.recent import Failure, RecentErrors
from app.status.ring import Ring
from app.tally import Fold, Tally

CONTENT_TYPE = CONTENT_TYPE_LATEST
MAX_MODEL_LABELS = 200
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_QUEUE = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class UsageLike(Protocol):
    """What `record_answer` reads of a ledger entry (`app.limits.ledger.UsageEntry`)."""

    @property
    def key(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def failed_prompt_tokens(self) -> int: ...
    @property
    def failed_completion_tokens(self) -> int: ...


class RedisStateLike(Protocol):
    """What `record_redis_state` reads (`app.limits.redis_store.RedisState`)."""

    @property
    def up(self) -> bool: ...
    @property
    def degraded(self) -> bool: ...
    @property
    def misconfigured(self) -> bool: ...
    @property
    def replicas(self) -> int: ...


def multiprocess_enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def mark_process_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (called by the supervisor, if any)."""
    if multiprocess_enabled():
        _mp.mark_process_dead(pid)  # type: ignore[no-untyped-call]


class Metrics:
    def __init__(self, registry: CollectorRegistry, models: Iterable[str] = ()) -> None:
        self.registry = registry
        self._models: set[str] = set(models)
        self._children: dict[tuple[Any, ...], Any] = {}
        self._tallies: dict[tuple[Any, ...], Tally] = {}
        self._answers: dict[tuple[str, str, str, int], tuple[Tally, ...]] = {}
        self._write_through = multiprocess_enabled()
        self._ring: Ring | None = None
        self._errors: RecentErrors | None = None
        r = registry
        r.register(Fold(self.fold))  # first: the instruments below are collected after it
        self.requests = Counter(
            "tokengate_requests",
            "Requests answered, by serving domain, model and HTTP status.",
            ["domain", "model", "status"],
            registry=r,
        )
        self.tokens = Counter(
            "tokengate_tokens",
            "Tokens counted from upstream usage (kind = prompt|completion).",
            ["key", "model", "kind"],
            registry=r,
        )
        self.failed_tokens = Counter(
            "tokengate_failed_tokens",
            "Tokens consumed by attempts that failed (interrupted streams, errors after usage).",
            ["key", "model", "kind"],
            registry=r,
        )
        self.duration = Histogram(
            "tokengate_request_duration_seconds",
            "Time from request arrival to the last byte of the answer.",
            ["domain", "model"],
            buckets=_LATENCY,
            registry=r,
        )
        self.ttft = Histogram(
            "tokengate_time_to_first_token_seconds",
            "Time from request arrival to the first streamed content chunk.",
            ["domain", "model"],
            buckets=_LATENCY,
            registry=r,
        )
        self.queue_depth = Gauge(
            "tokengate_queue_depth",
            "Requests waiting in a domain's queue.",
            ["domain"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.queue_capacity = Gauge(
            "tokengate_queue_capacity",
            "Requests a domain's queue holds (token_scheduler.queue_capacity): alerts compare "
            "tokengate_queue_depth with it.",
            ["domain"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.queue_full = Counter(
            "tokengate_queue_full",
            "Requests refused with 503 queue_full because a domain's queue was at capacity.",
            ["domain"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "tokengate_queue_wait_seconds",
            "Time a request waited for a dispatch slot.",
            ["domain"],
            buckets=_QUEUE,
            registry=r,
        )
        self.inflight = Gauge(
            "tokengate_inflight",
            "Upstream requests in flight (streams count until they end).",
            ["domain"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.batch = Histogram(
            "tokengate_batch_size",
            "Requests released upstream per dispatch group.",
            ["domain"],
            buckets=_BATCH,
            registry=r,
        )
        self.retries = Counter(
            "tokengate_upstream_retries",
            "Upstream retries, by the failure that caused them.",
            ["domain", "reason"],
            registry=r,
        )
        self.header_refused = Counter(
            "tokengate_header_values_refused",
            "Requests an upstream refused (400) for a header value it does not know (a new "
            "`anthropic-beta`), sent again once without it, by domain and header.",
            ["domain", "header"],
            registry=r,
        )
        self.resends = Counter(
            "tokengate_upstream_resends",
            "Requests sent upstream again (a retry, another domain or model, a requeue after "
            "429), by the domain sent to and the outcome of the attempt before.",
            ["domain", "reason"],
            registry=r,
        )
        self.attempts = Counter(
            "tokengate_upstream_attempts",
            "Upstream attempts, by outcome.",
            ["domain", "outcome"],
            registry=r,
        )
        self.rate_limited = Counter(
            "tokengate_rate_limited",
            "Requests refused by a per-key limit (limit = requests|tokens).",
            ["key", "limit"],
            registry=r,
        )
        self.upstream_up = Gauge(
            "tokengate_upstream_up",
            "1 when the domain's upstream is healthy and its circuit closed.",
            ["domain"],
            registry=r,
            multiprocess_mode="livemin",
        )
        self.breaker_open = Gauge(
            "tokengate_circuit_open",
            "1 while a domain's circuit breaker is open.",
            ["domain"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.stream_errors = Counter(
            "tokengate_stream_errors",
            "Streams that ended with an error event after starting.",
            ["domain", "reason"],
            registry=r,
        )
        self.fallbacks = Counter(
            "tokengate_fallbacks",
            "Requests served by a fallback model.",
            ["model", "fallback"],
            registry=r,
        )
        self.throttled = Counter(
            "tokengate_upstream_throttled",
            "Upstream 429s that were flow control (requeued, not failed), by domain.",
            ["domain"],
            registry=r,
        )
        self.cooldown = Counter(
            "tokengate_upstream_cooldown_seconds",
            "Seconds a domain's dispatch was paused by upstream 429s or exhausted "
            "x-ratelimit-remaining headers.",
            ["domain"],
            registry=r,
        )
        self.pace = Gauge(
            "tokengate_domain_pace_requests_per_second",
            "Requests/s a domain's pacer allows now: the learned rate after upstream 429s, "
            "else the quota (configured or advertised); +Inf while unbounded.",
            ["domain"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self._add_agent_metrics(r)
        self.sockets = Gauge(
            "tokengate_responses_websocket_connections",
            "Open Responses API WebSocket connections (Codex CLI's first choice).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.socket_messages = Counter(
            "tokengate_responses_websocket_messages",
            "Client messages on Responses API WebSockets (kind = create|warmup|refused|"
            "ignored|waited; `waited`: a turn waited out its key's 429 before any output); "
            "each `create` is also one request in the request metrics.",
            ["kind"],
            registry=r,
        )
        self.socket_upgrades = Counter(
            "tokengate_responses_websocket_upgrades",
            "WebSocket upgrade requests on /v1/responses, by answer (101 accepted, 426 "
            "refused so the client falls back to HTTP, 401 bad key).",
            ["status"],
            registry=r,
        )
        self.redis_up: Gauge | None = None  # these four only when Redis is configured
        self.redis_degraded: Gauge | None = None
        self.redis_misconfigured: Gauge | None = None
        self.redis_replicas: Gauge | None = None
        self.route_unresolved = Gauge(
            "tokengate_route_unresolved",
            "1 when a routed or aliased model is listed by no domain's /v1/models.",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self._add_durable_state(r)
        self._add_spend(r)

    def watch(self, board: StatusBoard | None) -> None:
        """Feed `board` (the status page's recent traffic) from the verbs below too."""
        self._ring = board.ring if board is not None else None
        self._errors = board.errors if board is not None else None

    # -- label hygiene -------------------------------------------------------------
    def add_models(self, models: Iterable[str]) -> None:
        for model in models:
            if len(self._models) >= MAX_MODEL_LABELS:
                return
            self._models.add(model)

    def model_label(self, model: str | None) -> str:
        if not model:
            return "none"
        return model if model in self._models else "other"

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(*labels)
            self._children[key] = child
        return child

    def _tally(self, metric: Any, *labels: str) -> Tally:
        """The hot path's cell for one child (`app.tally`)."""
        key = (id(metric), *labels)
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = Tally(self._child(metric, *labels), self._write_through)
        return tally

    def fold(self) -> None:
        """Hand every tally to prometheus_client (before any read of the registry)."""
        for tally in self._tallies.values():
            tally.fold()

    # -- verbs ----------------------------------------------------------------------
    def record_request(self, domain: str, model: str | None, status: int, seconds: float) -> None:
        m = self.model_label(model)
        self._tally(self.requests, domain, m, str(status)).inc()
        self._tally(self.duration, domain, m).observe(seconds)
        if self._ring is not None:
            self._ring.answered(status)

    def record_refused(self, domain: str, model: str | None, status: int) -> None:
        """A request refused before the pipeline planned it (bad key, body, method, route):
        its answer is counted; its duration says nothing about any domain, so it is not
        observed."""
        self._child(self.requests, domain, self.model_label(model), str(status)).inc()
        if self._ring is not None:
            self._ring.answered(status)

    def record_answer(
        self, domain: str, model: str | None, usage: UsageLike, status: int, seconds: float
    ) -> None:
        """The end of an admitted request: its status, duration and tokens, in one call
        whose label children are cached together (this runs once per request). Tokens are
        only ever counted once the serving model is known, so one `model` labels all."""
        m = self.model_label(model)
        kids = self._answers.get((domain, usage.key, m, status))
        if kids is None:
            kids = self._answers[(domain, usage.key, m, status)] = (
                self._tally(self.requests, domain, m, str(status)),
                self._tally(self.duration, domain, m),
                self._tally(self.tokens, usage.key, m, TokenKind.PROMPT),
                self._tally(self.tokens, usage.key, m, TokenKind.COMPLETION),
            )
        requests, duration, prompt, completion = kids
        requests.inc()
        duration.observe(seconds)
        if usage.prompt_tokens:
            prompt.inc(usage.prompt_tokens)
        if usage.completion_tokens:
            completion.inc(usage.completion_tokens)
        if self._ring is not None:
            self._ring.answered(status, usage.prompt_tokens, usage.completion_tokens)
        if usage.failed_prompt_tokens or usage.failed_completion_tokens:
            self.record_failed_usage(
                usage.key, usage.model, usage.failed_prompt_tokens, usage.failed_completion_tokens
            )

    def record_ttft(self, domain: str, model: str | None, seconds: float) -> None:
        self._tally(self.ttft, domain, self.model_label(model)).observe(seconds)
        if self._ring is not None:
            self._ring.ttft(seconds)

    def record_failed_usage(
        self, key: str, model: str | None, prompt: int, completion: int
    ) -> None:
        m = self.model_label(model)
        if prompt:
            self._child(self.failed_tokens, key, m, TokenKind.PROMPT).inc(prompt)
        if completion:
            self._child(self.failed_tokens, key, m, TokenKind.COMPLETION).inc(completion)

    def record_rate_limited(self, key: str, limit: str) -> None:
        self._child(self.rate_limited, key, limit).inc()

    def record_retry(self, domain: str, reason: str) -> None:
        self._child(self.retries, domain, reason).inc()

    def record_resend(self, domain: str, reason: str) -> None:
        self._child(self.resends, domain, reason).inc()

    def record_header_refused(self, domain: str, header: str) -> None:
        self._child(self.header_refused, domain, header).inc()

    def record_attempt(self, domain: str, outcome: str) -> None:
        self._tally(self.attempts, domain, outcome).inc()

    def record_stream_error(self, domain: str, reason: str) -> None:
        self._child(self.stream_errors, domain, reason).inc()

    def record_fallback(self, model: str, fallback: str) -> None:
        self._child(self.fallbacks, self.model_label(model), self.model_label(fallback)).inc()

    def record_group(self, domain: str, size: int) -> None:
        self._tally(self.batch, domain).observe(size)

    def record_queue_wait(self, domain: str, seconds: float) -> None:
        self._tally(self.queue_wait, domain).observe(seconds)
        if self._ring is not None:
            self._ring.queue_wait(seconds)

    def add_domain(self, domain: str) -> None:
        """Start a domain's event counters at 0, so `rate()` and `increase()` see their
        first event (a series that appears at 1 hides it)."""
        self._child(self.queue_full, domain)

    def record_queue_full(self, domain: str) -> None:
        self._child(self.queue_full, domain).inc()

    def set_queue_capacity(self, domain: str, capacity: int) -> None:
        self._child(self.queue_capacity, domain).set(capacity)

    def set_queue_depth(self, domain: str, depth: int) -> None:
        self._child(self.queue_depth, domain).set(depth)

    def set_inflight(self, domain: str, count: int) -> None:
        self._child(self.inflight, domain).set(count)

    def set_domain_state(self, domain: str, up: bool, breaker_open: bool) -> None:
        self._child(self.upstream_up, domain).set(1 if up and not breaker_open else 0)
        self._child(self.breaker_open, domain).set(1 if breaker_open else 0)

    def record_throttled(self, domain: str, cooled_sec: float) -> None:
        """An upstream 429 (flow control) and the cool-down seconds it added."""
        self._child(self.throttled, domain).inc()
        self.record_cooldown(domain, cooled_sec)
        if self._ring is not None:
            self._ring.throttled()

    def record_error(self, failure: Failure) -> None:
        """An error answer, for the status page's list of recent errors (no Prometheus
        series: request ids are unbounded labels; the counts are in `requests`)."""
        if self._errors is not None:
            self._errors.add(failure)

    def record_cooldown(self, domain: str, seconds: float) -> None:
        if seconds > 0:
            self._child(self.cooldown, domain).inc(seconds)

    def set_pace(self, domain: str, requests_per_sec: float | None) -> None:
        self._child(self.pace, domain).set(
            float("inf") if requests_per_sec is None else requests_per_sec
        )

    def record_socket_upgrade(self, status: int) -> None:
        self._child(self.socket_upgrades, str(status)).inc()

    def socket_opened(self) -> None:
        self.sockets.inc()

    def socket_closed(self) -> None:
        self.sockets.dec()

    def record_socket_message(self, kind: str) -> None:
        self._child(self.socket_messages, kind).inc()

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

    def set_route_unresolved(self, model: str, unresolved: bool) -> None:
        self._child(self.route_unresolved, model).set(1 if unresolved else 0)

    # -- coding agents: prompt-cache affinity, per-key concurrency -------------------------
    def _add_agent_metrics(self, r: CollectorRegistry) -> None:
        self.affinity = Counter(
            "tokengate_affinity",
            "Requests of a conversation placed by prompt-cache affinity, by the domain "
            "chosen and how: home (its domain), spill (its domain over the load bound), "
            "failover (its domain unavailable).",
            ["domain", "outcome"],
            registry=r,
        )
        self.prompt_cache = Counter(
            "tokengate_prompt_cache_tokens",
            "Prompt tokens the upstream reported as read from (kind=read) or written to "
            "(kind=write) its prompt cache, by domain; part of tokens_total{kind=prompt}.",
            ["domain", "kind"],
            registry=r,
        )
        self.key_waits = Counter(
            "tokengate_key_concurrency_waits",
            "Requests that waited for their key's max_concurrent, by outcome (granted | timeout).",
            ["key", "outcome"],
            registry=r,
        )

    def record_affinity(self, domain: str, outcome: str) -> None:
        self._child(self.affinity, domain, outcome).inc()

    def record_prompt_cache(self, domain: str, read: int, written: int) -> None:
        if read:
            self._child(self.prompt_cache, domain, "read").inc(read)
        if written:
            self._child(self.prompt_cache, domain, "write").inc(written)

    def record_key_wait(self, key: str, outcome: str) -> None:
        self._child(self.key_waits, key, outcome).inc()

    # -- durable state (the database and the usage ledger) ---------------------------------
    def _add_durable_state(self, r: CollectorRegistry) -> None:
        self.database_up = Gauge(
            "tokengate_database_up",
            "1 when the database (SQLite file or PostgreSQL) answered the last call.",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.ledger_flush = Histogram(
            "tokengate_ledger_flush_seconds",
            "Time to write one ledger flush (one transaction) to the database.",
            buckets=_QUEUE,
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

    # -- cost and budgets ----------------------------------------------------------------
    def _add_spend(self, r: CollectorRegistry) -> None:
        self.cost = Counter(
            "tokengate_cost",
            "Spend in billing.currency units (from billing.prices; failed attempts' tokens "
            "included), by key and model. Exact figures are in the ledger (/admin/usage).",
            ["key", "model"],
            registry=r,
        )
        self.unpriced = Counter(
            "tokengate_unpriced_requests",
            "Requests that consumed tokens on a model without a price (cost unknown).",
            ["model"],
            registry=r,
        )
        self.budget_used = Gauge(
            "tokengate_budget_used_ratio",
            "Spend of a budget's current period over its limit (1 = spent), by scope "
            "(key|team), name, period (day|week|month|total) and metric (cost|tokens).",
            ["scope", "name", "period", "metric"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.budget_exceeded = Counter(
            "tokengate_budget_exceeded",
            "Requests refused because a budget had no room for them (429 budget_exceeded).",
            ["scope", "name", "budget"],
            registry=r,
        )
        self.deferred = Counter(
            "tokengate_deferred",
            "Deferred work (Batch API jobs) by outcome: held for an off-peak window, "
            "released in it, early_released so as not to miss its completion_window.",
            ["outcome"],
            registry=r,
        )

    def record_spend(self, key: str, model: str | None, nanos: int | None) -> None:
        m = self.model_label(model)
        if nanos is None:
            self._tally(self.unpriced, m).inc()
        elif nanos:
            self._tally(self.cost, key, m).inc(nanos / 1e9)

    def set_budget_used(
        self, scope: str, name: str, period: str, metric: str, ratio: float
    ) -> None:
        self._child(self.budget_used, scope, name, period, metric).set(ratio)

    def record_budget_exceeded(self, scope: str, name: str, budget: str) -> None:
        self._child(self.budget_exceeded, scope, name, budget).inc()

    def record_deferred(self, outcome: str) -> None:
        """A batch held for an off-peak window (`held`), or let go: `released` in the
        window, `early_released` before it (its completion_window would be missed)."""
        self._child(self.deferred, outcome).inc()

    # -- exposition ---------------------------------------------------------------------
    def render(self) -> bytes:
        self.fold()
        if multiprocess_enabled():
            registry = CollectorRegistry()
            _mp.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)


def new_registry() -> CollectorRegistry:
    return CollectorRegistry()
