"""The OpenTelemetry SDK behind `app.tracing`: the one module that imports it.

One `TracerProvider` per gateway (never the global one), a parent-based ratio sampler,
a `BatchSpanProcessor` exporting OTLP/HTTP protobuf from its own thread (so exporting
never blocks the event loop, and a collector that is down costs dropped spans, not
requests), W3C trace context in and out. The standard `OTEL_*` variables apply where
the `tracing` section leaves a setting unset (endpoint, headers, service name, the batch
processor's `OTEL_BSP_*`). Spans are started with an explicit parent, never through the
ambient context: an asyncio request's span must not leak into another task.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from importlib.metadata import PackageNotFoundError, version
from urllib.parse import unquote, urlsplit

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.config.schema import TracingConfig
from app.errors import GatewayError
from app.tracing.spans import TraceLike, operation

_PROPAGATOR = TraceContextTextMapPropagator()
_PROVIDERS = {False: "openai", True: "anthropic"}  # gen_ai.provider.name by dialect


def _version() -> str:
    try:
        return version("tokengate")
    except PackageNotFoundError:
        return "0"


def export_headers(raw: str) -> dict[str, str]:
    """`name=value,name2=value2` (values URL-encoded), as OTEL_EXPORTER_OTLP_HEADERS."""
    out = {}
    for pair in raw.split(","):
        name, sep, value = pair.partition("=")
        if sep and name.strip():
            out[name.strip().lower()] = unquote(value.strip())
    return out


class OtelTracer:
    def __init__(self, cfg: TracingConfig) -> None:
        attributes: dict[str, str] = {"service.version": _version()}
        if cfg.service_name:
            attributes["service.name"] = cfg.service_name
        elif not os.environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = "tokengate"
        self.provider = TracerProvider(
            resource=Resource.create(attributes),
            sampler=ParentBased(TraceIdRatioBased(cfg.sample_ratio)),
        )
        headers = export_headers(cfg.headers.get_secret_value()) if cfg.headers else None
        exporter = OTLPSpanExporter(endpoint=cfg.endpoint, headers=headers)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("tokengate", _version())
        self.propagate = cfg.propagate

    def request(
        self,
        operation_of: str,
        path: str,
        model: str | None,
        request_id: str,
        max_tokens: int | None,
        stream: bool,
        carrier: Mapping[str, str] | None,
    ) -> OtelRequest:
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        op = operation(operation_of)
        anthropic = path == "/v1/messages"
        attributes: dict[str, str | int | bool] = {
            "gen_ai.operation.name": op,
            "gen_ai.provider.name": _PROVIDERS[anthropic],
            "gen_ai.system": _PROVIDERS[anthropic],  # the attribute's older name
            "http.request.method": "POST",
            "url.path": path,
            "tokengate.request_id": request_id,
            "tokengate.stream": stream,
        }
        if model:
            attributes["gen_ai.request.model"] = model
        if max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = max_tokens
        span = self.tracer.start_span(
            f"{op} {model}" if model else op,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
        )
        return OtelRequest(self, span, op, anthropic)

    def shutdown(self) -> None:
        self.provider.shutdown()  # flushes what the batch processor holds


class OtelRequest:
    """A request's span. Not sampled, it makes no children (they would not be sampled
    either): its own context, sampled flag off, is what goes upstream then."""

    __slots__ = ("_anthropic", "_context", "_op", "_owner", "recording", "span")

    def __init__(self, owner: OtelTracer, span: Span, op: str, anthropic: bool) -> None:
        self._owner = owner
        self.span = span
        self._op = op
        self._anthropic = anthropic
        self._context: Context = set_span_in_context(span)
        self.recording = span.is_recording()

    def queue(self, domain: str) -> AbstractContextManager[None]:
        return self._queue(domain) if self.recording else nullcontext()

    @contextmanager
    def _queue(self, domain: str) -> Iterator[None]:
        span = self._owner.tracer.start_span(
            "queue wait",
            context=self._context,
            kind=SpanKind.INTERNAL,
            attributes={"tokengate.domain": domain},
        )
        try:
            yield
        except GatewayError as exc:
            span.set_attribute("tokengate.outcome", exc.code or exc.type)
            span.set_status(Status(StatusCode.ERROR, exc.code or exc.type))
            raise
        except BaseException:
            span.set_attribute("tokengate.outcome", "cancelled")
            raise
        else:
            span.set_attribute("tokengate.outcome", "granted")
        finally:
            span.end()

    def attempt(self, n: int, domain: str, model: str, base: str) -> OtelAttempt:
        if not self.recording:
            return OtelAttempt(self.span, self._owner.propagate, owned=False)
        parts = urlsplit(base)
        attributes: dict[str, str | int] = {
            "gen_ai.operation.name": self._op,
            "gen_ai.provider.name": _PROVIDERS[self._anthropic],
            "gen_ai.request.model": model,
            "tokengate.domain": domain,
            "tokengate.attempt": n,
        }
        if parts.hostname:  # the upstream's address: no userinfo, path or query
            attributes["server.address"] = parts.hostname
            attributes["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
        span = self._owner.tracer.start_span(
            f"upstream {self._op} {model}",
            context=self._context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        return OtelAttempt(span, self._owner.propagate)

    def end(self, trace: TraceLike, status: int) -> None:
        span = self.span
        attributes: dict[str, str | int | float | bool] = {
            "http.response.status_code": status,
            "tokengate.key": trace.key,
            "tokengate.domain": trace.domain or "none",
            "tokengate.queue_ms": round(trace.queue_ms, 3),
            "tokengate.upstream_ms": round(trace.upstream_ms, 3),
            "tokengate.fallback": trace.fallback,
            "gen_ai.usage.input_tokens": trace.prompt_tokens,
            "gen_ai.usage.output_tokens": trace.completion_tokens,
            "tokengate.usage_estimated": trace.estimated,
        }
        if trace.model:
            attributes["gen_ai.response.model"] = trace.model
        if trace.error:
            attributes["error.type"] = trace.error
        span.set_attributes(attributes)
        if status >= 500:  # a server span is in error for 5xx only (HTTP conventions)
            span.set_status(Status(StatusCode.ERROR, trace.error or str(status)))
        span.end(end_time=time.time_ns())


class OtelAttempt:
    __slots__ = ("_owned", "_propagate", "span")

    def __init__(self, span: Span, propagate: bool, *, owned: bool = True) -> None:
        self.span = span  # not `owned`: the unsampled request's own span, ended by it
        self._propagate = propagate
        self._owned = owned

    def outgoing(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        if not self._propagate:
            return headers
        carrier = dict(headers)
        _PROPAGATOR.inject(carrier, context=set_span_in_context(self.span))
        return carrier

    def end(self, outcome: str, status: int | None) -> None:
        if not self._owned:
            return
        span = self.span
        span.set_attribute("tokengate.outcome", outcome)
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if outcome != "ok":
            span.set_attribute("error.type", outcome)
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()
