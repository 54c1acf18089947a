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

from collections.abc import Iterable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as _mp

from app import build
from app.kinds import TokenKind
from app.metrics.agents import AgentFamilies
from app.metrics.base import LATENCY, QUEUE, UsageLike, multiprocess_enabled
from app.status.recent import RecentFailure
from app.tally import Tally

CONTENT_TYPE = CONTENT_TYPE_LATEST
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics(AgentFamilies):
    """Every family: the requests' own here, the others by area (`agents`, `durable`,
    `costs`), all on one registry. The areas are one chain of single bases (costs <-
    durable <- agents <- this), not mixins: the compiled build turns a class with one
    base into C, and the verbs run on every request (deploy/BENCHMARKS.md, issue #32's
    sixth pass)."""

    def __init__(self, registry: CollectorRegistry, models: Iterable[str] = ()) -> None:
        super().__init__(registry, models)
        self._answers: dict[tuple[str, str, str, int], tuple[Tally, ...]] = {}
        r = registry
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
            buckets=LATENCY,
            registry=r,
        )
        self.ttft = Histogram(
            "tokengate_time_to_first_token_seconds",
            "Time from request arrival to the first streamed content chunk.",
            ["domain", "model"],
            buckets=LATENCY,
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
            buckets=QUEUE,
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
        self.route_unresolved = Gauge(
            "tokengate_route_unresolved",
            "1 when a routed or aliased model is listed by no domain's /v1/models.",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.build_info = Gauge(
            "tokengate_build_info",
            "1, labelled with the running version and build: compiled (the request's path "
            "as mypyc C extensions, as the image ships it) or interpreted.",
            ["version", "build"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.build_info.labels(build.installed_version(), build.build_name()).set(1)
        self._add_durable_state(r)
        self._add_spend(r)

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

    def record_error(self, failure: RecentFailure) -> None:
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

    def set_route_unresolved(self, model: str, unresolved: bool) -> None:
        self._child(self.route_unresolved, model).set(1 if unresolved else 0)

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
