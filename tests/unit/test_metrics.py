"""The metric verbs: what a scrape shows is what prometheus_client itself would show."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from app.billing.ledger import UsageEntry
from app.metrics import Metrics

# On and around the bounds of the latency buckets, past the last one, and zero.
SECONDS = [0.0, 0.005, 0.0051, 0.01, 0.3, 1.0, 2.5, 60.0, 120.0, 121.0, 1e9]
_CREATED = re.compile(rb"^.*_created\{?.*$\n?", re.M)


def exposition(registry: CollectorRegistry, *names: str) -> list[bytes]:
    """The sample lines of `names`, sorted (timestamps of creation left out)."""
    text = _CREATED.sub(b"", generate_latest(registry))
    return sorted(
        line
        for line in text.splitlines()
        if line and not line.startswith(b"#") and line.split(b"{")[0].decode().startswith(names)
    )


def test_deferred_records_read_as_prometheus_client_would_count_them() -> None:
    metrics = Metrics(CollectorRegistry(), models=["m"])
    plain = CollectorRegistry()
    requests = Counter("tokengate_requests", "", ["domain", "model", "status"], registry=plain)
    duration = Histogram(
        "tokengate_request_duration_seconds",
        "",
        ["domain", "model"],
        buckets=metrics.duration._upper_bounds[:-1],
        registry=plain,
    )
    tokens = Counter("tokengate_tokens", "", ["key", "model", "kind"], registry=plain)
    for i, seconds in enumerate(SECONDS):
        entry = UsageEntry("k", "m", prompt_tokens=i, completion_tokens=2 * i)
        metrics.record_answer("d", "m", entry, 200 if i % 3 else 502, seconds)
        requests.labels("d", "m", "200" if i % 3 else "502").inc()
        duration.labels("d", "m").observe(seconds)
        if i:
            tokens.labels("k", "m", "prompt").inc(i)
            tokens.labels("k", "m", "completion").inc(2 * i)
    names = ("tokengate_requests", "tokengate_request_duration", "tokengate_tokens")
    assert exposition(metrics.registry, *names) == exposition(plain, *names)
    assert exposition(metrics.registry, *names)  # not two empty lists


def test_every_read_of_the_registry_sees_every_record_so_far() -> None:
    metrics = Metrics(CollectorRegistry())
    for n in (1, 2, 3):
        metrics.record_attempt("d", "ok")
        metrics.record_group("d", 4)
        metrics.record_queue_wait("d", 0.002)
        got = metrics.registry.get_sample_value(
            "tokengate_upstream_attempts_total", {"domain": "d", "outcome": "ok"}
        )
        assert got == n
        assert b'tokengate_batch_size_count{domain="d"} %d.0' % n in metrics.render()
        assert metrics.registry.get_sample_value(
            "tokengate_queue_wait_seconds_sum", {"domain": "d"}
        ) == pytest.approx(0.002 * n)


def test_with_workers_each_record_reaches_the_shared_value_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """Other workers' scrapes read this process's values from shared files, without
    asking it: nothing may wait for a scrape here."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    metrics = Metrics(CollectorRegistry())
    metrics.record_attempt("d", "ok")
    metrics.record_queue_wait("d", 0.3)
    child = metrics.attempts.labels("d", "ok")
    wait = metrics.queue_wait.labels("d")
    assert child._value.get() == 1  # read without collecting the registry
    assert wait._sum.get() == pytest.approx(0.3)
    assert [b.get() for b in wait._buckets][8:10] == [0, 1]  # le=0.25: 0, le=0.5: 1
