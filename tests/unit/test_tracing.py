"""Tracing off costs nothing (OpenTelemetry is not even imported); on without the package
is a configuration error that says what to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.config.problems import ConfigError
from app.config.schema import TracingConfig
from app.tracing import build, operation
from tests.support.procs import ROOT

LOAD_A_GATEWAY = """
import sys
from app.config.schema import Settings
from app.main import create_app
from app.runtime import compile_runtime
settings = Settings.model_validate({"health_check": {"enabled": False}})
create_app(compile_runtime(settings, {"TAOTOKEN_API_KEY": "sk-x"}, no_auth=True))
ours = ("app.tracing.otel", "opentelemetry.sdk.trace", "opentelemetry.exporter")
loaded = sorted(m for m in sys.modules if m.startswith(ours))
print(loaded)
"""


def test_with_tracing_off_opentelemetry_is_never_imported() -> None:
    # Its tracing SDK and exporter, that is: when the packages are installed, FastAPI
    # imports the OpenTelemetry API and redis-py the metrics SDK for their own opt-in
    # telemetry; neither is tokengate's doing, and neither records anything unless asked.
    done = subprocess.run(
        [sys.executable, "-c", LOAD_A_GATEWAY], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_off_builds_no_tracer() -> None:
    assert build(TracingConfig()) is None


def test_on_without_the_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "app.tracing.otel", None)  # as if opentelemetry were missing
    with pytest.raises(ConfigError) as refused:
        build(TracingConfig(enabled=True), "settings.json")
    text = refused.value.render()
    assert "tracing.enabled" in text and "pip install 'tokengate[otel]'" in text


def test_export_headers_are_parsed_as_the_otel_variable_is() -> None:
    from app.tracing.otel import export_headers

    raw = "Authorization=Bearer%20abc, x-team = ops ,broken"
    assert export_headers(raw) == {"authorization": "Bearer abc", "x-team": "ops"}


@pytest.mark.parametrize(
    ("endpoint", "op"),
    [
        ("chat", "chat"),
        ("messages", "chat"),
        ("completions", "text_completion"),
        ("embeddings", "embeddings"),
    ],
)
def test_each_endpoint_has_its_genai_operation_name(endpoint: str, op: str) -> None:
    assert operation(endpoint) == op


def test_an_unsampled_request_makes_no_children_and_still_propagates() -> None:
    from app.tracing.otel import OtelTracer

    tracer = OtelTracer(
        TracingConfig(enabled=True, sample_ratio=0.0, endpoint="http://127.0.0.1:9/v1/traces")
    )
    try:
        parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"  # not sampled
        span = tracer.request("chat", "/v1/chat/completions", "m", "req_1", 8, False, None)
        child = tracer.request(
            "chat", "/v1/chat/completions", "m", "req_2", 8, False, {"traceparent": parent}
        )
        for request in (span, child):
            assert not request.recording
            with request.queue("d"):  # a no-op context
                pass
            sent = request.attempt(1, "d", "m", "http://up:1").outgoing({"x": "1"})
            flags = int(sent["traceparent"].rsplit("-", 1)[1], 16)
            assert sent["x"] == "1" and flags & 1 == 0  # the sampled flag is off
        assert (
            "4bf92f3577b34da6a3ce929d0e0e4736"
            in child.attempt(1, "d", "m", "http://u").outgoing({})["traceparent"]
        )  # the client's trace carries on, unsampled
    finally:
        tracer.shutdown()
