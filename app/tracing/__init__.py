"""Optional traces: the seam (`spans`), its OpenTelemetry implementation (`otel`), and
`build`, which imports the implementation only when `tracing.enabled` is on."""

from __future__ import annotations

from app.config.problems import ConfigError, Problem
from app.config.schema import TracingConfig
from app.tracing.spans import (
    OPERATIONS,
    AttemptSpan,
    RequestSpan,
    TraceLike,
    Tracer,
    operation,
)

__all__ = [
    "OPERATIONS",
    "AttemptSpan",
    "RequestSpan",
    "TraceLike",
    "Tracer",
    "build",
    "operation",
]


def build(cfg: TracingConfig, source: str = "settings") -> Tracer | None:
    """The configured tracer, or None when tracing is off (nothing imported then)."""
    if not cfg.enabled:
        return None
    try:
        from app.tracing.otel import OtelTracer
    except ImportError as exc:
        raise ConfigError(
            [
                Problem(
                    source,
                    "tracing.enabled",
                    f"OpenTelemetry is not installed ({exc.name})",
                    "pip install 'tokengate[otel]' (the container image has it), or set "
                    "tracing.enabled = false",
                )
            ]
        ) from None
    return OtelTracer(cfg)
