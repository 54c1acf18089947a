"""What happened to one request: its task-ID map (docs/design.md) and its log line.

Every upstream attempt is recorded (number, domain, model, outcome, milliseconds), so
a retry or fallback can always be traced back to the request and input it served.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.tracing import RequestSpan


@dataclass(slots=True, init=False)
class Attempt:
    """(`__init__` written out, as `Trace`'s.)"""

    n: int
    domain: str
    model: str
    outcome: str
    ms: float

    def __init__(self, n: int, domain: str, model: str, outcome: str, ms: float) -> None:
        self.n = n
        self.domain = domain
        self.model = model
        self.outcome = outcome
        self.ms = ms

    def as_dict(self) -> dict[str, object]:
        return {
            "n": self.n,
            "domain": self.domain,
            "model": self.model,
            "outcome": self.outcome,
            "ms": round(self.ms, 2),
        }


@dataclass(slots=True, init=False)
class Trace:
    """(The `__init__` is written out, not generated: one is built per request, and the
    compiled build runs a written one as C, a generated one as Python: 7,700 instructions
    against a few hundred; deploy/BENCHMARKS.md, issue #32's sixth pass.)"""

    request_id: str
    key: str
    endpoint: str
    requested_model: str | None
    stream: bool
    started: float
    model: str | None  # what served (the upstream's answer's model when known)
    domain: str | None
    status: int
    error: str | None
    queue_ms: float
    upstream_ms: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # of prompt_tokens, read from the upstream's prompt cache
    cache_write_tokens: int  # of prompt_tokens, written to it
    estimated: bool
    service_tier: str | None  # the tier the upstream says served it (priced by it)
    # attempts written to the upstream that got no answer (`AttemptFailed.ambiguous`): it
    # may have read the prompt and billed it, so each is charged the prompt estimate
    unanswered: int
    fallback: bool
    attempts: list[Attempt]
    span: RequestSpan | None  # only while tracing is on (`app.tracing`)

    def __init__(
        self,
        request_id: str,
        key: str,
        endpoint: str,
        requested_model: str | None,
        stream: bool,
        started: float,
    ) -> None:
        self.request_id = request_id
        self.key = key
        self.endpoint = endpoint
        self.requested_model = requested_model
        self.stream = stream
        self.started = started
        self.model = None
        self.domain = None
        self.status = 0
        self.error = None
        self.queue_ms = 0.0
        self.upstream_ms = 0.0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.cache_write_tokens = 0
        self.estimated = False
        self.service_tier = None
        self.unanswered = 0
        self.fallback = False
        self.attempts = []
        self.span = None

    @property
    def dispatched(self) -> bool:
        return bool(self.attempts)

    def fields(self, duration_ms: float) -> dict[str, object]:
        return {
            "request_id": self.request_id,
            "key": self.key,
            "endpoint": self.endpoint,
            "model": self.model or self.requested_model,
            "requested_model": self.requested_model,
            "domain": self.domain or "none",
            "status": self.status,
            "error": self.error,
            "stream": self.stream,
            "queue_ms": round(self.queue_ms, 2),
            "upstream_ms": round(self.upstream_ms, 2),
            "duration_ms": round(duration_ms, 2),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "usage_estimated": self.estimated,
            "service_tier": self.service_tier,
            "fallback": self.fallback,
            "attempts": [a.as_dict() for a in self.attempts],
        }
