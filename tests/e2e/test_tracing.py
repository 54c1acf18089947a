"""Traces from a real `tokengate serve` to a real OTLP/HTTP receiver: one span per
request with the GenAI attributes, children for the queue wait and each upstream attempt,
the client's `traceparent` continued and the attempt's sent upstream, no secret anywhere."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.support.otlp import Receiver, Span, otlp_receiver
from tests.support.procs import UPSTREAM_KEY, Gateway, GatewaySpec, Sim

Make = Callable[..., Gateway]
SERVER, CLIENT, INTERNAL = 2, 3, 1  # the protobuf's SpanKind
ERROR = 2  # the protobuf's Status.code
EXPORT_SECRET = "otlp-token-7d1f2b9c0e"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
BODY = {
    "model": "claude-sonnet",
    "messages": [{"role": "user", "content": "ping"}],
    "max_tokens": 5,
}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as r:
        yield r


@pytest.fixture
def traced(sim: Sim, make_gateway: Make, receiver: Receiver) -> Gateway:
    spec = GatewaySpec(
        settings={
            "tracing": {
                "enabled": True,
                "endpoint": receiver.endpoint,
                "headers": "${OTLP_AUTH}",
                "service_name": "tokengate-e2e",
            }
        },
        env={
            "OTLP_AUTH": f"authorization=Bearer {EXPORT_SECRET}",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        },
    )
    return make_gateway(spec, sim.url)


def children(spans: list[Span], parent: Span) -> list[Span]:
    return sorted((s for s in spans if s.parent_id == parent.span_id), key=lambda s: s.start_ns)


def requests(spans: list[Span]) -> list[Span]:
    return [s for s in spans if s.kind == SERVER]


def test_a_request_is_one_span_with_its_queue_wait_and_attempts(
    traced: Gateway, sim: Sim, receiver: Receiver
) -> None:
    sim.faults(status=502, count=1, paths=["/v1/chat/completions"])  # one retry
    headers = {**traced.headers(), "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
    r = httpx.post(f"{traced.url}/v1/chat/completions", json=BODY, headers=headers, timeout=30)
    assert r.status_code == 200
    spans = receiver.spans(lambda got: len(got) >= 4)
    (request,) = requests(spans)
    # the client's trace continued: same trace, the client's span as parent
    assert (request.trace_id, request.parent_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert request.name == "chat claude-sonnet"
    usage = r.json()["usage"]
    assert (
        request.attributes
        | {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "claude-sonnet",
            "gen_ai.response.model": r.json()["model"],
            "gen_ai.request.max_tokens": 5,
            "gen_ai.usage.input_tokens": usage["prompt_tokens"],
            "gen_ai.usage.output_tokens": usage["completion_tokens"],
            "tokengate.key": "alice",
            "tokengate.domain": "domain-a",
            "http.response.status_code": 200,
        }
        == request.attributes
    )
    assert request.resource["service.name"] == "tokengate-e2e"
    queue, first, second = children(spans, request)
    assert (queue.name, queue.kind, queue.attributes["tokengate.outcome"]) == (
        "queue wait",
        INTERNAL,
        "granted",
    )
    assert [a.name for a in (first, second)] == ["upstream chat claude-sonnet"] * 2
    assert {a.kind for a in (first, second)} == {CLIENT}
    assert [
        (a.attributes["tokengate.attempt"], a.attributes["tokengate.outcome"])
        for a in (
            first,
            second,
        )
    ] == [(1, "status_502"), (2, "ok")]
    assert first.status_code == ERROR and first.attributes["http.response.status_code"] == 502
    assert second.attributes["server.address"] == "127.0.0.1"
    # each attempt's own context went upstream: the upstream's spans would join this trace
    sent = [rec["headers"]["traceparent"] for rec in sim.records("/v1/chat/completions")]
    assert sent == [
        f"00-{CLIENT_TRACE}-{first.span_id}-01",
        f"00-{CLIENT_TRACE}-{second.span_id}-01",
    ]
    assert all(s.trace_id == CLIENT_TRACE for s in spans)


def test_a_refused_request_is_traced_and_no_secret_reaches_a_span(
    traced: Gateway, receiver: Receiver
) -> None:
    wrong_model = {**BODY, "model": "no-such-model"}
    r = httpx.post(f"{traced.url}/v1/chat/completions", json=wrong_model, headers=traced.headers())
    assert r.status_code == 404
    ok = httpx.post(f"{traced.url}/v1/chat/completions", json=BODY, headers=traced.headers())
    assert ok.status_code == 200
    spans = receiver.spans(lambda got: len(requests(got)) >= 2)
    refused = next(s for s in requests(spans) if s.attributes["http.response.status_code"] == 404)
    assert refused.attributes["error.type"] == "model_not_found"
    assert refused.attributes["tokengate.domain"] == "none" and not children(spans, refused)
    assert refused.parent_id == ""  # no client context: a trace of its own
    every_value = json.dumps([[s.attributes, s.resource] for s in spans], default=str)
    for secret in (traced.key, UPSTREAM_KEY, EXPORT_SECRET, "ping"):
        assert secret not in every_value
    # the export itself carried the configured header, and the log never shows it
    assert all(h.get("authorization") == f"Bearer {EXPORT_SECRET}" for h in receiver.export_headers)
    assert EXPORT_SECRET not in traced.log_path.read_text()


def test_a_client_model_string_of_any_length_never_becomes_a_span_name(
    traced: Gateway, receiver: Receiver
) -> None:
    huge = "m" * 100_000  # issue #31: each such name was a new span name, any length
    for model in (huge, "x" * 40 + "-unique-1", "x" * 40 + "-unique-2"):
        r = httpx.post(
            f"{traced.url}/v1/chat/completions",
            json={**BODY, "model": model},
            headers=traced.headers(),
        )
        assert r.status_code == 404
    spans = receiver.spans(lambda got: len(requests(got)) >= 3)
    assert {s.name for s in requests(spans)} == {"chat other"}
    assert all(len(json.dumps(s.attributes)) < 4096 for s in spans)


def test_without_tracing_no_trace_header_goes_upstream(gateway: Gateway, sim: Sim) -> None:
    headers = {**gateway.headers(), "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
    r = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=headers, timeout=30)
    assert r.status_code == 200
    (record,) = sim.records("/v1/chat/completions")
    assert "traceparent" not in record["headers"]
