"""Optional traces (OpenTelemetry, OTLP over HTTP): the seam the pipeline calls.

    request span   "{operation} {model}" (SERVER)  one per request, arrival to last byte:
    │                gen_ai.* (operation, request/response model, usage), key alias,
    │                domain, status, error, queue and upstream time
    ├─ "queue wait" (INTERNAL)                       each wait for a dispatch slot
    └─ "upstream {operation} {model}" (CLIENT)       each upstream attempt: domain, model,
                                                     outcome, HTTP status; its context goes
                                                     upstream as `traceparent`

A client's W3C `traceparent` (and `tracestate`) is continued: the request span is its
child. Off (the default), `app.tracing.build` returns None and nothing here runs:
OpenTelemetry is not even imported (`app.tracing.otel` is the one module that imports
it), and the pipeline pays
one `is None` test at each of its four call points. Spans carry aliases, names and
numbers only: never a key, a prompt or an answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Protocol


class TraceLike(Protocol):
    """What the end of a request span reads of the pipeline's `Trace`."""

    key: str
    endpoint: str
    requested_model: str | None
    model: str | None
    domain: str | None
    error: str | None
    queue_ms: float
    upstream_ms: float
    prompt_tokens: int
    completion_tokens: int
    estimated: bool
    fallback: bool


class AttemptSpan(Protocol):
    def outgoing(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        """`headers` plus this attempt's `traceparent` (when propagation is on)."""
        ...

    def end(self, outcome: str, status: int | None) -> None: ...


class RequestSpan(Protocol):
    def queue(self, domain: str) -> AbstractContextManager[None]:
        """A span around one wait for a dispatch slot; a refusal ends it as an error."""
        ...

    def attempt(self, n: int, domain: str, model: str, base: str) -> AttemptSpan: ...

    def end(self, trace: TraceLike, status: int) -> None: ...


class Tracer(Protocol):
    def request(
        self,
        operation: str,
        path: str,
        model: str | None,
        request_id: str,
        max_tokens: int | None,
        stream: bool,
        carrier: Mapping[str, str] | None,
    ) -> RequestSpan:
        """The span of a new request; `carrier` holds the client's trace headers."""
        ...

    def shutdown(self) -> None:
        """Export what is buffered (blocking: the gateway runs it in a thread)."""
        ...


# What the GenAI semantic conventions call each endpoint (`gen_ai.operation.name`).
OPERATIONS = {"chat": "chat", "messages": "chat", "completions": "text_completion"}


def operation(endpoint: str) -> str:
    return OPERATIONS.get(endpoint, endpoint)
