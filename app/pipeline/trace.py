"""What happened to one request: its task-ID map (docs/design.md) and its log line.

Every upstream attempt is recorded (number, domain, model, outcome, milliseconds), so
a retry or fallback can always be traced back to the request and input it served.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.tracing import RequestSpan


@dataclass(slots=True)
class Attempt:
    n: int
    domain: str
    model: str
    outcome: str
    ms: float

    def as_dict(self) -> dict[str, object]:
        return {
            "n": self.n,
            "domain": self.domain,
            "model": self.model,
            "outcome": self.outcome,
            "ms": round(self.ms, 2),
        }


@dataclass(slots=True)
class Trace:
    request_id: str
    key: str
    endpoint: str
    requested_model: str | None
    stream: bool
    started: float
    model: str | None = None  # what served (the upstream's answer's model when known)
    domain: str | None = None
    status: int = 0
    error: str | None = None
    queue_ms: float = 0.0
    upstream_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, read from the upstream's prompt cache
    cache_write_tokens: int = 0  # of prompt_tokens, written to it
    estimated: bool = False
    service_tier: str | None = None  # the tier the upstream says served it (priced by it)
    # attempts written to the upstream that got no answer (`AttemptFailed.ambiguous`): it
    # may have read the prompt and billed it, so each is charged the prompt estimate
    unanswered: int = 0
    fallback: bool = False
    attempts: list[Attempt] = field(default_factory=list)
    span: RequestSpan | None = None  # only while tracing is on (`app.tracing`)

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
